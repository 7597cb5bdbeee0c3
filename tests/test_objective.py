import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import objective
from electra_jax.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID

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


def _mask(rng, ids, mask, mask_prob=0.15):
    slots = objective.num_mask_slots(ids.shape[1], mask_prob)
    return objective.mask_tokens(
        rng, ids, mask, mask_prob=mask_prob, num_slots=slots, mask_id=MASK_ID, special_ids=SPECIAL
    )


def test_slot_count_is_the_originals():
    assert objective.num_mask_slots(128, 0.15) == 19
    assert objective.num_mask_slots(512, 0.15) == 79
    assert objective.num_mask_slots(512, 0.25) == 130


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
    m = objective.mask_tokens(
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
    corrupted, labels = objective.replace_tokens(ids, mask, positions, weights, samples)
    np.testing.assert_array_equal(corrupted, [[CLS_ID, 10, 99, 12, SEP_ID]])
    np.testing.assert_array_equal(labels, [[0, 0, 1, 0, 0]])


def test_losses_against_hand_computed_values():
    logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    targets = jnp.array([[0, 2]])
    weights = jnp.array([[1.0, 1.0]])
    loss, correct = objective.mlm_loss(logits, targets, weights)
    l0 = -np.log(np.exp(2) / (np.exp(2) + 2))
    l1 = -np.log(1 / (np.exp(1) + 2))
    np.testing.assert_allclose(float(loss.total), l0 + l1, rtol=1e-6)
    assert float(loss.count) == 2 and float(correct.total) == 1

    d = jnp.array([[3.0, -1.0, 0.5]])
    labels = jnp.array([[1.0, 0.0, 1.0]])
    mask = jnp.array([[1, 1, 0]])
    rtd = objective.rtd_loss(d, labels, mask)
    expected = np.log1p(np.exp(-3.0)) + np.log1p(np.exp(-1.0))
    np.testing.assert_allclose(float(rtd.total), expected, rtol=1e-6)
    assert float(rtd.count) == 2


def test_total_is_weighted_sum_and_no_gradient_through_samples():
    ids, mask = _examples(b=4, length=32)
    batch = {"input_ids": ids, "segment_ids": jnp.zeros_like(ids), "input_mask": mask}
    vocab = 1000
    gen_w = jnp.ones((vocab,))
    disc_w = jnp.ones(())

    def gen_fn(p, masked_ids, positions, _):
        base = jax.nn.one_hot(jnp.take_along_axis(masked_ids, positions, 1), vocab)
        return base * p  # [B, N, V]

    def disc_fn(p, corrupted, _):
        return (corrupted % 7).astype(jnp.float32) * p - 3.0

    def loss(params, which):
        _, m = objective.electra_forward(
            jax.random.PRNGKey(0),
            batch,
            lambda a, b, c: gen_fn(params["gen"], a, b, c),
            lambda a, c: disc_fn(params["disc"], a, c),
            mask_prob=0.15,
            num_slots=5,
            mask_id=MASK_ID,
            special_ids=SPECIAL,
            gen_weight=1.0,
            disc_weight=50.0,
        )
        return m[which], m

    params = {"gen": gen_w, "disc": disc_w}
    total, m = loss(params, "loss")
    np.testing.assert_allclose(float(total), float(m["gen_loss"] + 50 * m["disc_loss"]), rtol=1e-6)
    # The discriminator's loss depends on the generator only through the sample: zero gradient.
    g = jax.grad(lambda p: loss(p, "disc_loss")[0])(params)
    assert float(jnp.abs(g["gen"]).sum()) == 0.0
    assert float(jnp.abs(g["disc"])) > 0.0


def test_sampling_follows_the_softmax():
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1]]]))
    logits = jnp.broadcast_to(logits, (1, 20000, 3))
    s = np.asarray(objective.sample_replacements(jax.random.PRNGKey(0), logits))
    freq = np.bincount(s.ravel(), minlength=3) / s.size
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.015)
    hot = np.asarray(objective.sample_replacements(jax.random.PRNGKey(0), logits, 0.05))
    assert (hot == 0).mean() > 0.99  # low temperature sharpens towards the mode


