"""Tests of electra_jax.pretraining.eval_pass (the held-out readings) and train_step.eval_step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.objectives import registry
from electra_jax.pretraining import eval_pass, program
from electra_jax.pretraining.optimizer_step import eval_step, init_state
from tests.conftest import micro_config


def _pairwise_auc(scores, labels, weights):
    """The AUC by its definition: over every (positive, negative) pair, 1 if the positive
    scores higher, 1/2 on a tie."""
    used = weights > 0
    pos, neg = scores[used & (labels > 0.5)], scores[used & (labels <= 0.5)]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_equals_the_pairwise_definition_with_ties_and_weights(seed):
    rng = np.random.default_rng(seed)
    labels = (rng.random((6, 40)) < 0.2).astype(np.float32)
    # Few distinct values, so that ties are many; positives drawn a little higher.
    scores = np.round(rng.normal(size=(6, 40)) + labels * 0.7, 1).astype(np.float32)
    weights = (rng.random((6, 40)) < 0.8).astype(np.float32)
    got = float(jax.jit(eval_pass.roc_auc)(scores, labels, weights))
    assert got == pytest.approx(_pairwise_auc(scores, labels, weights), abs=1e-6)


def test_roc_auc_bounds_and_undefined():
    labels = np.array([0, 0, 1, 1], np.float32)
    ones = np.ones(4, np.float32)
    assert float(eval_pass.roc_auc(np.array([0.1, 0.2, 0.3, 0.4]), labels, ones)) == 1.0
    assert float(eval_pass.roc_auc(np.array([0.4, 0.3, 0.2, 0.1]), labels, ones)) == 0.0
    assert float(eval_pass.roc_auc(np.zeros(4), labels, ones)) == 0.5
    assert np.isnan(float(eval_pass.roc_auc(np.zeros(4), np.zeros(4), ones)))


def test_cosine_sums_equal_the_mean_over_pairs_of_different_tokens():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 5, 8)).astype(np.float32) + 0.5
    w = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 1, 1]], np.float32)
    total, pairs = eval_pass.cosine_sums(h, w)
    vecs = h.reshape(-1, 8)[w.ravel() > 0]
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    cos = unit @ unit.T
    n = len(vecs)
    assert float(pairs) == n * (n - 1)
    assert float(total) / float(pairs) == pytest.approx((cos.sum() - n) / (n * (n - 1)), abs=1e-5)
    # States that all point one way read 1.
    same = np.ones((1, 4, 8), np.float32)
    t, p = eval_pass.cosine_sums(same, np.ones((1, 4), np.float32))
    assert float(t) / float(p) == pytest.approx(1.0, abs=1e-6)


def test_binary_entropy():
    p = np.array([0.0, 0.5, 1.0, 0.15], np.float32)
    want = [0.0, np.log(2), 0.0, -(0.15 * np.log(0.15) + 0.85 * np.log(0.85))]
    np.testing.assert_allclose(eval_pass.binary_entropy(p), want, atol=1e-6)


def _batches(cfg, count=2, seed=0):
    rng = np.random.default_rng(seed)
    b, length = cfg.train.batch_size, cfg.data.seq_length
    ids = rng.integers(5, cfg.data.vocab_size, (count, b, length)).astype(np.int32)
    ids[:, :, 0], ids[:, :, -1] = 2, 3
    mask = np.ones_like(ids)
    mask[:, 0, -6:] = 0  # some padding
    ids[mask == 0] = 0
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask}


@pytest.mark.parametrize("name", ["electra", "mlm"])
def test_eval_step_is_deterministic_and_reads_what_the_objective_has(name):
    cfg = micro_config()
    cfg.objective.name = name
    _, model, tx, _, slots = program.build(cfg, cfg.data.vocab_size)
    params = init_state(model, tx, 0).params
    frequent = jnp.zeros((cfg.data.vocab_size,), bool).at[5:100].set(True)
    ev = jax.jit(
        functools.partial(eval_step, model=model, objective_cfg=cfg.objective, num_slots=slots)
    )
    batches = _batches(cfg)
    unigram = jnp.linspace(0.0, 1.0, cfg.data.vocab_size).at[:5].set(0.0)
    a = jax.device_get(ev(params, batches, frequent, unigram))
    b = jax.device_get(ev(params, batches, frequent, unigram))
    assert a == b
    assert 0.0 < a["collapse_cosine"] < 1.0
    without = jax.device_get(ev(params, batches, frequent))
    assert not set(eval_pass.UNIGRAM_KEYS) & set(without)
    assert {k: v for k, v in a.items() if k not in eval_pass.UNIGRAM_KEYS} == without
    rtd_keys = set(eval_pass.DISC_KEYS + eval_pass.GEN_KEYS + eval_pass.UNIGRAM_KEYS)
    if name == "electra":
        assert rtd_keys <= set(a)
        assert 0.0 < a["disc_auc_unigram"] < 1.0
        assert 0.0 < a["disc_auc"] < 1.0 and 0.0 < a["disc_auc_frequent"] < 1.0
        assert a["disc_prior_entropy"] == pytest.approx(
            float(eval_pass.binary_entropy(a["replaced_fraction"])), abs=1e-6
        )
        assert 0.0 < a["replaced_fraction"] < 0.2
        assert "mlm_loss" not in a
    else:  # no generator, no replaced-token head: the MLM head's readings
        assert not rtd_keys & set(a)
        assert a["mlm_loss"] == pytest.approx(np.log(cfg.data.vocab_size), rel=0.1)


def _corruption_kwargs(vocab: int, mask_token_prob: float) -> dict:
    """evaluate_batches' corruption settings for the hand-made networks: 15% in 5 slots."""
    return dict(
        mask_prob=0.15,
        num_slots=5,
        mask_id=4,
        special_ids=(0, 2, 3, 4),
        mask_token_prob=mask_token_prob,
        vocab_size=vocab,
    )


