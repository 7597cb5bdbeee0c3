import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.model.networks import init_params
from electra_jax.model.optim import (
    decay_mask,
    learning_rate_schedule,
    make_optimizer,
    scale_by_adam_without_bias_correction,
)
from tests.conftest import micro_config


def test_schedule_is_warmup_times_linear_decay():
    s = learning_rate_schedule(1e-3, warmup_steps=10, num_steps=100)
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(5)), 1e-3 * 0.5 * 0.95, rtol=1e-6)
    np.testing.assert_allclose(float(s(10)), 1e-3 * 0.9, rtol=1e-6)
    np.testing.assert_allclose(float(s(50)), 1e-3 * 0.5, rtol=1e-6)
    assert float(s(100)) == 0.0


def test_adam_has_no_bias_correction():
    tx = scale_by_adam_without_bias_correction(0.9, 0.999, 1e-6)
    g = {"w": jnp.array([2.0, -0.5])}
    u, _ = tx.update(g, tx.init(g))
    # Raw moments after one step: m = 0.1 g, v = 0.001 g^2 -> 0.1 / sqrt(0.001) = 3.162 x sign.
    np.testing.assert_allclose(u["w"], np.sign([2.0, -0.5]) * 0.1 / np.sqrt(0.001), rtol=1e-4)
    corrected, _ = optax.scale_by_adam(eps=1e-6).update(g, optax.scale_by_adam().init(g))
    assert not np.allclose(u["w"], corrected["w"])


def test_no_weight_decay_on_layer_norm_and_biases():
    params = {
        "dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
        "LayerNorm": {"scale": jnp.ones(2), "bias": jnp.ones(2)},
        "emb": {"embedding": jnp.ones((3, 2))},
        "generator_lm_head_bias": jnp.ones(3),
        "attention": {"qkv_kernel": jnp.ones((2, 3, 1, 2)), "qkv_bias": jnp.ones((3, 1, 2))},
    }
    mask = decay_mask(params)
    assert mask["dense"]["kernel"] and mask["emb"]["embedding"]
    assert mask["attention"]["qkv_kernel"] and not mask["attention"]["qkv_bias"]
    assert not mask["dense"]["bias"] and not mask["LayerNorm"]["scale"]
    assert not mask["LayerNorm"]["bias"] and not mask["generator_lm_head_bias"]

    cfg = micro_config().train
    cfg.warmup_steps = 0
    tx, _ = make_optimizer(cfg)
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    # With zero gradients only weight decay moves parameters: kernels yes, the rest no.
    assert float(jnp.abs(updates["dense"]["kernel"]).sum()) > 0
    assert float(jnp.abs(updates["LayerNorm"]["scale"]).sum()) == 0
    assert float(jnp.abs(updates["dense"]["bias"]).sum()) == 0


def test_two_steps_match_a_hand_computed_reference():
    """Clip to norm 1, raw Adam moments, lr from the schedule: checked against numpy."""
    cfg = micro_config().train
    cfg.warmup_steps = 0
    cfg.weight_decay = 0.0
    cfg.adam_bias_correction = False  # the paper's optimizer
    tx, schedule = make_optimizer(cfg)
    params = {"w": jnp.zeros(4)}
    state = tx.init(params)
    g1, g2 = np.full(4, 100.0), np.full(4, 0.25)  # norms 200 (clipped to 1) and 0.5 (kept)
    u1, state = tx.update({"w": jnp.asarray(g1)}, state, params)
    u2, state = tx.update({"w": jnp.asarray(g2)}, state, params)

    b1, b2, eps = cfg.adam_b1, cfg.adam_b2, cfg.adam_eps
    c1 = g1 / np.linalg.norm(g1)
    m, v = (1 - b1) * c1, (1 - b2) * c1**2
    expected1 = -float(schedule(0)) * m / (np.sqrt(v) + eps)
    m, v = b1 * m + (1 - b1) * g2, b2 * v + (1 - b2) * g2**2
    expected2 = -float(schedule(1)) * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(u1["w"], expected1, rtol=1e-5)
    np.testing.assert_allclose(u2["w"], expected2, rtol=1e-5)


def test_bias_correction_option_gives_adam_first_step():
    cfg = micro_config().train
    cfg.warmup_steps = 0
    cfg.weight_decay = 0.0
    cfg.adam_bias_correction = True
    tx, schedule = make_optimizer(cfg)
    params = {"w": jnp.zeros(3)}
    u, _ = tx.update({"w": jnp.array([0.3, -0.2, 0.1])}, tx.init(params), params)
    # Bias-corrected Adam's first step is lr x sign(g) (up to eps).
    np.testing.assert_allclose(u["w"], -float(schedule(0)) * np.sign([0.3, -0.2, 0.1]), rtol=1e-4)


def test_every_model_matrix_is_decayed_and_nothing_else():
    """Over the real parameter tree: biases and LayerNorm scales are exempt, all else decays."""
    from electra_jax.pretraining import program

    cfg = micro_config()
    _, model, tx, _, _ = program.build(cfg, 64)
    params = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    flat = jax.tree_util.tree_flatten_with_path(decay_mask(params))[0]
    for path, decayed in flat:
        name = path[-1].key
        exempt = name.endswith("bias") or name == "scale"
        assert decayed != exempt, jax.tree_util.keystr(path)


def test_generator_lr_scale_multiplies_the_generators_updates_only():
    cfg = micro_config().train
    cfg.warmup_steps, cfg.weight_decay = 0, 0.01
    params = {
        "generator": {"kernel": jnp.ones((2, 2))},
        "generator_lm_head_bias": jnp.ones(3),
        "discriminator": {"kernel": jnp.ones((2, 2))},
        "embeddings": {"embedding": jnp.ones((3, 2))},  # shared: the discriminator's rate
    }
    grads = jax.tree_util.tree_map(lambda p: 0.5 * jnp.ones_like(p), params)

    def first_update(scale):
        cfg.generator_lr_scale = scale
        tx, _ = make_optimizer(cfg)
        return tx.update(grads, tx.init(params), params)[0]

    one, ten = first_update(1.0), first_update(10.0)
    for key in ("generator", "generator_lm_head_bias"):
        np.testing.assert_allclose(
            jax.tree_util.tree_leaves(ten[key])[0], 10 * jax.tree_util.tree_leaves(one[key])[0]
        )
    for key in ("discriminator", "embeddings"):
        np.testing.assert_array_equal(
            jax.tree_util.tree_leaves(ten[key])[0], jax.tree_util.tree_leaves(one[key])[0]
        )
    # At 1 the chain is the paper's: its state has no extra entry.
    cfg.generator_lr_scale = 1.0
    assert len(make_optimizer(cfg)[0].init(params)) == 4
