import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.data.tokenizer import CLS_ID, SEP_ID
from electra_jax.model import networks as model_lib
from electra_jax.model.networks import REMAT_CHOICES, Electra, init_params, spec_from_config
from electra_jax.pretraining import dry_run
from tests.conftest import load_config, micro_config


@pytest.mark.parametrize(
    "name,expected", [("small", 13.5e6), ("base", 108.9e6), ("large", 334.1e6)]
)
def test_discriminator_sizes_match_the_paper(name, expected):
    summary = dry_run.describe(load_config(name), compile=False)
    assert abs(summary["discriminator_params"] - expected) / expected < 0.03


def test_generator_shapes_follow_the_fraction():
    for name, width, heads in [("small", 64, 1), ("base", 256, 4), ("large", 256, 4)]:
        summary = dry_run.describe(load_config(name), compile=False)
        assert summary["generator_hidden_size"] == width
        assert summary["generator_num_heads"] == heads


def _micro_model():
    cfg = micro_config()
    spec = spec_from_config(cfg.model, cfg.generator, 300)
    model = Electra(spec)
    return spec, model, init_params(model, jax.random.PRNGKey(0))


def test_projection_only_where_widths_differ():
    spec, _, params = _micro_model()
    assert spec.embedding_size != spec.discriminator.hidden_size
    assert "embeddings_project" in params["discriminator"]
    assert "embeddings_project" in params["generator"]  # 16 wide vs E=32
    cfg = load_config("base")
    abstract = jax.eval_shape(
        functools.partial(init_params, Electra(spec_from_config(cfg.model, cfg.generator, 100))),
        jax.random.PRNGKey(0),
    )
    assert "embeddings_project" not in abstract["discriminator"]  # E = H = 768
    assert "embeddings_project" in abstract["generator"]  # 768 -> 256


def _batch(b=2, length=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 300, (b, length)).astype(np.int32)
    return jnp.asarray(ids), jnp.zeros((b, length), jnp.int32), jnp.ones((b, length), jnp.int32)


def test_embeddings_are_shared_by_both_networks():
    _, model, params = _micro_model()
    ids, seg, mask = _batch()
    positions = jnp.array([[1, 2], [3, 4]])

    def gen_loss(p):
        return model.apply(
            {"params": p}, ids, seg, mask, positions, method=Electra.generator_logits
        ).sum()

    def disc_loss(p):
        return model.apply({"params": p}, ids, seg, mask, method=Electra.discriminator_logits).sum()

    # One table, and each network's loss moves it.
    assert list(params).count("embeddings") == 1
    for fn in (gen_loss, disc_loss):
        g = jax.jit(jax.grad(fn))(params)["embeddings"]  # compiled: op by op takes seconds
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            assert float(jnp.abs(g[name]["embedding"]).sum()) > 0
        assert float(jnp.abs(g["LayerNorm"]["scale"]).sum()) > 0
    # The generator's output layer is tied: its gradient reaches the word table even with the
    # encoder's input path cut (the same ids everywhere would still give input gradients, so
    # check that changing the table changes the logits of a fixed hidden state instead).
    bumped = jax.tree_util.tree_map(lambda x: x, params)
    bumped["embeddings"]["word_embeddings"]["embedding"] = (
        params["embeddings"]["word_embeddings"]["embedding"] * 2.0
    )
    logits = jax.jit(
        lambda p: model.apply(
            {"params": p}, ids, seg, mask, positions, method=Electra.generator_logits
        )
    )
    a, b = logits(params), logits(bumped)
    assert a.shape == (2, 2, 300)
    assert not np.allclose(a, b)


def test_padding_does_not_change_real_positions():
    _, model, params = _micro_model()
    ids, seg, mask = _batch()
    mask = mask.at[:, 10:].set(0)
    other = ids.at[:, 10:].set(7)
    a = model.apply({"params": params}, ids, seg, mask, method=Electra.discriminator_logits)
    b = model.apply({"params": params}, other, seg, mask, method=Electra.discriminator_logits)
    np.testing.assert_allclose(a[:, :10], b[:, :10], atol=1e-5)
    assert a.shape == (2, 16) and a.dtype == jnp.float32


