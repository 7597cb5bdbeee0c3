"""Tests of objectives/ablations.py and objectives/mlm.py: the paper's ablation objectives."""

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax.data.tokenizer import MASK_ID
from electra_jax.objectives import ablations, core, mlm
from tests.objectives.test_core import SPECIAL, _examples


def test_mlm_masking_is_80_10_10_and_random_tokens_are_never_special():
    ids, mask = _examples(b=256, length=128, seed=2)
    slots = core.num_mask_slots(128, 0.15)
    p_mask, p_random = mlm.MLM.corruption_probs(0.85)
    assert (p_mask, p_random) == (0.8, 0.1)
    shown_mask = random = kept = predicted = 0
    for k in range(8):
        m = core.mask_tokens(
            jax.random.PRNGKey(k),
            ids,
            mask,
            mask_prob=0.15,
            num_slots=slots,
            mask_id=MASK_ID,
            special_ids=SPECIAL,
            mask_token_prob=p_mask,
            random_token_prob=p_random,
            vocab_size=1000,
        )
        w = np.asarray(m.weights) > 0
        at = np.take_along_axis(np.asarray(m.input_ids), np.asarray(m.positions), 1)[w]
        targets = np.asarray(m.targets)[w]
        shown_mask += int((at == MASK_ID).sum())
        kept += int((at == targets).sum())
        changed = (at != MASK_ID) & (at != targets)
        random += int(changed.sum())
        assert not np.isin(at[changed], SPECIAL).any() and at.max() < 1000
        # Nothing outside the chosen slots changes.
        outside = np.asarray(m.input_ids) != np.asarray(ids)
        for i in range(ids.shape[0]):
            chosen = set(np.asarray(m.positions)[i][np.asarray(m.weights)[i] > 0].tolist())
            assert set(np.nonzero(outside[i])[0]) <= chosen
        predicted += int(w.sum())
    assert shown_mask + random + kept == predicted
    # A random draw equals the original 1 time in 996: it counts as kept.
    np.testing.assert_allclose(
        [shown_mask / predicted, random / predicted, kept / predicted], [0.8, 0.1, 0.1], atol=0.01
    )


def test_electra_15_counts_only_masked_positions():
    logits = jnp.array([[2.0, -1.0, 0.5, 3.0]])
    labels = jnp.array([[1.0, 0.0, 1.0, 0.0]])
    positions = jnp.array([[1, 2, 0]], jnp.int32)
    weights = jnp.array([[1.0, 1.0, 0.0]])  # slot 3 unused
    loss = ablations.rtd_loss_at(logits, labels, positions, weights)
    expected = np.log1p(np.exp(-1.0)) + np.log1p(np.exp(-0.5))  # positions 1 (real), 2 (replaced)
    np.testing.assert_allclose(float(loss.total), expected, rtol=1e-6)
    assert float(loss.count) == 2
    # Logits away from the masked positions do not matter.
    moved = ablations.rtd_loss_at(logits.at[0, 3].set(-9.0), labels, positions, weights)
    assert float(moved.total) == float(loss.total)
    # And the loss divides by the masked slots, not the tokens.
    sums = {"gen_loss": jnp.asarray(4.0), "disc_loss": loss.total}
    total = ablations.ELECTRA_15.loss(
        sums, (jnp.asarray(2.0), jnp.asarray(4.0)), gen_weight=1.0, disc_weight=50.0
    )
    np.testing.assert_allclose(float(total), 4.0 / 2 + 50 * expected / 2, rtol=1e-6)


def test_all_tokens_mlm_copy_mechanism():
    vocab = 6
    logits = jnp.log(jnp.array([[[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]] * 3]))  # softmax known
    inputs = jnp.array([[2, 3, 4]], jnp.int32)
    targets = jnp.array([[2, 0, 4]], jnp.int32)  # position 1 was replaced (0 -> 3)
    mask = jnp.array([[1, 1, 0]])  # position 2 is padding
    certain = jnp.full((1, 3), 40.0)  # D = 1: copy the input
    loss, _ = ablations.copy_mlm_loss(logits, certain, inputs, inputs, jnp.ones((1, 3)))
    assert float(loss.total) < 1e-6 and float(loss.count) == 3  # unchanged tokens cost nothing
    half = jnp.zeros((1, 3))  # D = 1/2
    loss, correct = ablations.copy_mlm_loss(logits, half, inputs, targets, mask)
    expected = -np.log(0.5 + 0.5 * 0.1) - np.log(0.5 * 0.5)
    np.testing.assert_allclose(float(loss.total), expected, rtol=1e-6)
    assert float(loss.count) == 2
    # p(input) = 0.55 beats p(0) = 0.25 at position 0 (right), loses to it at 1 (wrong).
    assert float(correct.total) == 1
    # The probabilities over the vocabulary sum to one.
    c = jnp.array([[1.3, -0.7, 0.2]])
    total = sum(
        float(
            jnp.exp(
                -ablations.copy_mlm_loss(
                    logits[:, :1], c[:, :1], inputs[:, :1], jnp.array([[t]]), jnp.ones((1, 1))
                )[0].total
            )
        )
        for t in range(vocab)
    )
    np.testing.assert_allclose(total, 1.0, rtol=1e-5)
