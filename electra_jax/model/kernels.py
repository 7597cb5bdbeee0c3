"""Hand-written kernels under the model: the same numbers as plain JAX, faster or smaller.

Each replaces a plain formulation that XLA compiles poorly on some backend. Each is measured,
and each is tested against plain autodiff in tests/model/test_kernels.py. The measurements are in
benchmarks/notes/train_step.md (change log) and benchmarks/notes/memory.md (activation memory;
ELECTRA-Small, 32 x 128, float32, XLA:CPU on 2 cores):

  kernel          replaces                   measured (XLA:CPU, notes/train_step.md "Change
                                             log" and notes/memory.md "Activation memory")
  add_bias,       a sum over rows for bias   the generator's [608, 30522] logit gradient:
    column_sums     gradients                  109 ms as a reduction, 3.5 ms as ones @ g
  scale_shift     LayerNorm's scale and      the remaining [4096, 256] column reductions; with
                    bias gradients             gelu and the q/k/v split: 2.60 -> 1.76 s/step
  gelu            nn.gelu's erfc form        4.5x faster in isolation, equal within 1e-6
  dropout_bits    threefry words for masks   11 -> 0.8 ms per 1M words; with the 2-D matmuls:
                                               4.72 -> 3.62 s/step under load
  gelu_dense      autodiff of gelu(h)W + b   temporaries 1458 -> 1086 MB; step 0.977x (A/B)
  attention_core  autodiff of attention      temporaries 1086 -> 992 MB; step within noise;
                    with dropout               its backward's row sums from dO . O: the TPU
                                               compiler's plan for a base layer (RESULTS.md,
                                               "What holds the MFU ceiling") 11.96 -> 10.82 GB
  layer_norm      autodiff of LayerNorm      16-bit compute dtypes only: a scanned bfloat16
                    (bfloat16)                 base layer keeps 144 MiB less for its backward
                                               (notes/compile.md, "bfloat16 that pays")

Backends: every kernel is used on every backend today, and all were measured on XLA:CPU only
(attention_core's row sums and layer_norm also in the TPU compiler's plan, not on a TPU). On GPU
and TPU they compute the same numbers but are not timed yet; the reductions and the erf they
avoid are cheap there, so a GPU measurement (benchmarks/gpu.sh) may turn one off for that
backend, with its figure here. `fused_attention_args` is the other attention path: jax's
fused dot_product_attention ('xla' or cuDNN), chosen with model.attention; flash_attention.py
holds a third, attention_core's function and dropout mask as Pallas TPU kernels ('pallas').
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

# The name of attention_core's probabilities [B, heads, L, L], a residual of its backward pass.
ATTENTION_PROBS = "attention_probs"


def column_sums(x):
    """[..., N] -> [N]: the sum over every leading axis, as a matrix-vector product.

    XLA:CPU sums a [tokens, N] array over its rows (a column reduction) ~30x slower than the
    equivalent [tokens] x [tokens, N] product; for the generator's [B*N, V] logit gradient that
    was ~3% of a step.
    """
    rows = x.reshape(-1, x.shape[-1])
    # HIGHEST: a sum must not round its terms to bfloat16 / TF32 (TPU and GPU default matmuls).
    ones = jnp.ones((rows.shape[0],), x.dtype)
    return jnp.matmul(ones, rows, precision=jax.lax.Precision.HIGHEST)


@jax.custom_vjp
def add_bias(x, bias):
    """x [..., N] + bias [N], whose bias gradient is `column_sums`, not a reduction."""
    return x + bias


def _add_bias_fwd(x, bias):
    return x + bias, None


def _add_bias_bwd(_, g):
    return g, column_sums(g)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


@jax.custom_vjp
def scale_shift(y, scale, bias):
    """y [..., N] x scale [N] + bias [N], with matmul gradients for scale and bias."""
    return y * scale + bias


def _scale_shift_fwd(y, scale, bias):
    return y * scale + bias, (y, scale)


def _scale_shift_bwd(residuals, g):
    y, scale = residuals
    return g * scale, column_sums(g * y), column_sums(g)


scale_shift.defvjp(_scale_shift_fwd, _scale_shift_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x, scale, bias, epsilon: float):
    """LayerNorm with float32 statistics: x [..., N] in any float dtype, scale and bias [N]
    float32 -> float32 [..., N] (the caller casts it to its compute dtype).

    Differentiated by hand for 16-bit compute dtypes: the backward pass keeps x in its own dtype
    and the float32 mean and reciprocal deviation [..., 1], and recomputes the normalized x from
    them. Autodiff of the same formula keeps x - mean and the normalized x in float32, two
    [..., N] float32 arrays where this keeps one bfloat16 one: under the layers' scan, whose
    residuals XLA cannot recompute, 8 bytes a value against 2. Scale and bias gradients are
    `column_sums`, as `scale_shift`'s.
    """
    return _layer_norm_fwd(x, scale, bias, epsilon)[0]


def _layer_norm_fwd(x, scale, bias, epsilon):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    centered = x32 - mean
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + epsilon)
    return centered * rstd * scale + bias, (x, mean, rstd, scale)


def _layer_norm_bwd(epsilon, residuals, g):
    x, mean, rstd, scale = residuals
    g = g.astype(jnp.float32)
    y = (x.astype(jnp.float32) - mean) * rstd
    gy = g * scale
    # d/dx of (x - mean) * rstd, applied to gy: rstd (gy - mean(gy) - y mean(gy y)).
    dx = rstd * (
        gy - jnp.mean(gy, axis=-1, keepdims=True) - y * jnp.mean(gy * y, axis=-1, keepdims=True)
    )
    return dx.astype(x.dtype), column_sums(g * y), column_sums(g)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


_SQRT_HALF = np.float32(1.0 / np.sqrt(2.0))
_INV_SQRT_2PI = np.float32(1.0 / np.sqrt(2.0 * np.pi))


def gelu(x):
    """The exact (erf) GELU, as BERT, ELECTRA and transformers' "gelu": x/2 (1 + erf(x/sqrt 2)).

    Written with erf rather than nn.gelu's erfc form, which XLA expands with an exp: 4.5x faster
    on XLA:CPU, equal within 1e-6.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF).astype(x.dtype))