def test_bfloat16_compute_keeps_float32_params():
    cfg = micro_config()
    cfg.model.dtype = "bfloat16"
    model = Electra(spec_from_config(cfg.model, cfg.generator, 300))
    params = init_params(model, jax.random.PRNGKey(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    ids, seg, mask = _batch()
    logits = model.apply({"params": params}, ids, seg, mask, method=Electra.discriminator_logits)
    assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


RNG = jax.random.PRNGKey(0)


def _grads(remat: str, dtype: str = "float32", params=None):
    """(loss, gradients) of the discriminator's squared logits, with dropout; `params`: the
    model's (made here when None: they do not depend on remat)."""
    cfg = micro_config()
    cfg.model.dtype = dtype
    model = Electra(spec_from_config(cfg.model, cfg.generator, 300, remat=remat))
    if params is None:
        params = init_params(model, RNG)
    ids, seg, mask = _batch()

    def loss(p):
        out = model.apply(
            {"params": p},
            ids,
            seg,
            mask,
            False,
            rngs={"dropout": jax.random.PRNGKey(1)},
            method=Electra.discriminator_logits,
        )
        return jnp.sum(out**2)

    return jax.jit(jax.value_and_grad(loss))(params)


def test_every_remat_policy_keeps_the_numbers_bit_for_bit():
    """Remat changes what the backward pass keeps and recomputes, not what it computes: the loss
    and every gradient of each policy (the offload one included: on CPU the host is the device)
    are those without remat, to the bit (float32, dropout on)."""
    cfg = micro_config()
    params = init_params(Electra(spec_from_config(cfg.model, cfg.generator, 300)), RNG)
    base_loss, base_grads = _grads("none", params=params)
    for mode in REMAT_CHOICES[1:]:
        loss, grads = _grads(mode, params=params)
        assert float(loss) == float(base_loss), mode
        leaves = zip(
            jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(base_grads), strict=True
        )
        for a, b in leaves:
            np.testing.assert_array_equal(a, b, err_msg=mode)
    with pytest.raises(ValueError, match="train.remat='sometimes': use one of none, full"):
        _grads("sometimes", params=params)


def test_fused_attention_matches_einsum_without_dropout():
    cfg = micro_config()
    outs = {}
    for impl in ("einsum", "xla"):
        cfg.model.attention = impl
        model = Electra(spec_from_config(cfg.model, cfg.generator, 300))
        params = init_params(model, jax.random.PRNGKey(0))
        ids, seg, mask = _batch()
        mask = mask.at[:, 12:].set(0)
        outs[impl] = model.apply(
            {"params": params}, ids, seg, mask, method=Electra.discriminator_logits
        )
    np.testing.assert_allclose(outs["xla"], outs["einsum"], atol=2e-5)
    cfg.model.attention = "xla"
    model = Electra(spec_from_config(cfg.model, cfg.generator, 300))
    with pytest.raises(ValueError, match="attention_dropout_rate"):
        model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            False,
            rngs={"dropout": jax.random.PRNGKey(0)},
            method=Electra.discriminator_logits,
        )


def _value_and_grads(module, params, x, weights):
    def loss(p, inputs):
        return jnp.sum(module.apply({"params": p}, inputs) * weights)

    return module.apply({"params": params}, x), jax.grad(loss, argnums=(0, 1))(params, x)


def test_matmul_gradient_layers_match_flax_and_autodiff():
    """_TokenDense and _LayerNorm compute nn.Dense's and nn.LayerNorm's values and gradients
    (theirs come from matrix-vector products instead of reductions)."""
    import flax.linen as nn

    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
    init = nn.initializers.normal(1.0)
    params = nn.Dense(6, kernel_init=init, bias_init=init).init(jax.random.PRNGKey(2), x)["params"]
    norm_params = {"scale": jnp.linspace(0.5, 2.0, 8), "bias": jnp.linspace(-1.0, 1.0, 8)}
    cases = [
        (model_lib._TokenDense(6, jnp.float32, init), nn.Dense(6), params, 6),
        (
            model_lib._LayerNorm(1e-12, jnp.float32),
            nn.LayerNorm(epsilon=1e-12),
            norm_params,
            8,
        ),
    ]
    for ours, theirs, p, width in cases:
        weights = jax.random.normal(jax.random.PRNGKey(width), (3, 5, width))
        value, grads = _value_and_grads(ours, p, x, weights)
        value_ref, grads_ref = _value_and_grads(theirs, p, x, weights)
        np.testing.assert_allclose(value, value_ref, atol=1e-5)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4)


