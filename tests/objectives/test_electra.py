"""Tests of objectives/electra.py through the functions the train step calls."""

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax.objectives import core, registry
from tests.objectives.test_core import batch_and_corruption


def test_total_is_weighted_sum_and_no_gradient_through_samples():
    vocab = 1000
    electra = registry.get("electra")
    batch, corruption = batch_and_corruption(electra, vocab=vocab)
    mask = batch["input_mask"]
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))
    weights = {"gen_weight": 1.0, "disc_weight": 50.0}

    def gen_fn(p, masked_ids, positions, _):
        base = jax.nn.one_hot(jnp.take_along_axis(masked_ids, positions, 1), vocab)
        return base * p  # [B, N, V]

    def disc_fn(p, corrupted, _):
        return (corrupted % 7).astype(jnp.float32) * p - 3.0

    def sums_of(params):
        networks = core.Networks(
            lambda a, b, c: gen_fn(params["gen"], a, b, c),
            lambda a, c: disc_fn(params["disc"], a, c),
            None,
        )
        return electra.sums(
            batch, corruption, networks, keys, temperature=1.0, sampler="inverse_cdf"
        )

    def loss(params, which):
        m = electra.metrics(sums_of(params), **weights)
        return m[which], m

    params = {"gen": jnp.ones((vocab,)), "disc": jnp.ones(())}
    total, m = loss(params, "loss")
    np.testing.assert_allclose(float(total), float(m["gen_loss"] + 50 * m["disc_loss"]), rtol=1e-6)
    # The step's loss (the whole batch's denominators) is the logged one.
    sums = sums_of(params)
    denominators = (jnp.sum(corruption.masked.weights), jnp.sum(mask > 0).astype(jnp.float32))
    np.testing.assert_allclose(float(electra.loss(sums, denominators, **weights)), float(total))
    assert "disc_mlm_loss" not in sums  # no MLM head: no discriminator MLM term
    # The discriminator's loss depends on the generator only through the sample: zero gradient.
    g = jax.grad(lambda p: loss(p, "disc_loss")[0])(params)
    assert float(jnp.abs(g["gen"]).sum()) == 0.0
    assert float(jnp.abs(g["disc"])) > 0.0


def test_the_discriminators_mlm_weight_fades_with_the_step():
    """begin_step: disc_mlm_weight from objective.disc_mlm_weight down to 0 over disc_mlm_steps
    (constant without them); nothing added when the weight is 0."""
    import ml_collections

    electra = registry.get("electra")
    weights = {"gen_weight": 1.0, "disc_weight": 50.0}
    cfg = ml_collections.ConfigDict({"disc_mlm_weight": 2.0, "disc_mlm_steps": 4})
    seen = [
        float(electra.begin_step(cfg, jnp.int32(s), {}, weights).weights["disc_mlm_weight"])
        for s in (0, 2, 4, 8)
    ]
    assert seen == [2.0, 1.0, 0.0, 0.0]
    cfg.disc_mlm_steps = 0
    assert electra.begin_step(cfg, jnp.int32(9), {}, weights).weights["disc_mlm_weight"] == 2.0
    cfg.disc_mlm_weight = 0.0
    assert electra.begin_step(cfg, jnp.int32(9), {}, weights).weights == weights
