"""The paper's ablations of ELECTRA (Clark et al., 2020, section 3.2 and Table 5) that keep its
generator: ELECTRA 15% (the discriminator's loss at the masked slots only), Replace MLM and
All-Tokens MLM (the discriminator-sized network predicts tokens instead of telling replaced
ones).

Each `*_sums` has electra_sums' keys (zeros where the objective has no such part) plus, for
those whose network predicts tokens, mlm_loss / mlm_correct / mlm_count. `gen_count` is always
the number of masked slots. Losses are sums; each loss divides by the whole batch's (masked
slots, real tokens), so accumulated micro-batches stay exact. Shapes as in core.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from electra_jax.objectives.core import (
    FlopParts,
    LossSum,
    Objective,
    generate,
    mlm_loss,
    no_decisions,
    ratio,
    rtd_counts,
    zero,
)
from electra_jax.objectives.electra import electra_flops, metrics_with


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
    gen, corrupted, labels = generate(
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
    gen, corrupted, labels = generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    _, logits = mlm_fn(corrupted, m.positions, k_disc)
    loss, correct = mlm_loss(logits, m.targets, m.weights)
    return {
        **gen,
        "disc_loss": zero(),
        **no_decisions(batch["input_mask"], jnp.sum(labels)),
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
    gen, corrupted, labels = generate(
        batch, corruption, generator_fn, k_gen, k_sample, temperature, sampler
    )
    replaced_logits, logits = mlm_fn(corrupted, None, k_disc)
    loss, correct = copy_mlm_loss(logits, -replaced_logits, corrupted, ids, mask)
    return {
        **gen,
        "disc_loss": zero(),
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


def electra_15_loss(sums, denominators, *, gen_weight, disc_weight):
    """gen_weight x MLM mean + disc_weight x the RTD sum over the masked slots, per slot."""
    masked = jnp.maximum(denominators[0], 1.0)
    return gen_weight * sums["gen_loss"] / masked + disc_weight * sums["disc_loss"] / masked


def replaced_mlm_loss(sums, denominators, *, gen_weight, disc_weight):
    """gen_weight x the generator's MLM mean + 1 x the network's MLM mean over the slots."""
    masked = jnp.maximum(denominators[0], 1.0)
    return gen_weight * sums["gen_loss"] / masked + sums["mlm_loss"] / masked


def all_tokens_mlm_loss(sums, denominators, *, gen_weight, disc_weight):
    """gen_weight x the generator's MLM mean + 1 x the network's MLM mean over real tokens."""
    masked, tokens = (jnp.maximum(d, 1.0) for d in denominators)
    return gen_weight * sums["gen_loss"] / masked + sums["mlm_loss"] / tokens


def _electra_15_metrics(sums, **weights):
    out = metrics_with(electra_15_loss)(sums, **weights)
    out["disc_loss"] = ratio(sums["disc_loss"], sums["gen_count"])
    return out


def replaced_mlm_flops(p: FlopParts) -> tuple[int, int]:
    """The generator, and the MLM head at the slots (no replaced-token head: XLA drops it)."""
    return p.generator, p.discriminator + p.mlm_head_slots


def all_tokens_mlm_flops(p: FlopParts) -> tuple[int, int]:
    """The generator, the MLM head at every token and the replaced-token head (the copy
    probability) at every token."""
    return p.generator, p.discriminator + p.rtd_head + p.mlm_head_tokens


ELECTRA_15 = Objective(
    name="electra_15",
    sums=lambda batch, corruption, nets, keys, **kw: electra_15_sums(
        batch, corruption, nets.generator, nets.discriminator, keys, **kw
    ),
    loss=electra_15_loss,
    metrics=_electra_15_metrics,
    flops=electra_flops,
)

REPLACED_MLM = Objective(
    name="replaced_mlm",
    sums=lambda batch, corruption, nets, keys, **kw: replaced_mlm_sums(
        batch, corruption, nets.generator, nets.mlm, keys, **kw
    ),
    loss=replaced_mlm_loss,
    metrics=metrics_with(replaced_mlm_loss),
    flops=replaced_mlm_flops,
    mlm_head=True,
    trains_rtd_head=False,
    evaluates_mlm=True,
)

ALL_TOKENS_MLM = Objective(
    name="all_tokens_mlm",
    sums=lambda batch, corruption, nets, keys, **kw: all_tokens_mlm_sums(
        batch, corruption, nets.generator, nets.mlm, keys, **kw
    ),
    loss=all_tokens_mlm_loss,
    metrics=metrics_with(all_tokens_mlm_loss),
    flops=all_tokens_mlm_flops,
    mlm_head=True,
)