@jax.custom_vjp
def gelu_dense(h, kernel, bias):
    """[T, F] pre-activations -> gelu(h) @ kernel [F, N] + bias [N]: the FFN's second half.

    Differentiated by hand so that the backward pass keeps only `h`: it recomputes gelu(h) for
    the kernel gradient instead of holding gelu(h) and erf(h) from the forward pass: two fewer
    [T, F] buffers per layer, about a quarter of configs/small.py's XLA:CPU temporaries at
    32 x 128 (1458 -> 1086 MB; there every buffer byte is a fresh page fault each step).
    """
    return add_bias(gelu(h) @ kernel, bias)


def _gelu_dense_fwd(h, kernel, bias):
    return gelu_dense(h, kernel, bias), (h, kernel)


def _gelu_dense_bwd(residuals, g):
    h, kernel = residuals
    dy = g @ kernel.T
    # The recomputation must wait for the cotangent: XLA:CPU drops optimization barriers before
    # CSE, and would merge it with the forward's erf and keep that alive instead. Adding dy * 0
    # ties it to dy elementwise (local under any sharding of h) and changes nothing a finite dy
    # can see; a non-finite dy makes the gradients non-finite regardless.
    h = h + dy * jnp.zeros((), h.dtype)
    erf = jax.lax.erf(h * _SQRT_HALF).astype(h.dtype)
    density = (h * _INV_SQRT_2PI * jnp.exp(-0.5 * h * h)).astype(h.dtype)
    slope = 0.5 * (1.0 + erf) + density
    y = 0.5 * h * (1.0 + erf)
    return dy * slope, y.T @ g, column_sums(g)


gelu_dense.defvjp(_gelu_dense_fwd, _gelu_dense_bwd)


