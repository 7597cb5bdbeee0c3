"""What every objective is made of, as pure functions on arrays: masking, sampling, replacing,
the MLM and replaced-token losses; and `Objective`, what an objective module gives the step.

Shapes: B batch, L sequence length, N mask slots per example, V vocabulary.
Everything here runs inside the compiled train step; nothing touches the host.
Losses return a `LossSum` (sum and denominator) so that averaging over devices and over
accumulated micro-batches stays exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

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


def ratio(a, b):
    return a / jnp.maximum(b, 1.0)


class Corruption(NamedTuple):
    """The random choices of one batch that precede the networks: what to mask and the sampler's
    uniforms. Drawn once for the whole batch, so accumulated micro-batches see the very choices
    the full batch would."""

    masked: Masked
    uniform: jax.Array  # [B, N] float32 in [0, 1): one draw per slot for the inverse-CDF sampler
    # objective.unigram_share: [B, N] int32 pieces drawn from the corpus's unigram distribution
    # and [B, N] bool, where they replace the generator's sample (None: the generator's only).
    unigram: jax.Array | None = None
    unigram_on: jax.Array | None = None


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


def generate(batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler):
    """Generate, sample, corrupt: the generator's MLM sums, corrupted ids and labels [B, L]."""
    ids, mask = batch["input_ids"], batch["input_mask"]
    m = corruption.masked
    gen_logits = generator_fn(m.input_ids, m.positions, k_gen)
    gen, gen_correct, probs = mlm_loss_and_probs(gen_logits, m.targets, m.weights)
    samples = sample_replacements(
        k_sample, gen_logits, temperature, sampler, corruption.uniform, probs
    )
    if corruption.unigram is not None:
        samples = jnp.where(corruption.unigram_on, corruption.unigram, samples)
    corrupted, labels = replace_tokens(ids, mask, m.positions, m.weights, samples)
    sums = {"gen_loss": gen.total, "gen_correct": gen_correct.total, "gen_count": gen.count}
    return sums, corrupted, labels


def unigram_draws(uniform, unigram_cdf, vocab_size: int):
    """Pieces drawn from a unigram distribution by inverse CDF: uniform [...] in [0, 1),
    unigram_cdf float32 [V] (non-decreasing, data/heldout.unigram_cdf) -> int32 [...]."""
    drawn = jnp.searchsorted(unigram_cdf, uniform * unigram_cdf[-1], side="right")
    return jnp.minimum(drawn, vocab_size - 1).astype(jnp.int32)


def with_unigram_floor(corruption: Corruption, key, unigram_cdf, share, vocab_size: int):
    """The corruption with objective.unigram_share's replacements: each slot, with probability
    `share` (a float or a traced scalar), gets a piece drawn from the corpus's unigram
    distribution instead of the generator's sample. Such a replacement cannot be told by its
    rarity, only by its context; the generator still learns from every slot."""
    k_draw, k_on = jax.random.split(key)
    shape = corruption.uniform.shape
    drawn = unigram_draws(jax.random.uniform(k_draw, shape), unigram_cdf, vocab_size)
    on = jax.random.uniform(k_on, shape) < share
    return corruption._replace(unigram=drawn, unigram_on=on)


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


def zero():
    """A float32 0: the sum of a part the objective does not have."""
    return jnp.zeros((), jnp.float32)


def no_decisions(input_mask, replaced=None):
    """rtd_counts' keys for an objective without the discriminator's decisions: the real tokens
    counted, every decision zero (`replaced`: the replaced tokens, where they are counted)."""
    tokens = jnp.sum((input_mask > 0).astype(jnp.float32))
    none = zero()
    return {
        "tokens": tokens,
        "correct": none,
        "predicted": none,
        "replaced": none if replaced is None else replaced,
        "true_positive": none,
    }


# ------------------------------------------------------------------------------ the interface
# What an objective module gives the step (objectives/registry.py names them): the step asks the
# objective, never its name.