def test_inverse_cdf_and_gumbel_samplers_draw_the_same_distribution():
    logits = jax.random.normal(jax.random.PRNGKey(3), (1000,)) * 2.0  # a peaked 1000-way softmax
    probs = np.asarray(jax.nn.softmax(logits))
    rows = jnp.broadcast_to(logits, (1, 60000, 1000))
    for sampler in ("inverse_cdf", "gumbel"):
        s = np.asarray(objective.sample_replacements(jax.random.PRNGKey(1), rows, 1.0, sampler))
        assert s.min() >= 0 and s.max() < 1000
        freq = np.bincount(s.ravel(), minlength=1000) / s.size
        # Total variation distance from the softmax: sampling noise alone gives about 0.05 here.
        assert 0.5 * np.abs(freq - probs).sum() < 0.08, sampler
        top = np.argsort(probs)[-5:]
        np.testing.assert_allclose(freq[top], probs[top], atol=0.01)


def test_inverse_cdf_handles_a_vocabulary_that_is_not_a_square():
    logits = jnp.full((2, 3, 30522), -30.0).at[:, :, 30521].set(10.0)  # all mass on the last id
    s = objective.sample_replacements(jax.random.PRNGKey(0), logits)
    assert s.shape == (2, 3) and bool(jnp.all(s == 30521))
    logits = jnp.full((1, 4, 7), -30.0).at[0, :, 0].set(10.0)  # and on the first
    assert bool(jnp.all(objective.sample_replacements(jax.random.PRNGKey(0), logits) == 0))


@pytest.mark.parametrize("vocab", [7, 16, 30522])
def test_inverse_cdf_picks_the_token_whose_cumulative_mass_passes_u(vocab):
    """The two-level sampler returns, for each uniform u, the first token whose cumulative
    probability exceeds u: a direct inverse CDF (short last block and square vocabularies)."""
    logits = jax.random.normal(jax.random.PRNGKey(1), (4, 50, vocab)) * 3.0
    u = jax.random.uniform(jax.random.PRNGKey(2), (4, 50))
    got = np.asarray(objective._inverse_cdf_sample(u, logits))
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


# --- The paper's ablation objectives and embedding sharing (issue 7) ---------------------------


def test_mlm_masking_is_80_10_10_and_random_tokens_are_never_special():
    ids, mask = _examples(b=256, length=128, seed=2)
    slots = objective.num_mask_slots(128, 0.15)
    p_mask, p_random = objective.corruption_probs("mlm", 0.85)
    assert (p_mask, p_random) == (0.8, 0.1)
    shown_mask = random = kept = predicted = 0
    for k in range(8):
        m = objective.mask_tokens(
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
    loss = objective.rtd_loss_at(logits, labels, positions, weights)
    expected = np.log1p(np.exp(-1.0)) + np.log1p(np.exp(-0.5))  # positions 1 (real), 2 (replaced)
    np.testing.assert_allclose(float(loss.total), expected, rtol=1e-6)
    assert float(loss.count) == 2
    # Logits away from the masked positions do not matter.
    moved = objective.rtd_loss_at(logits.at[0, 3].set(-9.0), labels, positions, weights)
    assert float(moved.total) == float(loss.total)
    # And the loss divides by the masked slots, not the tokens.
    sums = {"gen_loss": jnp.asarray(4.0), "disc_loss": loss.total}
    total = objective.objective_loss(
        "electra_15", sums, (jnp.asarray(2.0), jnp.asarray(4.0)), gen_weight=1.0, disc_weight=50.0
    )
    np.testing.assert_allclose(float(total), 4.0 / 2 + 50 * expected / 2, rtol=1e-6)


def test_all_tokens_mlm_copy_mechanism():
    vocab = 6
    logits = jnp.log(jnp.array([[[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]] * 3]))  # softmax known
    inputs = jnp.array([[2, 3, 4]], jnp.int32)
    targets = jnp.array([[2, 0, 4]], jnp.int32)  # position 1 was replaced (0 -> 3)
    mask = jnp.array([[1, 1, 0]])  # position 2 is padding
    certain = jnp.full((1, 3), 40.0)  # D = 1: copy the input
    loss, _ = objective.copy_mlm_loss(logits, certain, inputs, inputs, jnp.ones((1, 3)))
    assert float(loss.total) < 1e-6 and float(loss.count) == 3  # unchanged tokens cost nothing
    half = jnp.zeros((1, 3))  # D = 1/2
    loss, correct = objective.copy_mlm_loss(logits, half, inputs, targets, mask)
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
                -objective.copy_mlm_loss(
                    logits[:, :1], c[:, :1], inputs[:, :1], jnp.array([[t]]), jnp.ones((1, 1))
                )[0].total
            )
        )
        for t in range(vocab)
    )
    np.testing.assert_allclose(total, 1.0, rtol=1e-5)