def test_the_two_dense_layers_without_an_initializer_in_the_original_start_glorot_uniform():
    """The original's `embeddings_project` and the discriminator's 1-unit output are
    tf.layers.dense calls with no kernel_initializer: TF's default, Glorot-uniform. Every other
    kernel is the truncated normal of std initializer_range (cut at 2 std)."""
    cfg = micro_config()
    cfg.model.embedding_size = 96  # != either width, so both networks project
    spec = spec_from_config(cfg.model, cfg.generator, 1000)
    params = init_params(Electra(spec), jax.random.PRNGKey(0))
    for kernel in (
        params["generator"]["embeddings_project"]["kernel"],
        params["discriminator"]["embeddings_project"]["kernel"],
        params["discriminator_predictions_dense_prediction"]["kernel"],
    ):
        fan_in, fan_out = kernel.shape
        limit = (6 / (fan_in + fan_out)) ** 0.5
        assert float(jnp.max(jnp.abs(kernel))) <= limit
        assert float(jnp.max(jnp.abs(kernel))) > 2 * spec.initializer_range  # not the normal
    dense = params["discriminator_predictions_dense"]["kernel"]
    assert float(jnp.max(jnp.abs(dense))) <= 2 * spec.initializer_range


def test_embedding_sharing_modes_and_their_gradients():
    """'gdes': the discriminator's loss gives the generator's tables no gradient (its deltas get
    it); the deltas start at zero, so both networks start from the same embeddings. 'none': the
    networks' tables are separate. 'electra': shared (the discriminator's gradient reaches)."""
    from electra_jax.model.networks import discriminator_embedding_params, network_param_counts

    cfg = micro_config()
    cfg.model.num_layers = 1
    ids = jnp.array([[CLS_ID, 7, 8, 9, 10, 11, 12, SEP_ID]] * 2, jnp.int32)
    seg, mask = jnp.zeros_like(ids), jnp.ones_like(ids)
    positions = jnp.array([[1, 3]] * 2, jnp.int32)
    grads, params = {}, {}
    for sharing in ("electra", "gdes", "none"):
        cfg.model.embedding_sharing = sharing
        model = Electra(spec_from_config(cfg.model, cfg.generator, 300))
        params[sharing] = p = init_params(model, jax.random.PRNGKey(0))

        def disc_loss(p, model=model):
            return jnp.sum(
                model.apply({"params": p}, ids, seg, mask, method="discriminator_logits")
            )

        def gen_loss(p, model=model):
            out = model.apply({"params": p}, ids, seg, mask, positions, method="generator_logits")
            return jnp.sum(out)

        grads[sharing] = jax.jit(lambda p: (jax.grad(disc_loss)(p), jax.grad(gen_loss)(p)))(p)
        counts = network_param_counts(p)
        assert counts["discriminator"] == network_param_counts(params["electra"])["discriminator"]

    size = lambda t: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree_util.tree_leaves(t)))
    d, g = grads["electra"]
    assert size(d["embeddings"]) > 0 and size(g["embeddings"]) > 0
    d, g = grads["gdes"]
    assert size(d["embeddings"]) == 0.0  # the generator's tables: nothing from the discriminator
    assert size(d["embeddings_delta"]) > 0 and size(g["embeddings"]) > 0
    assert size(g["embeddings_delta"]) == 0.0
    gdes = params["gdes"]
    assert size({k: v for k, v in gdes["embeddings_delta"].items() if k != "LayerNorm"}) == 0.0
    effective = discriminator_embedding_params(gdes, "gdes")
    assert jax.tree_util.tree_structure(effective) == jax.tree_util.tree_structure(
        gdes["embeddings"]
    )
    d, g = grads["none"]
    assert size(d["generator_embeddings"]) == 0.0 and size(g["embeddings"]) == 0.0
    assert size(d["embeddings"]) > 0 and size(g["generator_embeddings"]) > 0
    # The default tree has none of the new parameters.
    assert not {"embeddings_delta", "generator_embeddings", "mlm_lm_head_bias"} & set(
        params["electra"]
    )