class Networks(NamedTuple):
    """The networks an objective's sums call, closing over the parameters, the segments and the
    padding (train_step builds them; `key` is the dropout key).

    generator(masked ids [B, L], positions [B, N], key) -> logits [B, N, V]; for an objective
    with a policy baseline, (logits, baseline logits [B, N]) (Electra.generator_policy).
    discriminator(ids [B, L], key) -> replaced logits [B, L].
    mlm(ids [B, L], positions [B, N] or None, key) -> (replaced logits [B, L], MLM logits
    [B, N or L, V]): the discriminator-sized network with its MLM head; None without that head.
    """

    generator: Callable
    discriminator: Callable
    mlm: Callable | None


class StepPlan(NamedTuple):
    """What an objective sets for one train step, as a function of the (traced) step."""

    params: Any  # the parameters the loss and the update are taken at
    weights: dict  # the loss's weights: gen_weight, disc_weight and the objective's own
    updates: Callable  # optimizer updates -> the updates applied
    metrics: dict  # scalars the objective adds to the step's metrics


def plain_step(objective_cfg, step, params, weights: dict) -> StepPlan:
    """The step as the config gives it: the state's parameters and the configured weights."""
    return StepPlan(params, weights, lambda updates: updates, {})


class FlopParts(NamedTuple):
    """Forward FLOPs of the parts a step may run, for one batch (metrics.count_flops computes
    them from the model's shapes); an objective's `flops` adds up those it runs."""

    generator: int  # the generator's encoder at every token and its MLM head at the slots
    baseline: int  # the generator's 1-unit learned baseline at the slots
    discriminator: int  # the discriminator's encoder at every token
    rtd_head: int  # the replaced-token head (dense, then one unit) at every token
    mlm_head_slots: int  # the MLM head (dense to E, the tied output over V) at the slots
    mlm_head_tokens: int  # the MLM head at every token
    has_mlm_head: bool  # whether the model has that head (ElectraSpec.mlm_head)


def electra_corruption_probs(mask_token_prob: float) -> tuple[float, float]:
    """(share of chosen slots shown as [MASK], share given a random token): ELECTRA's
    (mask_token_prob, 0); the generator supplies the replacements."""
    return mask_token_prob, 0.0


@dataclasses.dataclass(frozen=True)
class Objective:
    """One pre-training objective: what the train step, the held-out evaluation and the FLOP
    count need of it. Every callable is a pure function of arrays, traced into the step.

    sums(batch, corruption, networks, keys, *, temperature, sampler) -> {name: sum}: the loss
      and metric sums of (part of) a batch, each a sum over its rows (keys: generator dropout,
      sampler, discriminator dropout);
    loss(sums, denominators, **weights) -> scalar: the loss from a part's sums and the whole
      batch's denominators (masked slots, real tokens), so accumulated micro-batches add up;
    metrics(sums, **weights) -> {name: scalar}: the logged scalars of a whole batch's sums;
    flops(FlopParts) -> (generator, discriminator): the forward FLOPs the step runs;
    corruption_probs(mask_token_prob) -> (share of [MASK], share of random tokens);
    begin_step(objective_cfg, step, params, weights) -> StepPlan: what changes with the step.
    """

    name: str
    sums: Callable
    loss: Callable
    metrics: Callable
    flops: Callable
    corruption_probs: Callable = electra_corruption_probs
    begin_step: Callable = plain_step
    mlm_head: bool = False  # the discriminator-sized network predicts tokens (an MLM head)
    policy_baseline: bool = False  # the generator has a learned baseline
    has_generator: bool = True  # the corruption comes from a generator
    trains_rtd_head: bool = True  # the replaced-token head is trained: evaluation reads it
    evaluates_mlm: bool = False  # the held-out evaluation reads the MLM head at the slots
    # ... of the masked ids, not of the text the discriminator reads (the generator's samples
    # in the slots): 'electra_mlm''s second pass; 'mlm' has no generator, so the same for it
    mlm_reads_masked: bool = False

    def needs_mlm_head(self, disc_mlm_weight: float = 0.0) -> bool:
        """Whether the model needs the MLM head: the objective's own, or the discriminator's
        MLM term (objective.disc_mlm_weight > 0 on 'electra')."""
        return self.mlm_head or disc_mlm_weight > 0

    def corrupt(
        self,
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
        """`corrupt` with this objective's shares of [MASK] and random tokens."""
        p_mask, p_random = self.corruption_probs(mask_token_prob)
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