def _mix32(x):
    """A 32-bit integer finalizer (xor-shift-multiply, "lowbias32"): a bijection whose every
    output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def index_hash(rows, cols, seed0, seed1):
    """uint32 words from element indices: a hash of (row, column) keyed by two seed words.

    rows, cols: uint32 arrays of one shape (or broadcastable), the element's row-major index over
    every axis but the last, and its index along the last; seed0, seed1: uint32 scalars. The one
    definition of dropout's bits: `dropout_bits` calls it on a whole array, and the Pallas
    attention kernel (flash_attention.py) on each block from its iotas plus the block's offsets.
    """
    return _mix32(_mix32(rows ^ seed0) ^ (cols * jnp.uint32(0x9E3779B9) + seed1))


def dropout_bits(key, shape: tuple[int, ...]):
    """Uniform uint32 words for dropout masks: a hash of each element's index, keyed by `key`.

    threefry costs ~100 integer ops per word; dropout masks (attention probabilities alone are
    B x heads x L x L per layer) made it ~10% of a CPU step. Masks need independence between
    elements and between keys, not cryptographic strength, so two threefry words from `key` seed
    a hash of (row, column) instead (`index_hash`): ~10 ops per word. The index is global, so the
    bits, like threefry's, do not depend on how the array is sharded.
    """
    seed = jax.random.bits(key, (2,), jnp.uint32)
    rows = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    for axis in range(1, len(shape) - 1):  # row-major index over every axis but the last
        rows = rows * jnp.uint32(shape[axis]) + jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    cols = jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
    return index_hash(rows, cols, seed[0], seed[1])


def dropout_threshold(rate: float) -> int:
    """A unit is kept iff its `dropout_bits` word is below this: round((1 - rate) 2^32), at most
    2^32 - 1 (a uint32); the kept units are scaled by 2^32 / threshold."""
    return min(round((1.0 - rate) * 2**32), 2**32 - 1)


def keep_and_scale(key, shape: tuple[int, ...], rate: float, dtype):
    """Inverted dropout's mask and scale: (bool [shape], 1 / keep probability in `dtype`)."""
    threshold = dropout_threshold(rate)
    keep = dropout_bits(key, shape) < jnp.uint32(threshold)
    return keep, jnp.asarray(2**32 / threshold, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention_core(q, k, v, bias, key, rate: float):
    """softmax(q k^T / sqrt(d) + bias), dropped out at `rate` with `key`, times v.

    q, k, v: [B, heads, L, d]; bias: [B, 1, 1, L] float32; key: a PRNG key (unused at rate 0).
    Returns [B, heads, L, d] in q's dtype; scores, the softmax's statistics and the gradient's
    arithmetic are float32, the probabilities it keeps are rounded to q's dtype.

    Differentiated by hand: the backward pass keeps q, k, v, the probabilities and the output,
    and recomputes the dropout mask from its hash (`dropout_bits`) rather than holding the
    dropped probabilities; the 1/sqrt(d) scale is applied to the float32 scores, not to a copy
    of q. In configs/small.py's step at 32 x 128 this cut XLA:CPU's temporaries from 1086 to
    992 MB. The softmax gradient's row sums, sum_k dP[q, k] P[q, k], are taken as
    sum_d dO[q, d] O[q, d] (the same sum, as FlashAttention takes it) from [B, heads, L, d]
    arrays instead of from a pass over the [B, heads, L, L] ones.
    """
    return _attention_fwd(q, k, v, bias, key, rate)[0]


def _dropped(probs, key, rate: float):
    """probs [B, heads, L, L] after inverted dropout, and the mask that did it (None at 0)."""
    if rate == 0.0:
        return probs, None
    keep, scale = keep_and_scale(key, probs.shape, rate, probs.dtype)
    return jnp.where(keep, probs * scale, 0.0), (keep, scale)


def _attention_fwd(q, k, v, bias, key, rate):
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    # The softmax's max and sum in float32; the probabilities are kept in q's dtype, the one
    # the context's matmul reads them in: in bfloat16 that halves the [B, heads, L, L] array
    # written here and read three times (the context; d_scores and dv in the backward). The
    # dropout's scale is applied in float32 to the rounded probabilities, here as there. Named
    # for the layer's remat policies (networks.py), which keep or recompute it by name.
    probs = jax.nn.softmax(scores * scale + bias, axis=-1).astype(q.dtype)
    probs = checkpoint_name(probs, ATTENTION_PROBS)
    dropped, _ = _dropped(probs.astype(jnp.float32), key, rate)
    context = jnp.einsum("bhqk,bhkd->bhqd", dropped.astype(q.dtype), v)
    return context, (q, k, v, probs, context, key)


def _attention_bwd(rate, residuals, g):
    q, k, v, probs, context, key = residuals
    probs = probs.astype(jnp.float32)
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    d_dropped = jnp.einsum("bhqd,bhkd->bhqk", g, v, preferred_element_type=jnp.float32)
    # The recomputed dropout waits for the cotangent (see _gelu_dense_bwd): g's first column
    # [B, heads, L, 1] times 0, broadcast along the keys, adds nothing a finite gradient can
    # see and is local under any sharding of the batch. Not d_dropped * 0: tied to all of it,
    # dv's fusion read that [B, heads, L, L] array too, on TPU a pass over it for nothing.
    # Without dropout there is nothing to recompute.
    tied = probs + g[..., :1].astype(jnp.float32) * np.float32(0.0) if rate else probs
    dropped, mask = _dropped(tied, key, rate)
    d_probs = d_dropped if mask is None else jnp.where(mask[0], d_dropped * mask[1], 0.0)
    dv = jnp.einsum("bhqk,bhqd->bhkd", dropped.astype(g.dtype), g)
    # sum_k dP[q, k] P[q, k] = sum_k dO[q] . v[k] dropped[q, k] = dO[q] . O[q]
    rows = jnp.sum(g.astype(jnp.float32) * context.astype(jnp.float32), axis=-1)  # [B, heads, L]
    d_scores = probs * (d_probs - rows[..., None]) * scale
    d_scores = d_scores.astype(q.dtype)
    dq = jnp.einsum("bhqk,bhkd->bhqd", d_scores, k)
    dk = jnp.einsum("bhqk,bhqd->bhkd", d_scores, q)
    return dq, dk, dv, None, None


attention_core.defvjp(_attention_fwd, _attention_bwd)


def fused_attention_args(q, k, v, attention_bias, implementation: str) -> dict[str, Any]:
    """The keyword arguments SelfAttention._fused gives jax.nn.dot_product_attention.

    A pure function so that tests can hand exactly these arrays to jax's cuDNN argument checks
    on a CPU (tests/test_attention_fused.py).

    Args:
      q, k, v: [B, heads, L, head_dim], SelfAttention's layout, in the compute dtype.
      attention_bias: [B, 1, 1, L] float32 from Encoder: 0 at real keys, -1e9 at padding.
      implementation: 'xla' or 'cudnn'.

    Returns:
      query, key, value: [B, L, heads, head_dim], the layout jax.nn.dot_product_attention takes.
      implementation: as given.
      'xla' -> mask: bool [B, 1, 1, L], True at real keys; XLA broadcasts it over heads and
        queries, and it is exact for any mask.
      'cudnn' -> key_value_seq_lengths: int32 [B], the real keys of each row. cuDNN refuses a
        mask or bias that is not [.., L, L] ("Bias must have same seq length as QKV, got 1 and
        L"), and a [B, 1, L, L] one would be B x L x L in memory plus a gradient its backward
        kernel writes; its padding mask takes lengths and skips the padded keys. A length
        describes padding at the end of a row, which is where data/packing.py puts it (the only
        rows a 'cudnn' run sees: fine-tuning and `pretrained` use 'einsum'); a row with a 0
        before its last real token would be misread as its count of 1s followed by padding.
        query_seq_lengths stays None: jax then uses L, so every query row is computed as the
        einsum path computes it (cuDNN would zero the rows past a query length).
    """
    query, key, value = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    args: dict[str, Any] = {
        "query": query,
        "key": key,
        "value": value,
        "implementation": implementation,
    }
    real = attention_bias[:, 0, 0, :] >= 0  # [B, L]
    if implementation == "cudnn":
        length = real.shape[-1]
        count = jnp.sum(real, axis=-1, dtype=jnp.int32)
        # A row of padding only would ask cuDNN for a softmax over no keys; let it attend to
        # every key, like an unpadded row (its outputs are ignored, as all padding's are).
        args["key_value_seq_lengths"] = jnp.where(count > 0, count, jnp.int32(length))
    else:
        args["mask"] = real[:, None, None, :]
    return args
