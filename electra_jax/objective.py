"""Replaced token detection, as pure functions on arrays.

Shapes: B batch, L sequence length, N mask slots per example, V vocabulary.
Everything here runs inside the compiled train step; nothing touches the host.
Losses return a `LossSum` (sum and denominator) so that averaging over devices and over
accumulated micro-batches stays exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax import validate


class LossSum(NamedTuple):
    total: jax.Array  # sum of the per-position losses
    count: jax.Array  # how many positions contributed

    def mean(self):
        return self.total / jnp.maximum(self.count, 1.0)


class Masked(NamedTuple):
    input_ids: jax.Array  # [B, L] the generator's input, with [MASK] at 85% of the chosen slots
    positions: jax.Array  # [B, N] int32 chosen positions, distinct within an example
    targets: jax.Array  # [B, N] int32 original tokens at those positions
    weights: jax.Array  # [B, N] float32 1 for a real prediction, 0 for an unused slot


def num_mask_slots(seq_length: int, mask_prob: float) -> int:
    """The original's max_predictions_per_seq: N = int((mask_prob + 0.005) x L)."""
    return max(1, int((mask_prob + 0.005) * seq_length))


def mask_tokens(
    rng,
    input_ids,
    input_mask,
    *,
    mask_prob: float,
    num_slots: int,
    mask_id: int,
    special_ids: tuple[int, ...],
    mask_token_prob: float = 0.85,
    random_token_prob: float = 0.0,
    vocab_size: int = 0,
) -> Masked:
    """Chooses positions to predict and writes [MASK] into most of them.

    Per example, max(1, min(N, round(n_real x mask_prob))) distinct positions are drawn uniformly
    from the real tokens that are not special ([CLS], [SEP], [MASK], [PAD]). Of those, a fraction
    `mask_token_prob` becomes [MASK] and the rest keep their token; by default none becomes a
    random token (ELECTRA drops BERT's 10% random replacement, since the generator supplies
    replacements). BERT's MLM sets random_token_prob 0.1 (and mask_token_prob 0.8): that share
    of the chosen slots gets a token drawn uniformly from the `vocab_size` - len(special_ids)
    non-special ids.

    input_ids, input_mask: [B, L] int. Returns a `Masked` with [B, L] and [B, N] arrays.
    """
    _, length = input_ids.shape
    k_pos, k_mask = jax.random.split(rng)
    is_special = jnp.isin(input_ids, jnp.asarray(special_ids, input_ids.dtype))
    candidate = (input_mask > 0) & ~is_special
    n_real = jnp.sum(input_mask > 0, axis=-1).astype(jnp.float32)
    # jnp.round rounds half to even, as tf.round did in the original.
    n_predict = jnp.clip(jnp.round(n_real * mask_prob), 1, num_slots).astype(jnp.int32)

    # Top-k of uniform noise over the candidates is a uniform draw without replacement.
    noise = jax.random.uniform(k_pos, input_ids.shape)
    scores = jnp.where(candidate, noise, -1.0)
    top, positions = jax.lax.top_k(scores, num_slots)
    used = (jnp.arange(num_slots)[None, :] < n_predict[:, None]) & (top >= 0.0)
    weights = used.astype(jnp.float32)

    one_hot = positions[:, :, None] == jnp.arange(length)[None, None, :]  # [B, N, L]
    targets = jnp.take_along_axis(input_ids, positions, axis=1)
    if random_token_prob > 0:
        # jax.random.bernoulli(k, p) is uniform(k) < p, so one uniform per slot splits it three
        # ways: [MASK] below mask_token_prob, a random token in the next random_token_prob.
        u = jax.random.uniform(k_mask, used.shape)
        to_mask = used & (u < mask_token_prob)
        to_random = used & (u >= mask_token_prob) & (u < mask_token_prob + random_token_prob)
        specials = sorted(set(special_ids))
        r = jax.random.randint(
            jax.random.fold_in(k_mask, 1), used.shape, 0, vocab_size - len(specials)
        )
        for sid in specials:  # the r-th non-special id: step over each special id at or below
            r = r + (r >= sid).astype(r.dtype)
        written = jnp.where(to_mask, mask_id, jnp.where(to_random, r, targets))
        hit = jnp.any(one_hot & used[:, :, None], axis=1)
        value = jnp.sum(jnp.where(one_hot & used[:, :, None], written[:, :, None], 0), axis=1)
        masked_ids = jnp.where(hit, value, input_ids).astype(input_ids.dtype)
        return Masked(masked_ids, positions.astype(jnp.int32), targets, weights)
    to_mask = used & jax.random.bernoulli(k_mask, mask_token_prob, used.shape)
    write_mask = jnp.any(one_hot & to_mask[:, :, None], axis=1)
    masked_ids = jnp.where(write_mask, mask_id, input_ids)
    return Masked(masked_ids, positions.astype(jnp.int32), targets, weights)


