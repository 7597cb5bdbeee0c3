"""Each kernel against the plain formulation it replaces: values and gradients (autodiff)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.model import kernels
from electra_jax.model.networks import Dropout


def _grads_match(ours, plain, args, weights, atol):
    """ours(*args) and plain(*args) agree, and so do the gradients of sum(f(*args) * weights)
    with respect to every argument."""
    value, grads = jax.value_and_grad(
        lambda *a: jnp.sum(ours(*a) * weights), argnums=tuple(range(len(args)))
    )(*args)
    ref, grads_ref = jax.value_and_grad(
        lambda *a: jnp.sum(plain(*a) * weights), argnums=tuple(range(len(args)))
    )(*args)
    np.testing.assert_allclose(value, ref, rtol=1e-5, atol=atol)
    for a, b in zip(grads, grads_ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)


def test_column_sums_is_the_sum_over_leading_axes():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 7))
    np.testing.assert_allclose(kernels.column_sums(x), x.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    # HIGHEST precision: bfloat16 inputs are summed without rounding each term again.
    assert kernels.column_sums(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_add_bias_and_scale_shift_match_autodiff():
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    x = jax.random.normal(keys[0], (3, 5, 8))
    scale = jax.random.normal(keys[1], (8,))
    bias = jax.random.normal(keys[2], (8,))
    weights = jax.random.normal(keys[3], (3, 5, 8))
    _grads_match(kernels.add_bias, lambda x, b: x + b, (x, bias), weights, 1e-5)
    _grads_match(kernels.scale_shift, lambda y, s, b: y * s + b, (x, scale, bias), weights, 1e-5)


def test_gelu_is_the_exact_erf_gelu():
    x = jnp.linspace(-6.0, 6.0, 1001)
    np.testing.assert_allclose(kernels.gelu(x), jax.nn.gelu(x, approximate=False), atol=1e-6)


def test_dropout_bits_are_uniform_and_independent():
    shape = (4, 8, 64, 33)  # 67,584 words: each statistic below has a standard error <= 0.004
    words = np.asarray(kernels.dropout_bits(jax.random.key(0), shape))
    assert words.dtype == np.uint32 and words.shape == shape
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 32)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.01)  # every bit position is fair
    u = words.astype(np.float64) / 2**32
    other = np.asarray(kernels.dropout_bits(jax.random.key(1), shape)) / 2**32
    pairs = {
        "next column": (u[..., :-1], u[..., 1:]),
        "next row": (u[:, :, :-1], u[:, :, 1:]),
        "next batch row": (u[:-1], u[1:]),
        "another key": (u, other),
    }
    for name, (a, b) in pairs.items():
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02, name
    keep = (
        Dropout(0.1).apply({}, jnp.ones(shape), False, rngs={"dropout": jax.random.PRNGKey(3)}) > 0
    )
    assert abs(float(keep.mean()) - 0.9) < 0.005


def test_gelu_dense_matches_autodiff():
    """gelu_dense's hand-written backward (gelu recomputed from h) equals autodiff of
    gelu(h) @ kernel + bias, in float32 and in bfloat16."""
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    h = jax.random.normal(keys[0], (12, 16)) * 2.0
    kernel = jax.random.normal(keys[1], (16, 5))
    bias = jax.random.normal(keys[2], (5,))
    weights = jax.random.normal(keys[3], (12, 5))

    def plain(h, k, b):
        return kernels.gelu(h) @ k + b

    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)):
        args = tuple(a.astype(dtype) for a in (h, kernel, bias))
        outs = []
        for f in (kernels.gelu_dense, plain):
            loss = lambda *a, f=f: jnp.sum(f(*a).astype(jnp.float32) * weights)
            outs.append(jax.value_and_grad(loss, argnums=(0, 1, 2))(*args))
        (value, grads), (value_ref, grads_ref) = outs
        np.testing.assert_allclose(value, value_ref, rtol=tol)
        for a, b in zip(grads, grads_ref, strict=True):
            assert a.dtype == dtype
            scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
            np.testing.assert_allclose(
                a.astype(jnp.float32), b.astype(jnp.float32), atol=tol * scale, rtol=0
            )


def test_layer_norm_matches_autodiff_and_keeps_its_input_in_bfloat16():
    """layer_norm's hand-written backward equals autodiff of the float32 formula; from a
    bfloat16 input, its gradient is bfloat16 within bfloat16's rounding of the float32 one, and
    what the backward keeps is that input and two float32 statistics per row."""
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    x = jax.random.normal(keys[0], (3, 5, 8)) * 3.0 + 1.0
    scale = jax.random.normal(keys[1], (8,))
    bias = jax.random.normal(keys[2], (8,))
    weights = jax.random.normal(keys[3], (3, 5, 8))

    def plain(x, s, b):
        x = x.astype(jnp.float32)
        centered = x - jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
        return centered * jax.lax.rsqrt(variance + 1e-12) * s + b

    ours = lambda x, s, b: kernels.layer_norm(x, s, b, 1e-12)
    _grads_match(ours, plain, (x, scale, bias), weights, 1e-5)
    low = x.astype(jnp.bfloat16)
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.bfloat16).astype(jnp.float32) * weights)
    grads = jax.grad(loss(ours), argnums=(0, 1, 2))(low, scale, bias)
    grads_ref = jax.grad(loss(plain), argnums=(0, 1, 2))(low.astype(jnp.float32), scale, bias)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32, jnp.float32]
    for a, b in zip(grads, grads_ref, strict=True):
        scale_of = float(jnp.max(jnp.abs(b)))
        np.testing.assert_allclose(a.astype(jnp.float32), b, atol=2e-2 * scale_of, rtol=0)
    _, pullback = jax.vjp(ours, low, scale, bias)
    kept = {(a.dtype.name, a.shape) for a in jax.tree.leaves(pullback)}
    assert kept == {("bfloat16", (3, 5, 8)), ("float32", (3, 5, 1)), ("float32", (8,))}, kept


def test_bfloat16_attention_keeps_bfloat16_probabilities():
    """In bfloat16 the attention core keeps the probabilities in bfloat16 (float32 softmax
    statistics; half the [B, heads, L, L] bytes), and its values and gradients stay within
    bfloat16's rounding of the float32 core's on the same inputs."""
    keys = jax.random.split(jax.random.PRNGKey(8), 5)
    q, k, v, g = (jax.random.normal(kk, (2, 3, 16, 8)) for kk in keys[:4])
    bias = jnp.where(jnp.arange(16) < 12, 0.0, -1e9)[None, None, None, :].repeat(2, axis=0)

    def run(dtype):
        args = tuple(t.astype(dtype) for t in (q, k, v))
        f = lambda *a: kernels.attention_core(*a, bias, keys[4], 0.1)
        out, pullback = jax.vjp(f, *args)
        return out, pullback(g.astype(dtype)), pullback

    out, grads, pullback = run(jnp.bfloat16)
    out_ref, grads_ref, pullback_ref = run(jnp.float32)
    square = {a.dtype.name for a in jax.tree.leaves(pullback) if a.shape == (2, 3, 16, 16)}
    assert square == {"bfloat16"}, square
    square = {a.dtype.name for a in jax.tree.leaves(pullback_ref) if a.shape == (2, 3, 16, 16)}
    assert square == {"float32"}, square
    for a, b in zip((out, *grads), (out_ref, *grads_ref), strict=True):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(
            a.astype(jnp.float32), b, atol=3e-2 * float(jnp.max(jnp.abs(b))), rtol=0
        )


def test_bfloat16_dropout_scales_in_float32():
    """Kept bfloat16 activations are x / 0.9 rounded once, not x times 1/0.9 rounded to
    bfloat16 (1.109375: every kept value 0.16% small)."""
    x = (jax.random.uniform(jax.random.PRNGKey(4), (64, 256)) + 1.0).astype(jnp.bfloat16)
    out = Dropout(0.1).apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(5)})
    assert out.dtype == jnp.bfloat16
    kept = np.asarray(out.astype(jnp.float32))
    x32 = np.asarray(x.astype(jnp.float32))
    scale = kernels.keep_and_scale(jax.random.PRNGKey(0), (1,), 0.1, jnp.float32)[1]
    expected = np.asarray((x32 * scale).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(kept[kept != 0], expected[kept != 0])
    assert abs(float(np.mean(kept[kept != 0] / x32[kept != 0])) - 1 / 0.9) < 2e-4


@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_attention_core_matches_autodiff(rate):
    """attention_core (mask recomputed from its hash in the backward pass) equals autodiff of
    the plain formulation with the same dropout mask, values and q/k/v gradients."""
    keys = jax.random.split(jax.random.PRNGKey(4), 5)
    q, k, v = (jax.random.normal(kk, (2, 3, 7, 4)) for kk in keys[:3])
    bias = jnp.where(jnp.arange(7) < 5, 0.0, -1e9)[None, None, None, :].repeat(2, axis=0)
    g = jax.random.normal(keys[3], (2, 3, 7, 4))
    key = keys[4]

    def plain(q, k, v):
        probs = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / 2.0 + bias, axis=-1)
        if rate:
            keep, scale = kernels.keep_and_scale(key, probs.shape, rate, probs.dtype)
            probs = jnp.where(keep, probs * scale, 0.0)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)

    ours = lambda q, k, v: kernels.attention_core(q, k, v, bias, key, rate)
    value, grads = jax.value_and_grad(lambda *a: jnp.sum(ours(*a) * g), argnums=(0, 1, 2))(q, k, v)
    ref, grads_ref = jax.value_and_grad(lambda *a: jnp.sum(plain(*a) * g), argnums=(0, 1, 2))(
        q, k, v
    )
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    for a, b in zip(grads, grads_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if rate:  # the mask really drops something, and differs with the key
        other = kernels.attention_core(q, k, v, bias, jax.random.PRNGKey(9), rate)
        assert not np.allclose(other, ours(q, k, v))


def test_gelu_dense_backward_keeps_less_memory():
    """The point of gelu_dense's custom VJP: the compiled backward holds h alone, not erf(h) and
    gelu(h) too (XLA would hoist the recomputation into the forward without the cotangent tie)."""
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    h = jax.random.normal(keys[0], (256, 512))
    mats = jax.random.normal(keys[1], (4, 512, 512)) * 0.05
    bias = jnp.zeros((512,))

    def temp_bytes(f):
        def loss(h, mats):
            for i in range(4):
                h = h + f(h, mats[i], bias)
            return jnp.sum(h * h)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(h, mats).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = lambda h, k, b: kernels.gelu(h) @ k + b
    ours, theirs = temp_bytes(kernels.gelu_dense), temp_bytes(plain)
    assert ours < 0.8 * theirs, (ours, theirs)


def test_attention_backward_takes_the_softmax_row_sums_from_the_output():
    """The softmax gradient's row sums come from dO . O ([B, heads, L, d]), so the backward
    pass sums no [B, heads, L, L] array over its keys (one pass over it fewer), and ties its
    recomputed dropout to a [B, heads, L, 1] slice of the cotangent, not to an [L, L] array."""
    b, h, length, d = 2, 3, 16, 4
    q, k, v, g = (jax.random.normal(key, (b, h, length, d)) for key in jax.random.split(
        jax.random.PRNGKey(6), 4))  # fmt: skip
    bias = jnp.zeros((b, 1, 1, length))
    _, pullback = jax.vjp(lambda *a: kernels.attention_core(*a, bias, jax.random.PRNGKey(1), 0.1),
                          q, k, v)  # fmt: skip
    eqns = jax.make_jaxpr(pullback)(g).jaxpr.eqns
    square = (b, h, length, length)
    sums = [e for e in eqns if e.primitive.name == "reduce_sum"]
    assert sums and not [e for e in sums if e.invars[0].aval.shape == square]
    zeros = [  # x * 0: the tie of the recomputed dropout to the cotangent
        e
        for e in eqns
        if e.primitive.name == "mul" and any(getattr(x, "val", None) == 0.0 for x in e.invars)
    ]
    assert [e.outvars[0].aval.shape for e in zeros] == [(b, h, length, 1)]
