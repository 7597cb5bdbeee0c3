"""model.attention='xla' / 'cudnn': what SelfAttention._fused hands jax.nn.dot_product_attention.

No GPU is needed. jax's cuDNN path checks its arguments in Python before anything is lowered
(jax/_src/nn/functions.py: ranks, dtypes, seq-length shapes; then
jax/_src/cudnn/fused_attention_stablehlo.py: combine_bias_and_mask, check_layout,
check_is_flash_attention), and only its lowering needs CUDA. So these tests (1) trace the whole
model with model.attention='cudnn' under jax.eval_shape, forward and backward, with a stand-in
for the cuDNN version query (the one call that needs a CUDA jaxlib) and an H200's compute
capability, and (2) call those checks directly on the arrays `fused_attention_args` builds. An
H200 run once failed at trace time with "Bias must have same seq length as QKV, got 1 and 8"
(a [B, 1, 1, L] key mask, which check_layout refuses); both kinds of test catch that on CPU.

The numbers are checked with 'xla' on CPU: fused attention equals the einsum path on padded
batches, with the key mask ('xla') and with the per-row key counts that 'cudnn' is given.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

from electra_jax.model import kernels
from electra_jax.model import networks as model_lib
from electra_jax.model.networks import ElectraSpec, EncoderSpec

HEADS, HEAD_DIM = 4, 64
# (batch, seq_length): the length of the H200 failure, and configs/small.py's.
SHAPES = [(2, 8), (2, 128)]
H200_CAPABILITY = (9, 0)
CUDNN_VERSION = 91000  # 9.10; only compared against thresholds (9.11 for sm_103, 9.10 for MLA)


@pytest.fixture
def cudnn_on_cpu(monkeypatch):
    """Lets jax's cuDNN attention trace on CPU as on an H200: it asks jaxlib for the cuDNN
    version first (a CPU jaxlib has none) and the device for its compute capability (the head-dim
    limit depends on it); everything else it checks is plain Python on shapes and dtypes."""

    def at_least(capability):
        return tuple(int(x) for x in capability.split(".")) <= H200_CAPABILITY

    def equal(capability):
        return tuple(int(x) for x in capability.split(".")) == H200_CAPABILITY

    monkeypatch.setattr(cudnn_fa, "check_cudnn_version", lambda: CUDNN_VERSION)
    monkeypatch.setattr(cudnn_fa, "check_compute_capability", at_least, raising=False)
    monkeypatch.setattr(cudnn_fa, "is_cuda_compute_capability_equal", equal, raising=False)
    # Counts the checks' calls, so that a test can tell they ran (were jax to stop calling them,
    # a test that merely traced would pass without checking anything).
    calls = {"check_layout": [], "check_is_flash_attention": []}
    for name, record in calls.items():
        check = getattr(cudnn_fa, name)

        @functools.wraps(check)  # keeps its signature for _call
        def counted(*args, _check=check, _record=record, **kwargs):
            _record.append(inspect.signature(_check).bind(*args, **kwargs).arguments)
            return _check(*args, **kwargs)

        monkeypatch.setattr(cudnn_fa, name, counted)
    return calls


def _input_mask(batch: int, length: int) -> np.ndarray:
    """int32 [batch, length]: row 0 full, the others padded at the end as packing pads them."""
    real = [length] + [max(1, length // (2 + i)) for i in range(batch - 1)]
    return (np.arange(length)[None, :] < np.asarray(real)[:, None]).astype(np.int32)


def _attention_bias(input_mask) -> jax.Array:
    """[B, 1, 1, L] float32, exactly as Encoder builds it from input_mask."""
    mask = jnp.asarray(input_mask)
    return jnp.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)


def _qkv(batch: int, length: int, dtype, seed: int = 0):
    """q, k, v [batch, heads, length, head_dim] in SelfAttention's heads-first layout."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    shape = (batch, HEADS, length, HEAD_DIM)
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in keys)


def _call(fn, **given):
    """fn(**given), None for its other required parameters: check_layout and
    check_is_flash_attention grow parameters (offsets, page tables, MLA) across jax versions."""
    params = inspect.signature(fn).parameters
    args = {n: None for n, p in params.items() if p.default is inspect.Parameter.empty}
    args.update({n: v for n, v in given.items() if n in params})
    return fn(**args)


def _spec(length: int) -> ElectraSpec:
    """bf16, cuDNN attention, no attention dropout; head_dim 64 in both networks."""
    return ElectraSpec(
        vocab_size=300,
        embedding_size=64,
        max_position_embeddings=length,
        type_vocab_size=2,
        discriminator=EncoderSpec(
            hidden_size=HEADS * HEAD_DIM, num_layers=1, num_heads=HEADS, intermediate_size=512
        ),
        generator=EncoderSpec(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=256),
        attention_dropout_rate=0.0,
        dtype="bfloat16",
        attention="cudnn",
    )