def _inclusive_cumsum(x):
    """Cumulative sum over the last axis as a matmul with a triangle of ones: [..., n] -> [..., n].

    A matmul is the fastest scan XLA has on every backend for the short axes used here.
    """
    n = x.shape[-1]
    upper = jnp.triu(jnp.ones((n, n), x.dtype))
    return jnp.einsum("...i,ij->...j", x, upper, precision=jax.lax.Precision.HIGHEST)


def _inverse_cdf_sample(uniform, logits, probs=None):
    """Draws one index per row from softmax(logits) with a single uniform per row.

    Two levels of the inverse CDF over a [blocks, block] view of the vocabulary: pick the block
    whose cumulative mass passes u, then the token inside it. It needs B x N random numbers where
    Gumbel-max (jax.random.categorical) needs B x N x V, and a sum instead of an argmax over V,
    which on a CPU is most of the cost of sampling. Same distribution, up to float32 rounding.
    """
    if probs is None:
        probs = jax.nn.softmax(logits, axis=-1)
    shape, vocab = probs.shape[:-1], probs.shape[-1]
    block = int(np.ceil(np.sqrt(vocab)))
    blocks = -(-vocab // block)
    full = (blocks - 1) * block  # the last block may be short; it is summed on its own
    # No padded copy of probs (two [B, N, V] pads were ~25 ms of a small step); XLA still copies
    # the whole-block slice for the reduction, at about half that.
    mass = jnp.concatenate(
        [
            jnp.sum(probs[..., :full].reshape(*shape, blocks - 1, block), axis=-1),
            jnp.sum(probs[..., full:], axis=-1, keepdims=True),
        ],
        axis=-1,
    )  # [..., blocks]
    cdf = _inclusive_cumsum(mass)
    u = uniform * cdf[..., -1]
    b = jnp.minimum(jnp.sum(cdf <= u[..., None], axis=-1), blocks - 1)
    below = jnp.take_along_axis(cdf - mass, b[..., None], axis=-1)[..., 0]
    index = b[..., None] * block + jnp.arange(block)  # [..., block]; past the vocabulary: mass 0
    inside = jnp.where(
        index < vocab, jnp.take_along_axis(probs, jnp.minimum(index, vocab - 1), axis=-1), 0.0
    )
    j = jnp.sum(_inclusive_cumsum(inside) <= (u - below)[..., None], axis=-1)
    return jnp.minimum(b * block + jnp.minimum(j, block - 1), vocab - 1)


def sample_replacements(
    rng, logits, temperature: float = 1.0, sampler: str = "inverse_cdf", uniform=None, probs=None
):
    """Samples the generator's replacements: [B, N, V] logits -> [B, N] int32 tokens.

    The sample is drawn from softmax(logits / T) in float32 and carries no gradient: the
    generator learns only from its MLM loss, as in the paper. `sampler` 'gumbel' is
    jax.random.categorical (Gumbel-max); 'inverse_cdf' draws from the same distribution with one
    uniform per slot and is much cheaper where the vocabulary is large; `uniform` ([B, N] in
    [0, 1)) supplies those draws instead of `rng`, so that micro-batches of one batch can use the
    batch's own; `probs`, softmax(logits) already computed (`mlm_loss_and_probs`), is used at
    temperature 1 instead of computing it again.
    """
    logits = jax.lax.stop_gradient(logits).astype(jnp.float32) / temperature
    if sampler == "gumbel":
        return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
    if sampler == "inverse_cdf":
        if uniform is None:
            uniform = jax.random.uniform(rng, logits.shape[:-1])
        # The shared probabilities hold at temperature 1 only; unused logits are compiled away.
        # A scheduled temperature is traced: its probabilities are computed afresh.
        at_one = isinstance(temperature, int | float) and temperature == 1.0
        shared = jax.lax.stop_gradient(probs) if at_one else None
        return _inverse_cdf_sample(uniform, logits, probs=shared).astype(jnp.int32)
    raise ValueError(f"objective.sampler={sampler!r}: use 'inverse_cdf' or 'gumbel'")


def replace_tokens(input_ids, input_mask, positions, weights, samples):
    """Writes the samples into the original sequence and labels what changed.

    input_ids, input_mask: [B, L]; positions, weights, samples: [B, N].
    Returns (corrupted [B, L] int32, labels [B, L] float32). A sample equal to the original
    token is labelled real (0), since the discriminator cannot tell it apart.
    """
    length = input_ids.shape[1]
    one_hot = (positions[:, :, None] == jnp.arange(length)[None, None, :]) & (
        weights[:, :, None] > 0
    )
    hit = jnp.any(one_hot, axis=1)
    # Positions within an example are distinct, so at most one slot writes each position.
    written = jnp.sum(jnp.where(one_hot, samples[:, :, None], 0), axis=1)
    corrupted = jnp.where(hit, written, input_ids).astype(input_ids.dtype)
    labels = (corrupted != input_ids) & (input_mask > 0)
    return corrupted, labels.astype(jnp.float32)


@jax.custom_vjp
def _softmax_xent(logits, targets, weights):
    """(sum of weights x -log softmax(logits)[target], softmax(logits)): [..., V] -> ([], [..., V]).

    One exp over [..., V] serves the loss, its gradient and the generator's sampler; autodiff of
    a log-softmax plus a separate softmax for sampling ran three. The probabilities are returned
    for sampling only: they carry no gradient (their cotangent is ignored).
    """
    return _softmax_xent_fwd(logits, targets, weights)[0]


def _softmax_xent_fwd(logits, targets, weights):
    top = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = e / total
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)
    nll = (jnp.log(total) + top - target_logit)[..., 0]
    return (jnp.sum(nll * weights), probs), (probs, targets, weights)


