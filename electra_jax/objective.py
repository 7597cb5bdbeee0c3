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
) -> Masked:
    """Chooses positions to predict and writes [MASK] into most of them.

    Per example, max(1, min(N, round(n_real x mask_prob))) distinct positions are drawn uniformly
    from the real tokens that are not special ([CLS], [SEP], [MASK], [PAD]). Of those, a fraction
    `mask_token_prob` becomes [MASK] and the rest keep their token; none becomes a random token
    (ELECTRA drops BERT's 10% random replacement, since the generator supplies replacements).

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

    to_mask = used & jax.random.bernoulli(k_mask, mask_token_prob, used.shape)
    one_hot = positions[:, :, None] == jnp.arange(length)[None, None, :]  # [B, N, L]
    write_mask = jnp.any(one_hot & to_mask[:, :, None], axis=1)
    masked_ids = jnp.where(write_mask, mask_id, input_ids)
    targets = jnp.take_along_axis(input_ids, positions, axis=1)
    return Masked(masked_ids, positions.astype(jnp.int32), targets, weights)


def _inclusive_cumsum(x):
    """Cumulative sum over the last axis as a matmul with a triangle of ones: [..., n] -> [..., n].

    A matmul is the fastest scan XLA has on every backend for the short axes used here.
    """
    n = x.shape[-1]
    upper = jnp.triu(jnp.ones((n, n), x.dtype))
    return jnp.einsum("...i,ij->...j", x, upper, precision=jax.lax.Precision.HIGHEST)


def _inverse_cdf_sample(uniform, logits):
    """Draws one index per row from softmax(logits) with a single uniform per row.

    Two levels of the inverse CDF over a [blocks, block] view of the vocabulary: pick the block
    whose cumulative mass passes u, then the token inside it. It needs B x N random numbers where
    Gumbel-max (jax.random.categorical) needs B x N x V, and a sum instead of an argmax over V,
    which on a CPU is most of the cost of sampling. Same distribution, up to float32 rounding.
    """
    vocab = logits.shape[-1]
    block = int(np.ceil(np.sqrt(vocab)))
    blocks = -(-vocab // block)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, blocks * block - vocab)])
    probs = probs.reshape(*logits.shape[:-1], blocks, block)
    mass = jnp.sum(probs, axis=-1)  # [..., blocks]
    cdf = _inclusive_cumsum(mass)
    u = uniform * cdf[..., -1]
    b = jnp.minimum(jnp.sum(cdf <= u[..., None], axis=-1), blocks - 1)
    below = jnp.take_along_axis(cdf - mass, b[..., None], axis=-1)[..., 0]
    inside = jnp.take_along_axis(probs, b[..., None, None], axis=-2)[..., 0, :]  # [..., block]
    j = jnp.sum(_inclusive_cumsum(inside) <= (u - below)[..., None], axis=-1)
    return jnp.minimum(b * block + jnp.minimum(j, block - 1), vocab - 1)


def sample_replacements(
    rng, logits, temperature: float = 1.0, sampler: str = "inverse_cdf", uniform=None
):
    """Samples the generator's replacements: [B, N, V] logits -> [B, N] int32 tokens.

    The sample is drawn from softmax(logits / T) in float32 and carries no gradient: the
    generator learns only from its MLM loss, as in the paper. `sampler` 'gumbel' is
    jax.random.categorical (Gumbel-max); 'inverse_cdf' draws from the same distribution with one
    uniform per slot and is much cheaper where the vocabulary is large; `uniform` ([B, N] in
    [0, 1)) supplies those draws instead of `rng`, so that micro-batches of one batch can use the
    batch's own.
    """
    logits = jax.lax.stop_gradient(logits).astype(jnp.float32) / temperature
    if sampler == "gumbel":
        return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
    if sampler == "inverse_cdf":
        if uniform is None:
            uniform = jax.random.uniform(rng, logits.shape[:-1])
        return _inverse_cdf_sample(uniform, logits).astype(jnp.int32)
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


def mlm_loss(logits, targets, weights) -> tuple[LossSum, LossSum]:
    """Cross-entropy at the masked slots: [B, N, V], [B, N], [B, N] -> (loss, correct) sums."""
    logits = logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    # The target's logit is the maximum (an argmax without the costly index reduction over V).
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    correct = (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
    count = jnp.sum(weights)
    return LossSum(jnp.sum(nll * weights), count), LossSum(jnp.sum(correct * weights), count)


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


def corrupt(rng, batch, *, mask_prob, num_slots, mask_id, special_ids, mask_token_prob=0.85):
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
    )
    return Corruption(m, jax.random.uniform(k_uniform, m.positions.shape))


def electra_sums(
    batch: dict[str, jax.Array],
    corruption: Corruption,
    generator_fn: Callable,
    discriminator_fn: Callable,
    keys: tuple[jax.Array, jax.Array, jax.Array],
    *,
    temperature: float = 1.0,
    sampler: str = "inverse_cdf",
) -> dict[str, jax.Array]:
    """Generate, sample, corrupt, discriminate: the loss and metric sums of (part of) a batch.

    batch: [B, L] arrays; corruption: that batch's `Corruption` (rows matching);
    generator_fn(masked_ids, positions, key) -> [B, N, V]; discriminator_fn(ids, key) -> [B, L];
    keys: (generator dropout, gumbel sampler, discriminator dropout). Every value is a sum over
    the rows, so sums of parts add up to the sums of the whole.
    """
    k_gen, k_sample, k_disc = keys
    ids, mask = batch["input_ids"], batch["input_mask"]
    m = corruption.masked
    gen_logits = generator_fn(m.input_ids, m.positions, k_gen)
    gen, gen_correct = mlm_loss(gen_logits, m.targets, m.weights)
    samples = sample_replacements(k_sample, gen_logits, temperature, sampler, corruption.uniform)
    corrupted, labels = replace_tokens(ids, mask, m.positions, m.weights, samples)
    disc_logits = discriminator_fn(corrupted, k_disc)
    disc = rtd_loss(disc_logits, labels, mask)
    counts = rtd_counts(disc_logits, labels, mask)
    return {
        "gen_loss": gen.total,
        "gen_correct": gen_correct.total,
        "gen_count": gen.count,
        "disc_loss": disc.total,
        **counts,
    }


def electra_loss(sums, denominators, *, gen_weight: float, disc_weight: float):
    """gen_weight x MLM mean + disc_weight x RTD mean, the means taken with the whole batch's
    `denominators` (masked slots, real tokens): a micro-batch's share of the batch loss."""
    gen_count, tokens = denominators
    return gen_weight * sums["gen_loss"] / jnp.maximum(gen_count, 1.0) + disc_weight * sums[
        "disc_loss"
    ] / jnp.maximum(tokens, 1.0)


def electra_metrics(sums, *, gen_weight: float, disc_weight: float) -> dict[str, jax.Array]:
    """The logged scalars from a whole batch's sums."""
    denominators = (sums["gen_count"], sums["tokens"])
    return {
        "loss": electra_loss(sums, denominators, gen_weight=gen_weight, disc_weight=disc_weight),
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
    k_corrupt, k_gen, k_sample, k_disc = jax.random.split(rng, 4)
    c = corrupt(
        k_corrupt,
        batch,
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        mask_token_prob=mask_token_prob,
    )
    sums = electra_sums(
        batch,
        c,
        generator_fn,
        discriminator_fn,
        (k_gen, k_sample, k_disc),
        temperature=temperature,
        sampler=sampler,
    )
    metrics = electra_metrics(sums, gen_weight=gen_weight, disc_weight=disc_weight)
    return metrics["loss"], metrics
