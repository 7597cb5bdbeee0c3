"""Tests of objectives/core.py: masking, sampling, replacing, the MLM and RTD losses."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electra_jax.objectives import core

SPECIAL = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)


def _examples(b=64, length=128, seed=0):
    """[CLS] A [SEP] B [SEP] rows with padding of varying length."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 1000, (b, length)).astype(np.int32)
    mask = np.ones((b, length), np.int32)
    for i in range(b):
        n = rng.integers(20, length + 1)
        ids[i, 0], ids[i, n // 2], ids[i, n - 1] = CLS_ID, SEP_ID, SEP_ID
        ids[i, n:], mask[i, n:] = PAD_ID, 0
    return jnp.asarray(ids), jnp.asarray(mask)


def batch_and_corruption(objective, b=4, length=32, vocab=1000):
    """A batch of `_examples` and its corruption by `objective` (a registered `Objective`):
    15% of the tokens in 5 slots, 85% of them shown as [MASK]."""
    ids, mask = _examples(b=b, length=length)
    batch = {"input_ids": ids, "segment_ids": jnp.zeros_like(ids), "input_mask": mask}
    corruption = objective.corrupt(
        jax.random.PRNGKey(0),
        batch,
        mask_prob=0.15,
        num_slots=5,
        mask_id=MASK_ID,
        special_ids=SPECIAL,
        mask_token_prob=0.85,
        vocab_size=vocab,
    )
    return batch, corruption


def _mask(rng, ids, mask, mask_prob=0.15):
    slots = core.num_mask_slots(ids.shape[1], mask_prob)
    return core.mask_tokens(
        rng, ids, mask, mask_prob=mask_prob, num_slots=slots, mask_id=MASK_ID, special_ids=SPECIAL
    )


def test_slot_count_is_the_originals():
    assert core.num_mask_slots(128, 0.15) == 19
    assert core.num_mask_slots(512, 0.15) == 79
    assert core.num_mask_slots(512, 0.25) == 130


def test_masking_counts_positions_and_never_special():
    ids, mask = _examples()
    m = _mask(jax.random.PRNGKey(0), ids, mask)
    ids, mask = np.asarray(ids), np.asarray(mask)
    pos, w = np.asarray(m.positions), np.asarray(m.weights)
    for i in range(ids.shape[0]):
        used = pos[i][w[i] > 0]
        n_real = mask[i].sum()
        assert len(used) == max(1, min(19, int(np.round(n_real * 0.15))))
        assert len(set(used.tolist())) == len(used)  # distinct
        assert np.all(mask[i, used] == 1)
        assert not np.isin(ids[i, used], SPECIAL).any()
        np.testing.assert_array_equal(np.asarray(m.targets)[i][w[i] > 0], ids[i, used])
    # Only chosen positions change, and only to [MASK].
    changed = np.asarray(m.input_ids) != ids
    assert np.all(np.asarray(m.input_ids)[changed] == MASK_ID)
    for i in range(ids.shape[0]):
        assert set(np.nonzero(changed[i])[0]) <= set(pos[i][w[i] > 0].tolist())


def test_mask_rate_and_85_15_split_over_many_draws():
    ids, mask = _examples(b=256, length=128, seed=1)
    masked = kept = predicted = 0
    for k in range(8):
        m = _mask(jax.random.PRNGKey(k), ids, mask)
        w = np.asarray(m.weights) > 0
        at = np.take_along_axis(np.asarray(m.input_ids), np.asarray(m.positions), 1)
        masked += int((at[w] == MASK_ID).sum())
        kept += int((at[w] == np.asarray(m.targets)[w]).sum())
        predicted += int(w.sum())
    assert masked + kept == predicted  # no random replacement
    assert abs(masked / predicted - 0.85) < 0.01
    real = int(np.asarray(mask).sum()) * 8
    assert abs(predicted / real - 0.15) < 0.01


def test_short_example_predicts_at_least_one_and_never_more_than_candidates():
    ids = jnp.array([[CLS_ID, 9, SEP_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]], jnp.int32)
    mask = (ids != PAD_ID).astype(jnp.int32)
    m = core.mask_tokens(
        jax.random.PRNGKey(0),
        ids,
        mask,
        mask_prob=0.5,
        num_slots=4,
        mask_id=MASK_ID,
        special_ids=SPECIAL,
    )
    w = np.asarray(m.weights)
    assert w.sum() == 1 and int(np.asarray(m.positions)[0][w[0] > 0][0]) == 1


def test_a_sample_equal_to_the_original_is_labelled_real():
    ids = jnp.array([[CLS_ID, 10, 11, 12, SEP_ID]], jnp.int32)
    mask = jnp.ones_like(ids)
    positions = jnp.array([[1, 2, 3]], jnp.int32)
    weights = jnp.array([[1.0, 1.0, 0.0]])
    samples = jnp.array([[10, 99, 77]], jnp.int32)  # same, different, unused slot
    corrupted, labels = core.replace_tokens(ids, mask, positions, weights, samples)
    np.testing.assert_array_equal(corrupted, [[CLS_ID, 10, 99, 12, SEP_ID]])
    np.testing.assert_array_equal(labels, [[0, 0, 1, 0, 0]])


def test_losses_against_hand_computed_values():
    logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    targets = jnp.array([[0, 2]])
    weights = jnp.array([[1.0, 1.0]])
    loss, correct = core.mlm_loss(logits, targets, weights)
    l0 = -np.log(np.exp(2) / (np.exp(2) + 2))
    l1 = -np.log(1 / (np.exp(1) + 2))
    np.testing.assert_allclose(float(loss.total), l0 + l1, rtol=1e-6)
    assert float(loss.count) == 2 and float(correct.total) == 1

    d = jnp.array([[3.0, -1.0, 0.5]])
    labels = jnp.array([[1.0, 0.0, 1.0]])
    mask = jnp.array([[1, 1, 0]])
    rtd = core.rtd_loss(d, labels, mask)
    expected = np.log1p(np.exp(-3.0)) + np.log1p(np.exp(-1.0))
    np.testing.assert_allclose(float(rtd.total), expected, rtol=1e-6)
    assert float(rtd.count) == 2


def test_sampling_follows_the_softmax():
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1]]]))
    logits = jnp.broadcast_to(logits, (1, 20000, 3))
    s = np.asarray(core.sample_replacements(jax.random.PRNGKey(0), logits))
    freq = np.bincount(s.ravel(), minlength=3) / s.size
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.015)
    hot = np.asarray(core.sample_replacements(jax.random.PRNGKey(0), logits, 0.05))
    assert (hot == 0).mean() > 0.99  # low temperature sharpens towards the mode