def _softmax_xent_bwd(residuals, cotangents):
    probs, targets, weights = residuals
    g = cotangents[0]
    hot = targets[..., None] == jnp.arange(probs.shape[-1], dtype=targets.dtype)
    dlogits = (probs - hot.astype(probs.dtype)) * (weights * g)[..., None]
    return dlogits, None, None


_softmax_xent.defvjp(_softmax_xent_fwd, _softmax_xent_bwd)


def mlm_loss_and_probs(logits, targets, weights) -> tuple[LossSum, LossSum, jax.Array]:
    """Cross-entropy at the masked slots: [B, N, V], [B, N], [B, N] -> (loss sum, correct sum,
    softmax [B, N, V] float32 without gradient, for sampling)."""
    logits = logits.astype(jnp.float32)
    nll, probs = _softmax_xent(logits, targets, weights)
    # The target's logit is the maximum (an argmax without the costly index reduction over V).
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    correct = (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
    count = jnp.sum(weights)
    return LossSum(nll, count), LossSum(jnp.sum(correct * weights), count), probs


def mlm_loss(logits, targets, weights) -> tuple[LossSum, LossSum]:
    """Cross-entropy at the masked slots: [B, N, V], [B, N], [B, N] -> (loss, correct) sums."""
    return mlm_loss_and_probs(logits, targets, weights)[:2]


def rtd_loss(logits, labels, input_mask) -> LossSum:
    """Sigmoid cross-entropy over every real token ([CLS]/[SEP] included): [B, L] -> sum."""
    w = (input_mask > 0).astype(jnp.float32)
    bce = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels)
    return LossSum(jnp.sum(bce * w), jnp.sum(w))


def rtd_counts(logits, labels, input_mask) -> dict[str, jax.Array]:
    """Confusion counts of the discriminator's decisions (logit > 0 means replaced)."""
    w = (input_mask > 0).astype(jnp.float32)
    pred = (logits > 0).astype(jnp.float32) * w
    labels = labels * w
    return {
        "tokens": jnp.sum(w),
        "correct": jnp.sum(jnp.where(pred == labels, w, 0.0)),
        "predicted": jnp.sum(pred),
        "replaced": jnp.sum(labels),
        "true_positive": jnp.sum(pred * labels),
    }


def _ratio(a, b):
    return a / jnp.maximum(b, 1.0)


class Corruption(NamedTuple):
    """The random choices of one batch that precede the networks: what to mask and the sampler's
    uniforms. Drawn once for the whole batch, so accumulated micro-batches see the very choices
    the full batch would."""

    masked: Masked
    uniform: jax.Array  # [B, N] float32 in [0, 1): one draw per slot for the inverse-CDF sampler


def corrupt(
    rng,
    batch,
    *,
    mask_prob,
    num_slots,
    mask_id,
    special_ids,
    mask_token_prob=0.85,
    random_token_prob=0.0,
    vocab_size=0,
):
    """Masking and sampler draws for a batch of [B, L] ids: returns a `Corruption`."""
    k_mask, k_uniform = jax.random.split(rng)
    m = mask_tokens(
        k_mask,
        batch["input_ids"],
        batch["input_mask"],
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        mask_token_prob=mask_token_prob,
        random_token_prob=random_token_prob,
        vocab_size=vocab_size,
    )
    return Corruption(m, jax.random.uniform(k_uniform, m.positions.shape))


def _generate(batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler):
    """Generate, sample, corrupt: the generator's MLM sums, corrupted ids and labels [B, L]."""
    ids, mask = batch["input_ids"], batch["input_mask"]
    m = corruption.masked
    gen_logits = generator_fn(m.input_ids, m.positions, k_gen)
    gen, gen_correct, probs = mlm_loss_and_probs(gen_logits, m.targets, m.weights)
    samples = sample_replacements(
        k_sample, gen_logits, temperature, sampler, corruption.uniform, probs
    )
    corrupted, labels = replace_tokens(ids, mask, m.positions, m.weights, samples)
    sums = {"gen_loss": gen.total, "gen_correct": gen_correct.total, "gen_count": gen.count}
    return sums, corrupted, labels