def test_the_readings_follow_the_networks_they_are_given():
    """Hand-made networks through evaluate_batches: a generator that always writes token 7 and a
    discriminator whose logit is +5 exactly on token 7 read AUC 1, precision and recall 1 and
    sampled accuracy 0; one that reads token 7 as -5 reads AUC 0. Over the frequent pieces (7
    and the ids below 60), the frequent AUC is 1 too, and the frequent fraction counts them."""
    cfg = micro_config()
    vocab, target = cfg.data.vocab_size, 7
    batches = _batches(cfg)
    batches["input_ids"] = np.where(batches["input_ids"] == target, 8, batches["input_ids"])
    hidden = 4

    def networks_of(sign):
        def of(batch):
            def generator(ids, positions):
                logits = jnp.full((*positions.shape, vocab), -30.0)
                return logits.at[..., target].set(30.0)

            def discriminator(ids):
                states = jax.nn.one_hot(ids % hidden, hidden) + 0.1
                return states, sign * jnp.where(ids == target, 5.0, -5.0)

            return {"generator": generator, "discriminator": discriminator}

        return of

    frequent = jnp.zeros((vocab,), bool).at[:60].set(True).at[target].set(True)
    kwargs = dict(objective=registry.get("electra"), **_corruption_kwargs(vocab, 0.85))
    good = jax.device_get(eval_pass.evaluate_batches(batches, frequent, networks_of(1.0), **kwargs))
    assert good["disc_auc"] == 1.0 and good["disc_auc_frequent"] == 1.0
    assert good["disc_precision"] == 1.0 and good["disc_recall"] == 1.0
    assert good["disc_accuracy"] == 1.0 and good["gen_sampled_accuracy"] == 0.0
    assert good["gen_accuracy"] == 0.0 and good["gen_loss"] == pytest.approx(60.0, rel=1e-3)
    assert good["disc_loss_gain"] > 0.9
    real = batches["input_mask"].sum()
    assert good["replaced_fraction"] * real == pytest.approx(
        (batches["input_mask"].sum(axis=-1) * 0.15).round().clip(1, 5).sum(), abs=0.5
    )
    seen_frequent = good["frequent_fraction"]
    assert good["replaced_fraction"] < seen_frequent < 1.0
    bad = jax.device_get(eval_pass.evaluate_batches(batches, frequent, networks_of(-1.0), **kwargs))
    assert bad["disc_auc"] == 0.0 and bad["disc_recall"] == 0.0
    # Replacements from a unigram distribution: all its mass on piece 7, which the good
    # discriminator spots, or on piece 9, which it reads as every other: AUC 1, then 1/2.
    on = lambda piece: jnp.zeros((vocab,)).at[piece:].set(1.0)
    for piece, auc in ((target, 1.0), (9, 0.5)):
        got = eval_pass.evaluate_batches(batches, frequent, networks_of(1.0), on(piece), **kwargs)
        assert float(got["disc_auc_unigram"]) == auc, piece
        assert float(got["disc_auc"]) == 1.0  # the generator's corruption reads as before
    assert bad["collapse_cosine"] == good["collapse_cosine"]  # the clean text's states


def test_the_mlm_reading_reads_the_masked_ids_where_the_objective_predicts_from_them():
    """A generator that writes token 7 in every slot, and an MLM head that copies the token it
    sees at a slot: over the masked ids it is right exactly where a slot kept its token (half
    of them at mask_token_prob 0.5), over the corrupted text never ('replaced_mlm' reads that)."""
    cfg = micro_config()
    vocab, target = cfg.data.vocab_size, 7
    batches = _batches(cfg)
    batches["input_ids"] = np.where(batches["input_ids"] == target, 8, batches["input_ids"])

    def networks_of(batch):
        def generator(ids, positions):
            return jnp.full((*positions.shape, vocab), -30.0).at[..., target].set(30.0)

        def discriminator(ids):
            return jax.nn.one_hot(ids % 4, 4) + 0.1, jnp.where(ids == target, 5.0, -5.0)

        def mlm(ids, positions):
            seen = jnp.take_along_axis(ids, positions, axis=1)
            return jnp.zeros(ids.shape), 30.0 * jax.nn.one_hot(seen, vocab)

        return {"generator": generator, "discriminator": discriminator, "mlm": mlm}

    frequent = jnp.zeros((vocab,), bool)
    kwargs = _corruption_kwargs(vocab, 0.5)
    read = {
        name: jax.device_get(
            eval_pass.evaluate_batches(
                batches, frequent, networks_of, objective=registry.get(name), **kwargs
            )
        )
        for name in ("electra_mlm", "replaced_mlm", "electra")
    }
    assert 0.2 < read["electra_mlm"]["mlm_accuracy"] < 0.8
    assert read["replaced_mlm"]["mlm_accuracy"] == 0.0
    assert "mlm_accuracy" not in read["electra"]  # its head, if any, is not read
    assert read["electra_mlm"]["disc_auc"] == 1.0  # and detection reads as 'electra''s