def test_inverse_cdf_and_gumbel_samplers_draw_the_same_distribution():
    logits = jax.random.normal(jax.random.PRNGKey(3), (250,)) * 2.0  # a peaked 250-way softmax
    probs = np.asarray(jax.nn.softmax(logits))
    rows = jnp.broadcast_to(logits, (1, 20000, 250))
    for sampler in ("inverse_cdf", "gumbel"):
        s = np.asarray(core.sample_replacements(jax.random.PRNGKey(1), rows, 1.0, sampler))
        assert s.min() >= 0 and s.max() < 250
        freq = np.bincount(s.ravel(), minlength=250) / s.size
        # Total variation distance from the softmax: sampling noise alone gives about 0.03 here.
        assert 0.5 * np.abs(freq - probs).sum() < 0.08, sampler
        top = np.argsort(probs)[-5:]
        np.testing.assert_allclose(freq[top], probs[top], atol=0.01)


def test_inverse_cdf_handles_a_vocabulary_that_is_not_a_square():
    logits = jnp.full((2, 3, 30522), -30.0).at[:, :, 30521].set(10.0)  # all mass on the last id
    s = core.sample_replacements(jax.random.PRNGKey(0), logits)
    assert s.shape == (2, 3) and bool(jnp.all(s == 30521))
    logits = jnp.full((1, 4, 7), -30.0).at[0, :, 0].set(10.0)  # and on the first
    assert bool(jnp.all(core.sample_replacements(jax.random.PRNGKey(0), logits) == 0))


@pytest.mark.parametrize("vocab", [7, 16, 30522])
def test_inverse_cdf_picks_the_token_whose_cumulative_mass_passes_u(vocab):
    """The two-level sampler returns, for each uniform u, the first token whose cumulative
    probability exceeds u: a direct inverse CDF (short last block and square vocabularies)."""
    logits = jax.random.normal(jax.random.PRNGKey(1), (4, 50, vocab)) * 3.0
    u = jax.random.uniform(jax.random.PRNGKey(2), (4, 50))
    got = np.asarray(core._inverse_cdf_sample(u, logits))
    cdf = np.cumsum(np.asarray(jax.nn.softmax(logits, axis=-1), np.float64), axis=-1)
    want = np.array(
        [
            np.searchsorted(c, x * c[-1], side="right")
            for c, x in zip(cdf.reshape(-1, vocab), np.asarray(u, np.float64).ravel(), strict=True)
        ]
    )
    want = np.minimum(want, vocab - 1).reshape(got.shape)
    # float32 block sums can move a draw that lands within rounding of a boundary by one token
    assert np.mean(got == want) > 0.98 and np.all(np.abs(got - want) <= 1)