def electra_sums(
    batch: dict[str, jax.Array],
    corruption: Corruption,
    generator_fn: Callable,
    discriminator_fn: Callable,
    keys: tuple[jax.Array, jax.Array, jax.Array],
    *,
    temperature: float = 1.0,
    sampler: str = "inverse_cdf",
    disc_mlm_fn: Callable | None = None,
) -> dict[str, jax.Array]:
    """Generate, sample, corrupt, discriminate: the loss and metric sums of (part of) a batch.

    batch: [B, L] arrays; corruption: that batch's `Corruption` (rows matching);
    generator_fn(masked_ids, positions, key) -> [B, N, V]; discriminator_fn(ids, key) -> [B, L];
    keys: (generator dropout, gumbel sampler, discriminator dropout). Every value is a sum over
    the rows, so sums of parts add up to the sums of the whole.

    disc_mlm_fn (ids, positions, key) -> (replaced logits [B, L], MLM logits [B, N, V]): the
    discriminator with its MLM head, given when objective.disc_mlm_weight > 0. It then also
    predicts the original tokens at the masked slots from the corrupted sequence it reads
    (`disc_mlm_loss`, `disc_mlm_correct`), in the same pass.
    """
    k_gen, k_sample, k_disc = keys
    mask = batch["input_mask"]
    gen, corrupted, labels = _generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    extra = {}
    if disc_mlm_fn is None:
        disc_logits = discriminator_fn(corrupted, k_disc)
    else:
        m = corruption.masked
        disc_logits, mlm_logits = disc_mlm_fn(corrupted, m.positions, k_disc)
        mlm, mlm_correct = mlm_loss(mlm_logits, m.targets, m.weights)
        extra = {"disc_mlm_loss": mlm.total, "disc_mlm_correct": mlm_correct.total}
    disc = rtd_loss(disc_logits, labels, mask)
    return {**gen, "disc_loss": disc.total, **rtd_counts(disc_logits, labels, mask), **extra}


def electra_loss(sums, denominators, *, gen_weight: float, disc_weight: float, disc_mlm_weight=0.0):
    """gen_weight x MLM mean + disc_weight x RTD mean (+ disc_mlm_weight x the
    discriminator's MLM mean, when its sums hold one), the means taken with the whole batch's
    `denominators` (masked slots, real tokens): a micro-batch's share of the batch loss."""
    gen_count, tokens = denominators
    masked = jnp.maximum(gen_count, 1.0)
    loss = gen_weight * sums["gen_loss"] / masked + disc_weight * sums["disc_loss"] / jnp.maximum(
        tokens, 1.0
    )
    if "disc_mlm_loss" in sums:
        loss = loss + disc_mlm_weight * sums["disc_mlm_loss"] / masked
    return loss


def electra_metrics(
    sums, *, gen_weight: float, disc_weight: float, disc_mlm_weight=0.0
) -> dict[str, jax.Array]:
    """The logged scalars from a whole batch's sums."""
    denominators = (sums["gen_count"], sums["tokens"])
    weights = {"gen_weight": gen_weight, "disc_weight": disc_weight}
    out = _electra_scalars(sums)
    out["loss"] = electra_loss(sums, denominators, **weights, disc_mlm_weight=disc_mlm_weight)
    if "disc_mlm_loss" in sums:
        out["disc_mlm_loss"] = _ratio(sums["disc_mlm_loss"], sums["gen_count"])
        out["disc_mlm_accuracy"] = _ratio(sums["disc_mlm_correct"], sums["gen_count"])
        out["disc_mlm_weight"] = jnp.asarray(disc_mlm_weight, jnp.float32)
    return out


def _electra_scalars(sums) -> dict[str, jax.Array]:
    return {
        "gen_loss": _ratio(sums["gen_loss"], sums["gen_count"]),
        "disc_loss": _ratio(sums["disc_loss"], sums["tokens"]),
        "gen_accuracy": _ratio(sums["gen_correct"], sums["gen_count"]),
        "disc_accuracy": _ratio(sums["correct"], sums["tokens"]),
        "disc_precision": _ratio(sums["true_positive"], sums["predicted"]),
        "disc_recall": _ratio(sums["true_positive"], sums["replaced"]),
        "replaced_fraction": _ratio(sums["replaced"], sums["tokens"]),
        "masked_fraction": _ratio(sums["gen_count"], sums["tokens"]),
    }


def electra_forward(
    rng,
    batch: dict[str, jax.Array],
    generator_fn: Callable,
    discriminator_fn: Callable,
    *,
    mask_prob: float,
    num_slots: int,
    mask_id: int,
    special_ids: tuple[int, ...],
    gen_weight: float,
    disc_weight: float,
    temperature: float = 1.0,
    mask_token_prob: float = 0.85,
    sampler: str = "inverse_cdf",
):
    """One ELECTRA forward pass over a whole batch: mask, generate, sample, corrupt,
    discriminate, score.

    batch: 'input_ids', 'segment_ids', 'input_mask', each [B, L] int32.
    generator_fn(masked_ids, positions, rng) -> [B, N, V] logits;
    discriminator_fn(corrupted_ids, rng) -> [B, L] logits (both close over params and the
    segment ids and mask). Returns (loss scalar, metrics dict of scalars).
    """
    return objective_forward(
        "electra",
        rng,
        batch,
        generator_fn,
        discriminator_fn,
        None,
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        vocab_size=0,  # no random replacements in ELECTRA's masking
        gen_weight=gen_weight,
        disc_weight=disc_weight,
        temperature=temperature,
        mask_token_prob=mask_token_prob,
        sampler=sampler,
    )