def _pattern_batch(cfg, seed=0):
    """Rows of a 7-token cycle at random phases: learnable by every objective."""
    rng = np.random.default_rng(seed)
    b, length = cfg.train.batch_size, cfg.data.seq_length
    phase = rng.integers(0, 7, (b, 1))
    ids = (5 + (phase + np.arange(length)[None]) % 7).astype(np.int32)
    ids[:, 0], ids[:, -1] = 2, 3
    ones = np.ones((b, length), np.int32)
    return {"input_ids": ids, "segment_ids": 0 * ones, "input_mask": ones}


def test_every_objective_and_sharing_mode_trains():
    """Each ablation (and each non-default embedding sharing, paired with one) runs a few steps
    of the micro model with finite, falling loss; 'electra'/'electra' is test_train_step's."""
    from electra_jax import loop, sharding
    from tests.conftest import micro_config

    for name, sharing in [
        ("electra_15", "none"),
        ("mlm", "gdes"),
        ("replaced_mlm", "none"),
        ("all_tokens_mlm", "gdes"),
    ]:
        cfg = micro_config()
        cfg.model.num_layers, cfg.data.seq_length = 1, 16
        cfg.objective.name, cfg.model.embedding_sharing = name, sharing
        cfg.train.learning_rate = 3e-3
        mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
        setup = loop.setup_step(cfg, cfg.data.vocab_size, mesh)
        state = loop.init_on_mesh(setup)
        params = state.params
        assert ("mlm_lm_head_bias" in params) == objective.needs_mlm_head(name)
        assert ("generator_embeddings" in params) == (sharing == "none")
        assert ("embeddings_delta" in params) == (sharing == "gdes")
        batch = sharding.global_batch(_pattern_batch(cfg), mesh)
        losses = []
        for _ in range(6):
            state, m = setup.step_fn(state, batch)
            losses.append(float(m["loss"]))
            assert float(m["nonfinite"]) == 0.0
        assert all(np.isfinite(losses)), (name, losses)
        assert losses[-1] < losses[0] - 0.1, (name, sharing, losses)
        if name != "electra_15":
            assert 0.0 < float(m["mlm_accuracy"]) <= 1.0 and np.isfinite(float(m["mlm_loss"]))


def test_embedding_sharing_modes_and_their_gradients():
    """'gdes': the discriminator's loss gives the generator's tables no gradient (its deltas get
    it); the deltas start at zero, so both networks start from the same embeddings. 'none': the
    networks' tables are separate. 'electra': shared (the discriminator's gradient reaches)."""
    from electra_jax.model import (
        Electra,
        discriminator_embedding_params,
        init_params,
        network_param_counts,
        spec_from_config,
    )
    from tests.conftest import micro_config

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


def test_mlm_loss_gradient_and_probs_match_autodiff_of_log_softmax():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    logits = 3.0 * jax.random.normal(keys[0], (2, 5, 37))
    targets = jax.random.randint(keys[1], (2, 5), 0, 37)
    weights = (jax.random.uniform(keys[2], (2, 5)) > 0.3).astype(jnp.float32)

    def reference(x):
        nll = optax.softmax_cross_entropy_with_integer_labels(x, targets)
        return jnp.sum(nll * weights)

    def ours(x):
        return 2.0 * objective.mlm_loss(x, targets, weights)[0].total

    np.testing.assert_allclose(
        float(objective.mlm_loss(logits, targets, weights)[0].total),
        float(reference(logits)),
        rtol=1e-6,
    )
    np.testing.assert_allclose(jax.grad(ours)(logits), 2.0 * jax.grad(reference)(logits), atol=1e-6)
    probs = objective.mlm_loss_and_probs(logits, targets, weights)[2]
    np.testing.assert_allclose(probs, jax.nn.softmax(logits), atol=1e-7)
    # The sampler draws the same tokens from the shared probabilities as from the logits.
    uniform = jax.random.uniform(keys[2], (2, 5))
    from_logits = objective.sample_replacements(None, logits, uniform=uniform)
    from_probs = objective.sample_replacements(None, logits, uniform=uniform, probs=probs)
    np.testing.assert_array_equal(from_logits, from_probs)