@pytest.mark.parametrize("batch,length", SHAPES)
def test_the_model_traces_through_jax_cudnn_checks(cudnn_on_cpu, batch, length):
    """Initialisation, the forward pass and the gradient of both networks, traced with
    model.attention='cudnn' in bfloat16: every argument check of jax's cuDNN path runs."""
    model = model_lib.Electra(_spec(length))
    params = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.PRNGKey(0)))
    ids = jnp.ones((batch, length), jnp.int32)
    mask = jnp.asarray(_input_mask(batch, length))
    positions = jnp.zeros((batch, 2), jnp.int32)

    def loss(p, deterministic):
        gen, disc = model.apply(
            {"params": p},
            ids,
            ids * 0,
            mask,
            positions,
            deterministic,
            rngs={"dropout": jax.random.PRNGKey(1)},
        )
        return jnp.sum(gen) + jnp.sum(disc)

    # deterministic=True is inference (cuDNN's forward kernel only); the gradient with
    # deterministic=False is training (forward kernel with softmax statistics, backward kernel).
    flash = cudnn_on_cpu["check_is_flash_attention"]
    del flash[:]
    assert jax.eval_shape(lambda p: loss(p, True), params).shape == ()
    # Inference traces forward kernels only (the scanned layer body may be traced more than
    # once per network); training traces the kernels with softmax statistics for the backward.
    inference = len(flash)
    assert inference >= 2 and not any(c["is_training"] for c in flash)
    grads = jax.eval_shape(jax.grad(lambda p: loss(p, False)), params)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    assert any(c["is_training"] for c in flash[inference:])
    for c in cudnn_on_cpu["check_layout"]:
        assert c["query"].dtype == jnp.bfloat16 and c["bias"] is None
        assert c["kv_seqlen"].shape == (c["query"].shape[0],)
    assert {c["query"].shape[1] for c in flash} == {length}


@pytest.mark.parametrize("batch,length", SHAPES)
def test_cudnn_arguments_pass_jax_cudnn_checks(cudnn_on_cpu, batch, length):
    """fused_attention_args' 'cudnn' arguments, at bf16, through jax's checks called directly,
    after the same preparation jax.nn.dot_product_attention gives them."""
    q, k, v = _qkv(batch, length, jnp.bfloat16)
    input_mask = _input_mask(batch, length)
    args = kernels.fused_attention_args(q, k, v, _attention_bias(input_mask), "cudnn")

    assert args["implementation"] == "cudnn"
    for name in ("query", "key", "value"):
        assert args[name].shape == (batch, length, HEADS, HEAD_DIM)  # BTNH
        assert args[name].dtype == jnp.bfloat16
    # Key padding goes as per-row key counts (cuDNN's padding mask), not as a mask or bias.
    assert args.get("mask") is None and args.get("bias") is None
    kv_len = args["key_value_seq_lengths"]
    assert kv_len.shape == (batch,) and kv_len.dtype == jnp.int32
    np.testing.assert_array_equal(kv_len, input_mask.sum(axis=1))

    # What jax.nn.dot_product_attention's 'cudnn' branch does with them: query lengths default
    # to the full length, the mask type becomes PADDING, mask and bias combine into one bias.
    q_len = jnp.full((batch,), length, jnp.int32)
    bias = cudnn_fa.combine_bias_and_mask(args.get("bias"), args.get("mask"), jnp.bfloat16)
    assert bias is None
    layout = cudnn_fa.AttentionLayout.BTNH  # jax.nn.dot_product_attention's only layout
    _call(
        cudnn_fa.check_layout,
        query=args["query"],
        key=args["key"],
        value=args["value"],
        bias=bias,
        q_seqlen=q_len,
        kv_seqlen=kv_len,
        layout=layout,
    )
    for is_training in (False, True):
        _call(
            cudnn_fa.check_is_flash_attention,
            query=args["query"],
            key=args["key"],
            value=args["value"],
            layout=layout.value,
            cudnn_version=CUDNN_VERSION,
            has_bias=bias is not None,
            is_training=is_training,
            is_packed=False,
            is_paged_attention=False,
        )
    # And the public entry point itself, traced (nothing is lowered).
    out = jax.eval_shape(lambda: jax.nn.dot_product_attention(**args))
    assert out.shape == (batch, length, HEADS, HEAD_DIM) and out.dtype == jnp.bfloat16


@pytest.mark.parametrize("batch,length", SHAPES)
def test_a_key_mask_of_one_query_row_is_what_cudnn_refuses(cudnn_on_cpu, batch, length):
    """The checks above can see the H200 failure: the [B, 1, 1, L] mask the model once passed."""
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in _qkv(batch, length, jnp.bfloat16))
    old_mask = _attention_bias(_input_mask(batch, length)) >= 0
    refused = f"Bias must have same seq length as QKV, got 1 and {length}"
    with pytest.raises(ValueError, match=refused):
        jax.eval_shape(
            lambda: jax.nn.dot_product_attention(q, k, v, mask=old_mask, implementation="cudnn")
        )