# ---------------------------------------------------------------------------------------------
# The paper's ablations (Clark et al., 2020, section 3.2 and Table 5). Each has `*_sums` with the
# same keys as electra_sums (zeros where the objective has no such part) plus, for those whose
# discriminator-sized network predicts tokens, mlm_loss / mlm_correct / mlm_count. `gen_count` is
# always the number of masked slots. Losses are sums; `objective_loss` divides by the whole
# batch's (masked slots, real tokens), so accumulated micro-batches stay exact.
# ---------------------------------------------------------------------------------------------

OBJECTIVES = validate.OBJECTIVES
# Objectives whose sums, loss and metrics are ELECTRA's: 'two_stage' (paper Section 3.2) trains
# with ELECTRA's loss, its two weights switched by the step (train_step.two_stage_weights).
ELECTRA_LIKE = ("electra", "two_stage")


def needs_mlm_head(name: str, disc_mlm_weight: float = 0.0) -> bool:
    """Whether the objective trains an MLM head on the discriminator-sized network (the MLM
    objectives, and 'electra' with objective.disc_mlm_weight > 0)."""
    return name in ("mlm", "replaced_mlm", "all_tokens_mlm") or disc_mlm_weight > 0


def schedule_value(end: float, start: float, steps: int, step):
    """A value that goes linearly from `start` at step 0 to `end` at step `steps` and stays
    there: `end` itself (a Python float, so nothing changes in the compiled step) when `steps`
    is 0; else a float32 scalar of the traced `step`. The temperature schedule
    (objective.temperature_start, temperature_steps) and the discriminator's fading MLM term
    (objective.disc_mlm_weight, disc_mlm_steps, from the weight down to 0) use it."""
    if not steps:
        return end
    left = jnp.clip(1.0 - step.astype(jnp.float32) / steps, 0.0, 1.0)
    return jnp.float32(end) + (jnp.float32(start) - jnp.float32(end)) * left


def has_generator(name: str) -> bool:
    """Whether the objective's corruption comes from a generator ('mlm' has none)."""
    return name != "mlm"


def trains_rtd_head(name: str) -> bool:
    """Whether the objective trains the replaced-token head ('all_tokens_mlm' as its copy
    probability), so that the held-out evaluation reads the discriminator's decisions."""
    return name in (*ELECTRA_LIKE, "electra_15", "adversarial", "all_tokens_mlm")


def needs_policy_baseline(name: str) -> bool:
    """Whether the objective trains the generator's learned baseline ('adversarial')."""
    return name == "adversarial"


def objective_corruption(
    name: str,
    rng,
    batch,
    *,
    mask_prob: float,
    num_slots: int,
    mask_id: int,
    special_ids: tuple[int, ...],
    mask_token_prob: float,
    vocab_size: int,
) -> Corruption:
    """`corrupt` with objective `name`'s shares of [MASK] and random tokens (corruption_probs)."""
    p_mask, p_random = corruption_probs(name, mask_token_prob)
    return corrupt(
        rng,
        batch,
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        mask_token_prob=p_mask,
        random_token_prob=p_random,
        vocab_size=vocab_size,
    )


def corruption_probs(name: str, mask_token_prob: float) -> tuple[float, float]:
    """(share of chosen slots shown as [MASK], share given a random token) for an objective:
    BERT's 80% / 10% (10% kept) for 'mlm', else (mask_token_prob, 0) as in ELECTRA."""
    if name == "mlm":
        return 0.8, 0.1
    return mask_token_prob, 0.0


def rtd_loss_at(logits, labels, positions, weights) -> LossSum:
    """Sigmoid cross-entropy at the masked slots only ('electra_15'):
    logits, labels [B, L]; positions, weights [B, N] -> sum over the used slots."""
    at = lambda x: jnp.take_along_axis(x, positions, axis=1)
    bce = optax.sigmoid_binary_cross_entropy(at(logits.astype(jnp.float32)), at(labels))
    return LossSum(jnp.sum(bce * weights), jnp.sum(weights))