def _layer_value_and_grads(spec, x, bias, weights):
    """A TransformerLayer of `spec` with dropout: its output and the gradients of sum(out * weights)
    for its parameters and its input x (float32 params from PRNGKey(0))."""
    e = spec.discriminator
    layer = model_lib.TransformerLayer(spec, e)
    params = layer.init({"params": jax.random.PRNGKey(0)}, x, bias, True)

    def loss(p, x):
        out = layer.apply(p, x, bias, False, rngs={"dropout": jax.random.PRNGKey(2)})
        return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return out, grads


def _layer_spec(dtype="float32", platform=None):
    e = model_lib.EncoderSpec(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128)
    return model_lib.ElectraSpec(
        vocab_size=100, embedding_size=64, max_position_embeddings=32, type_vocab_size=2,
        discriminator=e, generator=e, dtype=dtype, platform=platform,
    )  # fmt: skip


def _layer_inputs(dtype="float32"):
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    x = jax.random.normal(keys[0], (2, 16, 64)).astype(dtype)
    bias = jnp.where(jnp.arange(16) < 12, 0.0, -1e9)[None, None, None, :].repeat(2, axis=0)
    return x, bias, jax.random.normal(keys[1], (2, 16, 64))


def _equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it (pjit, custom_vjp, ...)."""
    for e in jaxpr.eqns:
        yield e
        for param in e.params.values():
            inner = getattr(param, "jaxpr", param)
            if isinstance(inner, jax.extend.core.Jaxpr):
                yield from _equations(inner)


def test_tpu_projections_compute_the_flat_ones_function():
    """On TPU q, k, v and the output are projected by einsums into and out of the heads-first
    layout, pinned to the layout the attention core reads (SelfAttention); on a CPU that
    compiles the same program (spec.platform='tpu'), the layer's output and gradients are the
    flat path's, to float32 rounding, from the same parameters."""
    x, bias, weights = _layer_inputs()
    flat, flat_grads = _layer_value_and_grads(_layer_spec(), x, bias, weights)
    tpu, tpu_grads = _layer_value_and_grads(_layer_spec(platform="tpu"), x, bias, weights)
    np.testing.assert_allclose(tpu, flat, atol=2e-6)
    leaves = zip(jax.tree.leaves(tpu_grads), jax.tree.leaves(flat_grads), strict=True)
    for a, b in leaves:
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=5e-5 * float(jnp.max(jnp.abs(b))))
    # q, k and v come from dots whose left operand is x [B, L, H], the order the TPU compiler
    # lays out as the attention core reads (kernel first, as jnp.einsum puts it, it does not).
    layer = model_lib.TransformerLayer(_layer_spec(platform="tpu"), _layer_spec().discriminator)
    params = jax.eval_shape(lambda: layer.init({"params": jax.random.PRNGKey(0)}, x, bias, True))
    jaxpr = jax.make_jaxpr(lambda p: layer.apply(p, x, bias, True))(params).jaxpr
    projections = [
        [v.aval.shape for v in e.invars]
        for e in _equations(jaxpr)
        if e.primitive.name == "dot_general" and e.invars[1].aval.shape == (64, 2, 32)
    ]
    assert projections == [[x.shape, (64, 2, 32)]] * 3, projections


