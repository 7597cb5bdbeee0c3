"""Held-out evaluation during pre-training, as one compiled program over the held-out batches.

As the original ELECTRA's `do_eval`, without dropout and without an update, on rows the run
never trains on (data/heldout.py). What it reads, and why:

- `disc_auc`: the area under the ROC curve of the replaced-token logits over every real token.
  It shows learning that the 0.5 threshold of accuracy and recall hides: a discriminator whose
  every logit stays below 0 (recall 0, loss at the prior) may still rank replaced tokens first.
- `disc_auc_frequent`: the same AUC over the positions whose token, as the discriminator sees
  it, is one of the frequent pieces that make half of the corpus's tokens. A rare replacement is
  told by its rarity; a frequent one only by its context. This is the reading of context.
- `disc_auc_unigram`: the AUC over the same masked positions filled instead with pieces drawn
  from the corpus's unigram distribution (data/heldout.unigram_cdf), with the same uniforms.
  The run's own generator gets better as it trains, so its replacements get harder to spot and
  `disc_auc` can fall while the discriminator does not get worse; this corruption stays the
  same for every step, run and seed of one corpus, so a fall here is the discriminator's own.
- `disc_loss` beside `disc_prior_entropy`, the loss of the best constant guess (the binary
  entropy of the replaced fraction), and `disc_loss_gain`, 1 - loss / prior entropy.
- `disc_accuracy`, `disc_precision`, `disc_recall` at the 0.5 threshold; `gen_loss`,
  `gen_accuracy` (argmax) and `gen_sampled_accuracy` (the sample is the original token).
- `collapse_cosine`: the mean cosine between the discriminator's final states of different
  tokens of the clean (uncorrupted) text, special tokens left out; fine-tuning inherits states
  that all point one way (about 0.3 at initialisation for the tiny model).

The corruption is drawn from a fixed key (`EVAL_KEY`), not the run's seed: every evaluation of
every run on the same data masks the same positions with the same uniforms, so curves compare
across steps and seeds. Replacements are sampled at temperature 1, the distribution the paper's
discriminator meets, whatever temperature the run trains at.

Shapes: E held-out batches, B rows, L tokens, N mask slots, V pieces, H width.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from electra_jax.objectives.core import (
    Objective,
    mlm_loss,
    mlm_loss_and_probs,
    replace_tokens,
    rtd_counts,
    rtd_loss,
    sample_replacements,
    unigram_draws,
)

EVAL_KEY = 0x5EED  # the evaluation's corruption key: fixed, the same for every run and seed

# The held-out scalars, in the order the progress line and the docs show them.
DISC_KEYS = (
    "disc_auc",
    "disc_auc_frequent",
    "disc_loss",
    "disc_prior_entropy",
    "disc_loss_gain",
    "disc_accuracy",
    "disc_precision",
    "disc_recall",
    "replaced_fraction",
    "frequent_fraction",
)
GEN_KEYS = ("gen_loss", "gen_accuracy", "gen_sampled_accuracy")
UNIGRAM_KEYS = ("disc_auc_unigram",)  # where the evaluation is given the unigram distribution
MLM_KEYS = ("mlm_loss", "mlm_accuracy")
COLLAPSE_WARNING = 0.8  # collapse_cosine above this gets one warning line


def roc_auc(scores, labels, weights):
    """The area under the ROC curve of `scores` for `labels`, ties counted half: a float32
    scalar, NaN when there is no positive or no negative.

    scores, labels, weights: arrays of one shape (labels 1 = positive, weights 0 = left out).
    Exact (the Mann-Whitney statistic): each positive counts the negatives it outscores, found
    by bisection in the sorted negatives, so it costs a sort, not a [P, N] table.
    """
    scores = scores.astype(jnp.float32).ravel()
    used = weights.ravel() > 0
    positive = used & (labels.ravel() > 0.5)
    negative = used & ~positive
    ranked = jnp.sort(jnp.where(negative, scores, jnp.inf))  # left out: past every score
    below = jnp.searchsorted(ranked, scores, side="left").astype(jnp.float32)
    upto = jnp.searchsorted(ranked, scores, side="right").astype(jnp.float32)
    wins = jnp.sum(jnp.where(positive, below + 0.5 * (upto - below), 0.0))
    pairs = jnp.sum(positive.astype(jnp.float32)) * jnp.sum(negative.astype(jnp.float32))
    return jnp.where(pairs > 0, wins / jnp.maximum(pairs, 1.0), jnp.nan)


def cosine_sums(hidden, weights):
    """(sum of cos(h_i, h_j) over the ordered pairs i != j of weighted tokens, their number):
    hidden [B, L, H], weights [B, L] -> two float32 scalars, over all tokens of the batch.

    With unit vectors u_i, sum_{i != j} u_i . u_j = |sum_i u_i|^2 - n: one sum, no [T, T] matrix.
    """
    h = hidden.astype(jnp.float32).reshape(-1, hidden.shape[-1])
    w = weights.reshape(-1).astype(jnp.float32)
    unit = h * jax.lax.rsqrt(jnp.maximum(jnp.sum(h * h, axis=-1, keepdims=True), 1e-30))
    total = jnp.sum(unit * w[:, None], axis=0)
    n = jnp.sum(w)
    return jnp.sum(total * total) - n, n * (n - 1.0)


def binary_entropy(p):
    """-(p log p + (1 - p) log(1 - p)) in nats, 0 at p = 0 or 1."""
    p = jnp.clip(p, 0.0, 1.0)
    xlogx = lambda x: jnp.where(x > 0, x * jnp.log(jnp.maximum(x, 1e-30)), 0.0)
    return -(xlogx(p) + xlogx(1.0 - p))


def _text_tokens(batch, special_ids):
    """1.0 at the real tokens that are not special ([CLS], [SEP], [MASK], [PAD]): [B, L]."""
    ids = batch["input_ids"]
    special = jnp.isin(ids, jnp.asarray(special_ids, ids.dtype))
    return ((batch["input_mask"] > 0) & ~special).astype(jnp.float32)


def batch_outputs(
    batch,
    key,
    frequent,
    networks: dict,
    *,
    objective: Objective,
    mask_prob: float,
    num_slots: int,
    mask_id: int,
    special_ids: tuple[int, ...],
    mask_token_prob: float,
    vocab_size: int,
    unigram_cdf=None,
) -> tuple[dict, dict]:
    """One held-out batch: (sums to add over batches, per-token arrays [B, L] for the AUCs).

    networks: what `objective` has, closing over the params, without dropout:
    'generator' (masked ids [B, L], positions [B, N]) -> logits [B, N, V];
    'discriminator' (ids) -> (states [B, L, H], replaced logits [B, L]);
    'mlm' (ids, positions) -> (replaced logits [B, L], MLM logits [B, N, V]).
    The discriminator's readings come only where the objective trains the replaced-token head
    (Objective.trains_rtd_head), the MLM head's where it reads it at the masked slots
    (Objective.evaluates_mlm: over the text the discriminator reads, or the masked ids with
    Objective.mlm_reads_masked). frequent: bool [V], the frequent pieces
    (data/heldout.frequent_pieces). unigram_cdf: float32 [V] (data/heldout.unigram_cdf) or
    None (no `disc_auc_unigram`).
    """
    ids, mask = batch["input_ids"], batch["input_mask"]
    c = objective.corrupt(
        key,
        batch,
        mask_prob=mask_prob,
        num_slots=num_slots,
        mask_id=mask_id,
        special_ids=special_ids,
        mask_token_prob=mask_token_prob,
        vocab_size=vocab_size,
    )
    m = c.masked
    sums: dict[str, Any] = {"slots": jnp.sum(m.weights)}
    tokens: dict[str, Any] = {}
    seen = m.input_ids  # what the discriminator-sized network reads: MLM reads the masked ids
    if "generator" in networks:
        logits = networks["generator"](m.input_ids, m.positions)
        gen, gen_correct, probs = mlm_loss_and_probs(logits, m.targets, m.weights)
        samples = sample_replacements(None, logits, 1.0, "inverse_cdf", c.uniform, probs)
        seen, labels = replace_tokens(ids, mask, m.positions, m.weights, samples)
        same = (samples == m.targets).astype(jnp.float32) * m.weights
        sums.update(gen_loss=gen.total, gen_correct=gen_correct.total, gen_same=jnp.sum(same))
    if objective.trains_rtd_head and "generator" in networks:
        _, replaced_logits = networks["discriminator"](seen)
        real = (mask > 0).astype(jnp.float32)
        disc = rtd_loss(replaced_logits, labels, mask)
        counts = rtd_counts(replaced_logits, labels, mask)
        is_frequent = frequent[seen].astype(jnp.float32) * real
        sums.update(disc_loss=disc.total, frequent=jnp.sum(is_frequent), **counts)
        tokens.update(logits=replaced_logits, labels=labels, real=real, frequent=is_frequent)
        if unigram_cdf is not None:
            # The same slots and uniforms, the pieces drawn from the corpus's distribution.
            drawn = unigram_draws(c.uniform, unigram_cdf, vocab_size)
            plain, plain_labels = replace_tokens(ids, mask, m.positions, m.weights, drawn)
            _, tokens["unigram_logits"] = networks["discriminator"](plain)
            tokens["unigram_labels"] = plain_labels
    if objective.evaluates_mlm and "mlm" in networks:
        read = m.input_ids if objective.mlm_reads_masked else seen
        _, mlm_logits = networks["mlm"](read, m.positions)
        mlm, mlm_correct = mlm_loss(mlm_logits, m.targets, m.weights)
        sums.update(mlm_loss=mlm.total, mlm_correct=mlm_correct.total)
    clean, _ = networks["discriminator"](ids)
    sums["cosine"], sums["pairs"] = cosine_sums(clean, _text_tokens(batch, special_ids))
    return sums, tokens


def _ratio(a, b):
    return a / jnp.maximum(b, 1.0)


def metrics_from(sums: dict, tokens: dict) -> dict:
    """The held-out scalars (float32) from the batches' summed `sums` and stacked `tokens`
    ([E, B, L] each); only the keys the objective's networks give (see the module's list)."""
    out = {"collapse_cosine": _ratio(sums["cosine"], sums["pairs"])}
    if "gen_loss" in sums:
        out["gen_loss"] = _ratio(sums["gen_loss"], sums["slots"])
        out["gen_accuracy"] = _ratio(sums["gen_correct"], sums["slots"])
        out["gen_sampled_accuracy"] = _ratio(sums["gen_same"], sums["slots"])
    if "disc_loss" in sums:
        replaced = _ratio(sums["replaced"], sums["tokens"])
        loss = _ratio(sums["disc_loss"], sums["tokens"])
        prior = binary_entropy(replaced)
        out.update(
            disc_auc=roc_auc(tokens["logits"], tokens["labels"], tokens["real"]),
            disc_auc_frequent=roc_auc(tokens["logits"], tokens["labels"], tokens["frequent"]),
            disc_loss=loss,
            disc_prior_entropy=prior,
            disc_loss_gain=1.0 - loss / jnp.maximum(prior, 1e-12),
            disc_accuracy=_ratio(sums["correct"], sums["tokens"]),
            disc_precision=_ratio(sums["true_positive"], sums["predicted"]),
            disc_recall=_ratio(sums["true_positive"], sums["replaced"]),
            replaced_fraction=replaced,
            frequent_fraction=_ratio(sums["frequent"], sums["tokens"]),
        )
    if "unigram_logits" in tokens:
        out["disc_auc_unigram"] = roc_auc(
            tokens["unigram_logits"], tokens["unigram_labels"], tokens["real"]
        )
    if "mlm_loss" in sums:
        out["mlm_loss"] = _ratio(sums["mlm_loss"], sums["slots"])
        out["mlm_accuracy"] = _ratio(sums["mlm_correct"], sums["slots"])
    return out


def evaluate_batches(batches, frequent, networks_of, unigram_cdf=None, **outputs_kwargs) -> dict:
    """Every held-out batch, then the scalars: batches dict of [E, B, L] arrays; networks_of(
    batch) gives batch_outputs' networks for one [B, L] batch (they close over its segments and
    padding). Batch e uses fold_in(PRNGKey(EVAL_KEY), e). Returns metrics_from's dict."""
    base = jax.random.PRNGKey(EVAL_KEY)

    def one(e, batch):
        key = jax.random.fold_in(base, e)
        return batch_outputs(
            batch, key, frequent, networks_of(batch), unigram_cdf=unigram_cdf, **outputs_kwargs
        )

    count = next(iter(batches.values())).shape[0]
    indices = jnp.arange(count)
    sums, tokens = jax.lax.map(lambda xs: one(*xs), (indices, batches))
    sums = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), sums)
    return metrics_from(sums, tokens)