def copy_mlm_loss(mlm_logits, copy_logits, input_ids, targets, input_mask):
    """All-tokens MLM with the paper's copy mechanism: (loss, correct) sums over real tokens.

    mlm_logits [B, L, V]; copy_logits [B, L] (the logit of D, the probability of copying the
    input token); input_ids, targets, input_mask [B, L]. p(t) = D onehot(input)_t +
    (1 - D) softmax(mlm_logits)_t; the loss is -log p(target) at every token with input_mask > 0,
    computed in log space (D = 1 on an unchanged token gives 0).
    """
    logits = mlm_logits.astype(jnp.float32)
    c = copy_logits.astype(jnp.float32)
    log_gen = jax.nn.log_sigmoid(-c)[..., None] + jax.nn.log_softmax(logits, axis=-1)  # [B,L,V]
    is_input = jnp.arange(logits.shape[-1])[None, None, :] == input_ids[..., None]
    log_p = jnp.where(is_input, jnp.logaddexp(jax.nn.log_sigmoid(c)[..., None], log_gen), log_gen)
    log_target = jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
    correct = (log_target >= jnp.max(log_p, axis=-1)).astype(jnp.float32)
    w = (input_mask > 0).astype(jnp.float32)
    count = jnp.sum(w)
    return LossSum(-jnp.sum(log_target * w), count), LossSum(jnp.sum(correct * w), count)


def _zero():
    return jnp.zeros((), jnp.float32)


def _no_decisions(input_mask, replaced=None):
    tokens = jnp.sum((input_mask > 0).astype(jnp.float32))
    zero = _zero()
    return {
        "tokens": tokens,
        "correct": zero,
        "predicted": zero,
        "replaced": zero if replaced is None else replaced,
        "true_positive": zero,
    }


def mlm_sums(batch, corruption, mlm_fn, key) -> dict[str, jax.Array]:
    """BERT's MLM: the discriminator-sized network reads the masked ids (80% [MASK], 10% random,
    10% kept: `corruption_probs('mlm')`) and predicts the originals at the chosen slots; no
    generator. mlm_fn(ids [B, L], positions [B, N], key) -> ([B, L], [B, N, V] logits)."""
    m = corruption.masked
    _, logits = mlm_fn(m.input_ids, m.positions, key)
    loss, correct = mlm_loss(logits, m.targets, m.weights)
    zero = _zero()
    return {
        "gen_loss": zero,
        "gen_correct": zero,
        "gen_count": loss.count,
        "disc_loss": zero,
        **_no_decisions(batch["input_mask"]),
        "mlm_loss": loss.total,
        "mlm_correct": correct.total,
        "mlm_count": loss.count,
    }


def electra_15_sums(
    batch,
    corruption,
    generator_fn,
    discriminator_fn,
    keys,
    *,
    temperature=1.0,
    sampler="inverse_cdf",
) -> dict[str, jax.Array]:
    """ELECTRA 15%: as electra_sums, but the discriminator's loss covers only the masked slots
    (its decision counts still cover every real token)."""
    k_gen, k_sample, k_disc = keys
    mask = batch["input_mask"]
    m = corruption.masked
    gen, corrupted, labels = _generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    disc_logits = discriminator_fn(corrupted, k_disc)
    disc = rtd_loss_at(disc_logits, labels, m.positions, m.weights)
    return {**gen, "disc_loss": disc.total, **rtd_counts(disc_logits, labels, mask)}


def replaced_mlm_sums(
    batch, corruption, generator_fn, mlm_fn, keys, *, temperature=1.0, sampler="inverse_cdf"
) -> dict[str, jax.Array]:
    """Replace MLM: the generator's samples fill the masked slots (no [MASK] left) and the
    discriminator-sized network predicts the original tokens there."""
    k_gen, k_sample, k_disc = keys
    m = corruption.masked
    gen, corrupted, labels = _generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    _, logits = mlm_fn(corrupted, m.positions, k_disc)
    loss, correct = mlm_loss(logits, m.targets, m.weights)
    return {
        **gen,
        "disc_loss": _zero(),
        **_no_decisions(batch["input_mask"], jnp.sum(labels)),
        "mlm_loss": loss.total,
        "mlm_correct": correct.total,
        "mlm_count": loss.count,
    }


def all_tokens_mlm_sums(
    batch, corruption, generator_fn, mlm_fn, keys, *, temperature=1.0, sampler="inverse_cdf"
) -> dict[str, jax.Array]:
    """All-Tokens MLM: generator samples fill the masked slots; the discriminator-sized network
    predicts every token with the copy mechanism (`copy_mlm_loss`). D's logit is minus the
    discriminator head's logit, so that head keeps its meaning (> 0: "replaced"), and its
    decisions are counted as replaced-token detection."""
    k_gen, k_sample, k_disc = keys
    ids, mask = batch["input_ids"], batch["input_mask"]
    gen, corrupted, labels = _generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    replaced_logits, logits = mlm_fn(corrupted, None, k_disc)
    loss, correct = copy_mlm_loss(logits, -replaced_logits, corrupted, ids, mask)
    return {
        **gen,
        "disc_loss": _zero(),
        **rtd_counts(replaced_logits, labels, mask),
        "mlm_loss": loss.total,
        "mlm_correct": correct.total,
        "mlm_count": loss.count,
    }