def _adversarial_setup(b=512, n=2, v=5, seed=0):
    """A policy with free logits [n, V] (shared by the rows) and a discriminator whose logit at
    a slot depends only on the token written there, so that the expected reward has a closed
    form: E[R] = sum_t sum_x p_t(x) R_t(x)."""
    length = n + 2
    ids = np.tile(np.arange(length, dtype=np.int32), (b, 1))  # slot t holds token t + 1
    batch = {"input_ids": jnp.asarray(ids), "input_mask": jnp.ones((b, length), jnp.int32)}
    positions = jnp.tile(jnp.arange(1, n + 1, dtype=jnp.int32), (b, 1))
    masked = objective.Masked(
        batch["input_ids"], positions, positions, jnp.ones((b, n), jnp.float32)
    )
    uniform = jax.random.uniform(jax.random.PRNGKey(seed), (b, n))
    corruption = objective.Corruption(masked, uniform)
    score = jnp.linspace(-2.0, 2.0, v)  # the discriminator's logit for each token

    def discriminator_fn(corrupted, key):
        return score[jnp.clip(corrupted, 0, v - 1)]

    def policy_fn_of(logits, baseline_logits):
        return lambda ids, positions, key: (
            jnp.broadcast_to(logits, (b, n, v)),
            jnp.broadcast_to(baseline_logits, (b, n)),
        )

    return batch, corruption, discriminator_fn, policy_fn_of, score


def test_adversarial_reward_is_the_discriminators_loss_and_reinforce_is_unbiased():
    b, n, v = 4096, 2, 5
    batch, corruption, disc_fn, policy_fn_of, score = _adversarial_setup(b, n, v)
    logits = jnp.array([[0.5, -0.3, 0.2, 0.0, 1.0], [0.0, 0.4, -1.0, 0.3, 0.1]])
    baseline_logits = jnp.array([0.3, -0.2])
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))

    def sums(lg, bl):
        return objective.adversarial_sums(batch, corruption, policy_fn_of(lg, bl), disc_fn, keys)

    s = sums(logits, baseline_logits)
    # The reward at slot t is the discriminator's cross-entropy there: -log sigmoid(score) for a
    # replaced token, -log sigmoid(-score) for the original (slot t's original is token t + 1).
    p = jax.nn.softmax(logits, axis=-1)
    replaced_loss = -jax.nn.log_sigmoid(score)  # [V]
    original_loss = -jax.nn.log_sigmoid(-score)
    expected_r = []
    for t in range(n):
        r = replaced_loss.at[t + 1].set(original_loss[t + 1])
        expected_r.append(r)
    expected_r = jnp.stack(expected_r)  # [n, V]
    exact_mean_reward = float(jnp.sum(p * expected_r) / n)
    assert float(s["reward"]) / (b * n) == pytest.approx(exact_mean_reward, rel=0.03)

    # The REINFORCE surrogate's gradient (over many rows) estimates the gradient of the exact
    # expected reward; gradient descent on policy_loss ascends the reward.
    exact = jax.grad(lambda lg: jnp.sum(jax.nn.softmax(lg, -1) * expected_r))(logits)
    estimate = jax.grad(lambda lg: -sums(lg, baseline_logits)["policy_loss"] / b)(logits)
    np.testing.assert_allclose(estimate, exact, atol=0.03)
    assert float(jnp.max(jnp.abs(exact))) > 0.1  # a gradient worth estimating

    # The baseline (b = -log sigmoid(u)) is pulled towards the reward: its cross-entropy is
    # least where sigmoid(u) = E[exp(-R)], and the policy's gradient does not reach it.
    def baseline_loss(bl):
        return sums(logits, bl)["baseline_loss"] / b

    target = jnp.sum(p * jnp.exp(-expected_r), axis=-1)  # E[exp(-R)] per slot
    best = jnp.log(target / (1 - target))
    grad_at_best = jax.grad(baseline_loss)(best)
    np.testing.assert_allclose(grad_at_best, 0.0, atol=0.02)
    assert float(jnp.abs(jax.grad(baseline_loss)(best + 1.0)).min()) > 0.1
    np.testing.assert_array_equal(
        jax.grad(lambda bl: sums(logits, bl)["policy_loss"])(baseline_logits) != 0,
        [False, False],
    )


def test_adversarial_loss_switches_from_maximum_likelihood_to_the_policy_gradient():
    sums = {
        "gen_loss": jnp.float32(6.0),
        "policy_loss": jnp.float32(-2.0),
        "baseline_loss": jnp.float32(1.0),
        "disc_loss": jnp.float32(3.0),
    }
    denominators = (jnp.float32(2.0), jnp.float32(10.0))
    kw = {"gen_weight": 1.0, "disc_weight": 50.0}
    warm = objective.objective_loss("adversarial", sums, denominators, adversarial=0.0, **kw)
    adv = objective.objective_loss("adversarial", sums, denominators, adversarial=1.0, **kw)
    np.testing.assert_allclose(warm, (6.0 + 1.0) / 2 + 50 * 3.0 / 10)
    np.testing.assert_allclose(adv, (-2.0 + 1.0) / 2 + 50 * 3.0 / 10)
