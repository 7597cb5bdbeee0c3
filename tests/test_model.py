import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import loop
from electra_jax import model as model_lib
from electra_jax.model import Electra, init_params, spec_from_config
from tests.conftest import load_config, micro_config


@pytest.mark.parametrize(
    "name,expected", [("small", 13.5e6), ("base", 108.9e6), ("large", 334.1e6)]
)
def test_discriminator_sizes_match_the_paper(name, expected):
    summary = loop.describe(load_config(name), compile=False)
    assert abs(summary["discriminator_params"] - expected) / expected < 0.03


def test_generator_shapes_follow_the_fraction():
    for name, width, heads in [("small", 64, 1), ("base", 256, 4), ("large", 256, 4)]:
        summary = loop.describe(load_config(name), compile=False)
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
        g = jax.grad(fn)(params)["embeddings"]
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
    a = model.apply({"params": params}, ids, seg, mask, positions, method=Electra.generator_logits)
    b = model.apply({"params": bumped}, ids, seg, mask, positions, method=Electra.generator_logits)
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


def _grads(remat: str, dtype: str = "float32"):
    cfg = micro_config()
    cfg.model.dtype = dtype
    model = Electra(spec_from_config(cfg.model, cfg.generator, 300, remat=remat))
    params = init_params(model, jax.random.PRNGKey(0))
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


def test_remat_keeps_the_numbers():
    base_loss, base_grads = _grads("none")
    for mode in ("full", "dots"):
        loss, grads = _grads(mode)
        np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
        leaves = zip(
            jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(base_grads), strict=True
        )
        for a, b in leaves:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="train.remat"):
        _grads("sometimes")


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


def test_dropout_bits_are_uniform_and_independent():
    shape = (4, 8, 64, 33)  # 67,584 words: each statistic below has a standard error <= 0.004
    words = np.asarray(model_lib.dropout_bits(jax.random.key(0), shape))
    assert words.dtype == np.uint32 and words.shape == shape
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 32)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.01)  # every bit position is fair
    u = words.astype(np.float64) / 2**32
    other = np.asarray(model_lib.dropout_bits(jax.random.key(1), shape)) / 2**32
    pairs = {
        "next column": (u[..., :-1], u[..., 1:]),
        "next row": (u[:, :, :-1], u[:, :, 1:]),
        "next batch row": (u[:-1], u[1:]),
        "another key": (u, other),
    }
    for name, (a, b) in pairs.items():
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02, name
    keep = (
        model_lib.Dropout(0.1).apply(
            {}, jnp.ones(shape), False, rngs={"dropout": jax.random.PRNGKey(3)}
        )
        > 0
    )
    assert abs(float(keep.mean()) - 0.9) < 0.005


def _value_and_grads(module, params, x, weights):
    def loss(p, inputs):
        return jnp.sum(module.apply({"params": p}, inputs) * weights)

    return module.apply({"params": params}, x), jax.grad(loss, argnums=(0, 1))(params, x)


def test_matmul_gradient_layers_match_flax_and_autodiff():
    """_TokenDense, _LayerNorm and add_bias compute nn.Dense's, nn.LayerNorm's and x + b's
    values and gradients (theirs come from matrix-vector products instead of reductions)."""
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

    b = jnp.arange(8.0)
    ours = jax.grad(lambda x, b: jnp.sum(model_lib.add_bias(x, b) ** 2), argnums=(0, 1))(x, b)
    plain = jax.grad(lambda x, b: jnp.sum((x + b) ** 2), argnums=(0, 1))(x, b)
    for a, c in zip(ours, plain, strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)


def test_gelu_dense_matches_autodiff():
    """gelu_dense's hand-written backward (gelu recomputed from h) equals autodiff of
    gelu(h) @ kernel + bias, in float32 and in bfloat16."""
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    h = jax.random.normal(keys[0], (12, 16)) * 2.0
    kernel = jax.random.normal(keys[1], (16, 5))
    bias = jax.random.normal(keys[2], (5,))
    weights = jax.random.normal(keys[3], (12, 5))

    def plain(h, k, b):
        return model_lib._gelu(h) @ k + b

    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)):
        args = tuple(a.astype(dtype) for a in (h, kernel, bias))
        outs = []
        for f in (model_lib.gelu_dense, plain):
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
            keep, scale = model_lib._keep_and_scale(key, probs.shape, rate, probs.dtype)
            probs = jnp.where(keep, probs * scale, 0.0)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)

    ours = lambda q, k, v: model_lib.attention_core(q, k, v, bias, key, rate)
    value, grads = jax.value_and_grad(lambda *a: jnp.sum(ours(*a) * g), argnums=(0, 1, 2))(q, k, v)
    ref, grads_ref = jax.value_and_grad(lambda *a: jnp.sum(plain(*a) * g), argnums=(0, 1, 2))(
        q, k, v
    )
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    for a, b in zip(grads, grads_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if rate:  # the mask really drops something, and differs with the key
        other = model_lib.attention_core(q, k, v, bias, jax.random.PRNGKey(9), rate)
        assert not np.allclose(other, ours(q, k, v))


def test_gelu_dense_backward_keeps_less_memory():
    """The point of gelu_dense's custom VJP: the compiled backward holds h alone, not erf(h) and
    gelu(h) too (XLA would hoist the recomputation into the forward without the cotangent tie)."""
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    h = jax.random.normal(keys[0], (256, 512))
    kernels = jax.random.normal(keys[1], (4, 512, 512)) * 0.05
    bias = jnp.zeros((512,))

    def temp_bytes(f):
        def loss(h, kernels):
            for i in range(4):
                h = h + f(h, kernels[i], bias)
            return jnp.sum(h * h)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(h, kernels).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = lambda h, k, b: model_lib._gelu(h) @ k + b
    ours, theirs = temp_bytes(model_lib.gelu_dense), temp_bytes(plain)
    assert ours < 0.8 * theirs, (ours, theirs)