def test_mlm_loss_gradient_and_probs_match_autodiff_of_log_softmax():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    logits = 3.0 * jax.random.normal(keys[0], (2, 5, 37))
    targets = jax.random.randint(keys[1], (2, 5), 0, 37)
    weights = (jax.random.uniform(keys[2], (2, 5)) > 0.3).astype(jnp.float32)

    def reference(x):
        nll = optax.softmax_cross_entropy_with_integer_labels(x, targets)
        return jnp.sum(nll * weights)

    def ours(x):
        return 2.0 * core.mlm_loss(x, targets, weights)[0].total

    np.testing.assert_allclose(
        float(core.mlm_loss(logits, targets, weights)[0].total),
        float(reference(logits)),
        rtol=1e-6,
    )
    np.testing.assert_allclose(jax.grad(ours)(logits), 2.0 * jax.grad(reference)(logits), atol=1e-6)
    probs = core.mlm_loss_and_probs(logits, targets, weights)[2]
    np.testing.assert_allclose(probs, jax.nn.softmax(logits), atol=1e-7)
    # The sampler draws the same tokens from the shared probabilities as from the logits.
    uniform = jax.random.uniform(keys[2], (2, 5))
    from_logits = core.sample_replacements(None, logits, uniform=uniform)
    from_probs = core.sample_replacements(None, logits, uniform=uniform, probs=probs)
    np.testing.assert_array_equal(from_logits, from_probs)


def test_schedule_value_is_the_end_when_off_and_linear_when_on():
    assert core.schedule_value(1.0, 3.0, 0, jnp.int32(5)) == 1.0  # off: a Python float
    values = [float(core.schedule_value(1.0, 3.0, 10, jnp.int32(s))) for s in (0, 5, 10, 20)]
    assert values == [3.0, 2.0, 1.0, 1.0]
    fade = [float(core.schedule_value(0.0, 2.0, 4, jnp.int32(s))) for s in (0, 1, 4, 9)]
    assert fade == [2.0, 1.5, 0.0, 0.0]


def test_unigram_draws_follow_the_distribution_and_the_floor_takes_its_share():
    """unigram_draws: inverse CDF over a unigram distribution; with_unigram_floor: each slot
    takes the unigram draw with probability `share`, and generate() writes those instead of the
    generator's sample (the generator's loss is unchanged: it still learns from every slot)."""
    shares = np.array([0.0, 0.5, 0.3, 0.0, 0.2], np.float32)  # pieces 1, 2, 4
    cdf = jnp.asarray(np.cumsum(shares))
    u = jax.random.uniform(jax.random.PRNGKey(0), (40000,))
    drawn = np.asarray(core.unigram_draws(u, cdf, 5))
    np.testing.assert_allclose(np.bincount(drawn, minlength=5) / drawn.size, shares, atol=0.01)

    ids, mask = _examples(b=16, length=64)
    batch = {"input_ids": ids, "segment_ids": jnp.zeros_like(ids), "input_mask": mask}
    corruption = core.corrupt(
        jax.random.PRNGKey(1),
        batch,
        mask_prob=0.15,
        num_slots=core.num_mask_slots(64, 0.15),
        mask_id=MASK_ID,
        special_ids=SPECIAL,
    )
    vocab = 1000
    only_7 = jnp.zeros((vocab,)).at[7:].set(1.0)  # all the mass on piece 7
    generator = lambda masked, positions, key: (
        jnp.zeros((*positions.shape, vocab)).at[..., 9].set(30.0)
    )  # always piece 9
    keys = (jax.random.PRNGKey(2), jax.random.PRNGKey(3))

    def written(share):
        c = core.with_unigram_floor(corruption, jax.random.PRNGKey(4), only_7, share, vocab)
        sums, corrupted, labels = core.generate(batch, c, generator, *keys, 1.0, "inverse_cdf")
        m = c.masked
        slots = np.asarray(m.weights) > 0
        return np.asarray(jnp.take_along_axis(corrupted, m.positions, axis=1))[slots], sums

    at_0, plain = written(0.0)
    at_1, floored = written(1.0)
    half, _ = written(0.5)
    assert set(at_0) == {9} and set(at_1) == {7}
    assert 0.4 < (half == 7).mean() < 0.6 and set(half) == {7, 9}
    assert float(plain["gen_loss"]) == float(floored["gen_loss"])