# Adversarial ELECTRA (the paper's Appendix F). The generator is trained to maximise the
# discriminator's loss. Sampling is discrete, so the gradient is REINFORCE's: at a masked slot t
# the reward of the sampled token is the discriminator's cross-entropy there,
#   R_t = -log D(original) if the sample equals the original token, else -log D(replaced),
# and the generator ascends sum_t (R_t - b_t) grad log p_G(sample_t | masked input), one sample
# per slot. The baseline b_t = -log sigmoid(w . h_t) reads the generator encoder's state h_t and
# is trained by cross-entropy towards the reward: sigmoid(w . h_t) towards exp(-R_t). As in the
# paper, the reward is credited to its own slot only (the discriminator's decision at t is
# assumed not to depend on the other slots' samples).


def adversarial_sums(
    batch,
    corruption,
    policy_fn,
    discriminator_fn,
    keys,
    *,
    temperature=1.0,
    sampler="inverse_cdf",
) -> dict[str, jax.Array]:
    """electra_sums' keys (gen_loss is the generator's MLM loss, logged and used before the
    policy gradient takes over) plus policy_loss (the REINFORCE surrogate, -log p x advantage),
    baseline_loss and reward, each a sum over the masked slots.

    policy_fn(masked_ids, positions, key) -> (logits [B, N, V], baseline logits [B, N]).
    """
    k_gen, k_sample, k_disc = keys
    ids, mask = batch["input_ids"], batch["input_mask"]
    m = corruption.masked
    logits, baseline_logits = policy_fn(m.input_ids, m.positions, k_gen)
    logits = logits.astype(jnp.float32)
    gen, gen_correct, probs = mlm_loss_and_probs(logits, m.targets, m.weights)
    samples = sample_replacements(k_sample, logits, temperature, sampler, corruption.uniform, probs)
    corrupted, labels = replace_tokens(ids, mask, m.positions, m.weights, samples)
    disc_logits = discriminator_fn(corrupted, k_disc)
    disc = rtd_loss(disc_logits, labels, mask)

    at = lambda x: jnp.take_along_axis(x, m.positions, axis=1)
    reward = jax.lax.stop_gradient(
        optax.sigmoid_binary_cross_entropy(at(disc_logits.astype(jnp.float32)), at(labels))
    )
    # The policy is the distribution sampled from: softmax(logits / T).
    tempered = logits / temperature
    log_p = jnp.take_along_axis(tempered, samples[..., None], axis=-1)[..., 0] - (
        jax.nn.logsumexp(tempered, axis=-1)
    )
    baseline = jax.nn.softplus(-baseline_logits)  # -log sigmoid(w . h)
    advantage = jax.lax.stop_gradient(reward - baseline)
    baseline_xent = optax.sigmoid_binary_cross_entropy(baseline_logits, jnp.exp(-reward))
    w = m.weights
    return {
        "gen_loss": gen.total,
        "gen_correct": gen_correct.total,
        "gen_count": gen.count,
        "disc_loss": disc.total,
        **rtd_counts(disc_logits, labels, mask),
        "policy_loss": -jnp.sum(log_p * advantage * w),
        "baseline_loss": jnp.sum(baseline_xent * w),
        "reward": jnp.sum(reward * w),
    }


def objective_sums(
    name: str,
    batch,
    corruption: Corruption,
    generator_fn: Callable,
    discriminator_fn: Callable,
    mlm_fn: Callable | None,
    keys,
    *,
    temperature: float | jax.Array = 1.0,
    sampler: str = "inverse_cdf",
    disc_mlm: bool = False,
) -> dict[str, jax.Array]:
    """The sums of objective `name` for (part of) a batch; `mlm_fn(ids, positions or None, key)
    -> (replaced logits [B, L], MLM logits [B, N or L, V])` is needed by the MLM objectives and,
    with `disc_mlm` (objective.disc_mlm_weight > 0), by 'electra' for its discriminator's MLM
    term. `temperature` may be a traced scalar (a scheduled temperature)."""
    kw = {"temperature": temperature, "sampler": sampler}
    if name in ELECTRA_LIKE:
        disc_mlm_fn = mlm_fn if disc_mlm else None
        return electra_sums(
            batch, corruption, generator_fn, discriminator_fn, keys, **kw, disc_mlm_fn=disc_mlm_fn
        )
    if name == "electra_15":
        return electra_15_sums(batch, corruption, generator_fn, discriminator_fn, keys, **kw)
    if name == "mlm":
        return mlm_sums(batch, corruption, mlm_fn, keys[2])
    if name == "replaced_mlm":
        return replaced_mlm_sums(batch, corruption, generator_fn, mlm_fn, keys, **kw)
    if name == "all_tokens_mlm":
        return all_tokens_mlm_sums(batch, corruption, generator_fn, mlm_fn, keys, **kw)
    if name == "adversarial":  # generator_fn is the policy (Electra.generator_policy)
        return adversarial_sums(batch, corruption, generator_fn, discriminator_fn, keys, **kw)
    raise ValueError(f"objective.name={name!r}: use one of {', '.join(OBJECTIVES)}")


