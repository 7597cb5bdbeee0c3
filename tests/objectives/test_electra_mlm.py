"""Tests of objectives/electra_mlm.py: ELECTRA's sums plus an MLM pass over the masked ids."""

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax.data.tokenizer import MASK_ID
from electra_jax.objectives import core, registry
from tests.objectives.test_core import batch_and_corruption

VOCAB = 1000


def _batch_and_corruption():
    return batch_and_corruption(registry.get("electra_mlm"), vocab=VOCAB)


def _networks(seen: list):
    """Networks whose outputs depend on what they read; `seen` records the MLM pass's input."""

    def gen(masked_ids, positions, _):
        return 0.5 * jax.nn.one_hot(jnp.take_along_axis(masked_ids, positions, 1), VOCAB)

    def disc(ids, _):
        return (ids % 7).astype(jnp.float32) - 3.0

    def mlm(ids, positions, _):
        seen.append(ids)
        at = jnp.take_along_axis(ids, positions, 1)
        return disc(ids, None), 2.0 * jax.nn.one_hot((at + 1) % VOCAB, VOCAB)

    return core.Networks(gen, disc, mlm)


def test_sums_are_electras_plus_the_mlm_head_on_the_masked_ids():
    batch, corruption = _batch_and_corruption()
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))
    seen = []
    nets = _networks(seen)
    kw = dict(temperature=1.0, sampler="inverse_cdf")
    sums = registry.get("electra_mlm").sums(batch, corruption, nets, keys, **kw)
    plain = registry.get("electra").sums(batch, corruption, nets._replace(mlm=None), keys, **kw)
    for k, v in plain.items():  # detection exactly as 'electra' (same corruption, same keys)
        np.testing.assert_array_equal(np.asarray(sums[k]), np.asarray(v), err_msg=k)
    m = corruption.masked
    # The MLM pass read the generator's input, [MASK] at the slots, not the corrupted text.
    assert len(seen) == 1
    np.testing.assert_array_equal(np.asarray(seen[0]), np.asarray(m.input_ids))
    assert int(jnp.sum(seen[0] == MASK_ID)) > 0
    _, logits = nets.mlm(m.input_ids, m.positions, None)
    loss, correct = core.mlm_loss(logits, m.targets, m.weights)
    np.testing.assert_allclose(float(sums["disc_mlm_loss"]), float(loss.total), rtol=1e-6)
    assert float(sums["disc_mlm_correct"]) == float(correct.total)


def test_loss_adds_the_weighted_mlm_mean_and_the_weight_fades():
    batch, corruption = _batch_and_corruption()
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))
    objective = registry.get("electra_mlm")
    sums = objective.sums(batch, corruption, _networks([]), keys, temperature=1.0)
    weights = {"gen_weight": 1.0, "disc_weight": 50.0}
    m = objective.metrics(sums, **weights, disc_mlm_weight=3.0)
    expected = m["gen_loss"] + 50 * m["disc_loss"] + 3.0 * m["disc_mlm_loss"]
    np.testing.assert_allclose(float(m["loss"]), float(expected), rtol=1e-6)
    assert float(m["disc_mlm_loss"]) > 0 and 0 <= float(m["disc_mlm_accuracy"]) <= 1
    import ml_collections

    cfg = ml_collections.ConfigDict({"disc_mlm_weight": 2.0, "disc_mlm_steps": 4})
    plan = objective.begin_step(cfg, jnp.int32(2), {}, weights)
    assert float(plan.weights["disc_mlm_weight"]) == 1.0


def test_the_gradient_reaches_the_network_through_both_passes():
    """The MLM pass trains the discriminator's encoder: its gradient is not zero when the
    detection loss is weighted 0."""
    batch, corruption = _batch_and_corruption()
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))
    objective = registry.get("electra_mlm")
    table = jax.random.normal(jax.random.PRNGKey(2), (VOCAB, 8))

    def loss(w):
        def mlm(ids, positions, _):
            h = table[ids] @ w  # [B, L, 8]
            at = jnp.take_along_axis(h, positions[..., None], 1)
            return h[..., 0], at @ table.T  # [B, L], [B, N, V]

        def disc(ids, _):
            return (table[ids] @ w)[..., 0]

        gen = lambda ids, pos, _: jnp.zeros(pos.shape + (VOCAB,))
        sums = objective.sums(batch, corruption, core.Networks(gen, disc, mlm), keys)
        return objective.metrics(sums, gen_weight=1.0, disc_weight=0.0, disc_mlm_weight=1.0)["loss"]

    g = jax.grad(loss)(jnp.eye(8))
    assert float(jnp.max(jnp.abs(g))) > 0