def test_token_projections_compute_the_flat_ones_function():
    """The Pallas kernels' projections (one dot per q, k, v into token-major [B, L, heads x d],
    one out of it) give the flat path's q, k, v, output and parameter gradients, moved to the
    kernels' layout, to float32 rounding, from the same parameters."""
    from electra_jax.model.flash_attention import _token_major
    from electra_jax.model.networks import _flat_projections, _token_projections

    keys = jax.random.split(jax.random.PRNGKey(5), 6)
    x = jax.random.normal(keys[0], (2, 16, 64))
    qkv_kernel = jax.random.normal(keys[1], (64, 3, 2, 32))
    qkv_bias = jax.random.normal(keys[2], (3, 2, 32))
    out_kernel = jax.random.normal(keys[3], (2, 32, 64))
    out_bias = jax.random.normal(keys[4], (64,))
    weights = jax.random.normal(keys[5], (2, 16, 64))

    def layer(params, tokens: bool):
        qkv_kernel, qkv_bias, out_kernel, out_bias = params
        if tokens:
            q, k, v = _token_projections.qkv(x, qkv_kernel, qkv_bias, jnp.float32)
            context = q * k + v  # any function of q, k, v that keeps the layout
            out = _token_projections.output(context, out_kernel, out_bias)
        else:
            q, k, v = _flat_projections.qkv(x, qkv_kernel, qkv_bias, jnp.float32)
            context = q * k + v
            out = _flat_projections.output(context, out_kernel, out_bias)
            q, k, v = map(_token_major, (q, k, v))
        return jnp.sum(out * weights), (q, k, v, out)

    params = (qkv_kernel, qkv_bias, out_kernel, out_bias)
    grad = jax.jit(jax.grad(layer, has_aux=True), static_argnums=1)
    (flat_grads, flat), (token_grads, tokens) = grad(params, False), grad(params, True)
    for a, b in zip(jax.tree.leaves(tokens), jax.tree.leaves(flat), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    for a, b in zip(token_grads, flat_grads, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_bfloat16_layers_keep_no_float32_activations():
    """In bfloat16, what the scanned layers keep for their backward pass (the stacked residuals
    of every layer) holds no float32 array of a token's width or more: probabilities, layer
    norm inputs and activations are bfloat16, only per-row statistics float32. And the layer's
    output and gradients are the float32 layer's within bfloat16's rounding."""
    spec = dataclasses.replace(_layer_spec("bfloat16"), scan_layers=True)
    encoder = model_lib.Encoder(spec, dataclasses.replace(spec.discriminator, num_layers=2))
    x, _, weights = _layer_inputs("bfloat16")
    mask = jnp.ones(x.shape[:2], jnp.int32)
    params = jax.eval_shape(lambda: encoder.init({"params": jax.random.PRNGKey(0)}, x, mask, True))

    def kept(spec, x):
        apply = lambda p, x: model_lib.Encoder(spec, encoder.encoder).apply(
            p, x, mask, False, rngs={"dropout": jax.random.PRNGKey(2)}
        )
        # The pullback's leaves are the residuals; traced for their shapes only (no FLOPs).
        residuals = jax.eval_shape(lambda p, x: jax.tree.leaves(jax.vjp(apply, p, x)[1]), params, x)
        return {(a.dtype.name, a.size) for a in residuals if a.ndim > 1}

    width = x.shape[0] * x.shape[1] * x.shape[2]  # B * L * H of one layer
    wide = lambda found, dtype: [s for d, s in found if d == dtype and s >= width]
    assert not wide(kept(spec, x), "float32")
    # The same check finds them where they are: float32 keeps float32 activations.
    assert wide(kept(dataclasses.replace(spec, dtype="float32"), x.astype(jnp.float32)), "float32")

    x, bias, weights = _layer_inputs()
    out, grads = _layer_value_and_grads(_layer_spec("bfloat16"), x.astype(jnp.bfloat16), bias,
                                        weights)  # fmt: skip
    out_ref, grads_ref = _layer_value_and_grads(_layer_spec(), x, bias, weights)
    assert out.dtype == jnp.bfloat16 and grads[1].dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), out_ref, atol=0.05)
    leaves = zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref), strict=True)
    for a, b in leaves:
        scale = float(jnp.max(jnp.abs(b)))
        np.testing.assert_allclose(a.astype(jnp.float32), b, atol=0.05 * scale, rtol=0)