def objective_loss(
    name: str,
    sums,
    denominators,
    *,
    gen_weight: float,
    disc_weight: float,
    adversarial: float | jax.Array = 1.0,
    disc_mlm_weight: float | jax.Array = 0.0,
):
    """The loss of objective `name` from (part of) a batch's sums and the whole batch's
    denominators (masked slots, real tokens). 'electra' is electra_loss; 'electra_15' divides
    the RTD sum by the masked slots; 'mlm' is the MLM mean alone; 'replaced_mlm' and
    'all_tokens_mlm' are gen_weight x generator MLM + 1 x the network's MLM mean (over masked
    slots, resp. real tokens). 'adversarial' is electra_loss with the generator's MLM term
    replaced by its policy-gradient surrogate where `adversarial` is 1 (0: the maximum-
    likelihood warm start), plus the baseline's cross-entropy, both means over masked slots."""
    if name in ELECTRA_LIKE:
        return electra_loss(
            sums,
            denominators,
            gen_weight=gen_weight,
            disc_weight=disc_weight,
            disc_mlm_weight=disc_mlm_weight,
        )
    masked, tokens = (jnp.maximum(d, 1.0) for d in denominators)
    if name == "adversarial":
        mle, policy = sums["gen_loss"], sums["policy_loss"]
        generator = adversarial * policy + (1.0 - adversarial) * mle + sums["baseline_loss"]
        return gen_weight * generator / masked + disc_weight * sums["disc_loss"] / tokens
    gen = gen_weight * sums["gen_loss"] / masked
    if name == "electra_15":
        return gen + disc_weight * sums["disc_loss"] / masked
    if name == "mlm":
        return sums["mlm_loss"] / masked
    if name == "replaced_mlm":
        return gen + sums["mlm_loss"] / masked
    if name == "all_tokens_mlm":
        return gen + sums["mlm_loss"] / tokens
    raise ValueError(f"objective.name={name!r}: use one of {', '.join(OBJECTIVES)}")


def objective_metrics(
    name: str,
    sums,
    *,
    gen_weight: float,
    disc_weight: float,
    adversarial: float | jax.Array = 1.0,
    disc_mlm_weight: float | jax.Array = 0.0,
) -> dict[str, jax.Array]:
    """The logged scalars of objective `name` from a whole batch's sums: electra_metrics' keys
    (zero where the objective has no such part) plus mlm_loss and mlm_accuracy for the MLM
    objectives, and reward, policy_loss and baseline_loss (means over masked slots) for
    'adversarial'."""
    if name in ELECTRA_LIKE:
        return electra_metrics(
            sums, gen_weight=gen_weight, disc_weight=disc_weight, disc_mlm_weight=disc_mlm_weight
        )
    out = electra_metrics(sums, gen_weight=gen_weight, disc_weight=disc_weight)
    denominators = (sums["gen_count"], sums["tokens"])
    out["loss"] = objective_loss(
        name,
        sums,
        denominators,
        gen_weight=gen_weight,
        disc_weight=disc_weight,
        adversarial=adversarial,
    )
    if name == "adversarial":
        for key in ("reward", "policy_loss", "baseline_loss"):
            out[key] = _ratio(sums[key], sums["gen_count"])
    if name == "electra_15":
        out["disc_loss"] = _ratio(sums["disc_loss"], sums["gen_count"])
    if "mlm_loss" in sums:
        out["mlm_loss"] = _ratio(sums["mlm_loss"], sums["mlm_count"])
        out["mlm_accuracy"] = _ratio(sums["mlm_correct"], sums["mlm_count"])
    return out


def objective_forward(
    name: str,
    rng,
    batch: dict[str, jax.Array],
    generator_fn: Callable,
    discriminator_fn: Callable,
    mlm_fn: Callable | None,
    *,
    mask_prob: float,
    num_slots: int,
    mask_id: int,
    special_ids: tuple[int, ...],
    vocab_size: int,
    gen_weight: float,
    disc_weight: float,
    temperature: float = 1.0,
    mask_token_prob: float = 0.85,
    sampler: str = "inverse_cdf",
):
    """One forward pass of objective `name` over a whole batch: corrupt, run the networks,
    score (electra_forward's arguments, plus `mlm_fn` and the vocabulary size for BERT's
    random tokens). Returns (loss scalar, metrics dict)."""
    k_corrupt, k_gen, k_sample, k_disc = jax.random.split(rng, 4)
    c = objective_corruption(
        name,
        k_corrupt,
        batch,
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        mask_token_prob=mask_token_prob,
        vocab_size=vocab_size,
    )
    sums = objective_sums(
        name,
        batch,
        c,
        generator_fn,
        discriminator_fn,
        mlm_fn,
        (k_gen, k_sample, k_disc),
        temperature=temperature,
        sampler=sampler,
    )
    metrics = objective_metrics(name, sums, gen_weight=gen_weight, disc_weight=disc_weight)
    return metrics["loss"], metrics