def _einsum(q, k, v, bias):
    """The default path at rate 0 (deterministic): [B, heads, L, d]."""
    return kernels.attention_core(q, k, v, bias, jax.random.PRNGKey(0), 0.0)


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_fused_attention_equals_einsum_on_a_padded_batch(implementation):
    """Float32 on CPU. 'xla' runs its own arguments; for 'cudnn' the same arguments (per-row key
    counts) run through jax's XLA implementation, which reads them as cuDNN does: keys at or
    after the count are masked, every query row is computed. Values and gradients."""
    batch, length = 3, 16
    q, k, v = _qkv(batch, length, jnp.float32, seed=3)
    input_mask = _input_mask(batch, length)
    bias = _attention_bias(input_mask)

    def fused(q, k, v):
        args = kernels.fused_attention_args(q, k, v, bias, implementation)
        args["implementation"] = "xla"
        return jnp.swapaxes(jax.nn.dot_product_attention(**args), 1, 2)

    np.testing.assert_allclose(fused(q, k, v), _einsum(q, k, v, bias), rtol=1e-5, atol=1e-5)
    g = jax.random.normal(jax.random.PRNGKey(7), q.shape)
    grads = [
        jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * g), argnums=(0, 1, 2))(q, k, v)
        for f in (fused, lambda q, k, v: _einsum(q, k, v, bias))
    ]
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_row_without_real_tokens_stays_finite_for_cudnn():
    """A row of padding only (pre-training never has one: packed rows start with [CLS])
    would give cuDNN a softmax over no keys; its arguments let it attend to every key instead,
    like an unpadded row. Its outputs are ignored wherever input_mask is 0."""
    batch, length = 2, 8
    q, k, v = _qkv(batch, length, jnp.float32, seed=5)
    input_mask = np.ones((batch, length), np.int32)
    input_mask[1] = 0
    args = kernels.fused_attention_args(q, k, v, _attention_bias(input_mask), "cudnn")
    np.testing.assert_array_equal(args["key_value_seq_lengths"], [length, length])
    args["implementation"] = "xla"
    out = jnp.swapaxes(jax.nn.dot_product_attention(**args), 1, 2)
    unpadded = _einsum(q, k, v, jnp.zeros((batch, 1, 1, length), jnp.float32))
    np.testing.assert_allclose(out, unpadded, rtol=1e-5, atol=1e-5)


def _attention_module(implementation: str, dtype: str = "float32", attention_dropout_rate=0.0):
    """The discriminator's SelfAttention (4 heads of 64) with the given settings."""
    spec = dataclasses.replace(
        _spec(16),
        attention=implementation,
        dtype=dtype,
        attention_dropout_rate=attention_dropout_rate,
    )
    return model_lib.SelfAttention(spec, spec.discriminator)


def test_self_attention_xla_equals_einsum_with_the_same_parameters():
    """The whole module (fused qkv projection, attention, output projection), float32."""
    batch, length = 3, 16
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, length, HEADS * HEAD_DIM))
    bias = _attention_bias(_input_mask(batch, length))
    einsum = _attention_module("einsum")
    params = einsum.init(jax.random.PRNGKey(0), x, bias, True)
    want = einsum.apply(params, x, bias, True)
    got = _attention_module("xla").apply(params, x, bias, True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _abstract_params(x, bias):
    """SelfAttention's parameters as shapes: the implementations share them."""
    module = _attention_module("einsum")
    return jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), x, bias, True))


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_fused_attention_refuses_attention_dropout_in_training(cudnn_on_cpu, implementation):
    """Neither fused path drops attention probabilities (see SelfAttention._fused): training with
    model.attention_dropout_rate > 0 is an error, evaluation (deterministic) is not."""
    batch, length = 2, 16
    x = jnp.ones((batch, length, HEADS * HEAD_DIM))
    bias = _attention_bias(_input_mask(batch, length))
    module = _attention_module(implementation, "bfloat16", attention_dropout_rate=0.1)
    params = _abstract_params(x, bias)
    with pytest.raises(ValueError, match="attention_dropout_rate"):
        jax.eval_shape(
            lambda p: module.apply(p, x, bias, False, rngs={"dropout": jax.random.PRNGKey(1)}),
            params,
        )
    out = jax.eval_shape(lambda p: module.apply(p, x, bias, True), params)
    assert out.shape == x.shape and out.dtype == jnp.bfloat16


def test_cudnn_attention_names_the_dtype_it_needs():
    """cuDNN's kernel takes 16-bit q, k, v; a float32 model says which setting to change."""
    batch, length = 2, 16
    x = jnp.ones((batch, length, HEADS * HEAD_DIM))
    bias = _attention_bias(_input_mask(batch, length))
    params = _abstract_params(x, bias)
    module = _attention_module("cudnn", "float32")
    with pytest.raises(ValueError, match="model.dtype='bfloat16'"):
        jax.eval_shape(lambda p: module.apply(p, x, bias, True), params)
