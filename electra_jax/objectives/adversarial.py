"""Adversarial ELECTRA (the paper's Appendix F): the generator is trained to fool the
discriminator, by the policy gradient, after a maximum-likelihood warm start of
objective.mle_warmup_steps steps. Shapes as in core.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from electra_jax.objectives.core import (
    FlopParts,
    Objective,
    StepPlan,
    mlm_loss_and_probs,
    plain_step,
    ratio,
    replace_tokens,
    rtd_counts,
    rtd_loss,
    sample_replacements,
)
from electra_jax.objectives.electra import electra_flops, metrics_with

# The generator is trained to maximise the
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


def adversarial_loss(sums, denominators, *, gen_weight: float, disc_weight: float, adversarial=1.0):
    """electra_loss with the generator's MLM term replaced by its policy-gradient surrogate
    where `adversarial` is 1 (0: the maximum-likelihood warm start), plus the baseline's
    cross-entropy, both means over masked slots."""
    masked, tokens = (jnp.maximum(d, 1.0) for d in denominators)
    mle, policy = sums["gen_loss"], sums["policy_loss"]
    generator = adversarial * policy + (1.0 - adversarial) * mle + sums["baseline_loss"]
    return gen_weight * generator / masked + disc_weight * sums["disc_loss"] / tokens


def _metrics(sums, **weights):
    """metrics_with's, plus reward, policy_loss and baseline_loss (means over masked slots)."""
    out = metrics_with(adversarial_loss)(sums, **weights)
    for key in ("reward", "policy_loss", "baseline_loss"):
        out[key] = ratio(sums[key], sums["gen_count"])
    return out


def adversarial_flops(p: FlopParts) -> tuple[int, int]:
    """What 'electra' runs, plus the generator's 1-unit baseline at the slots."""
    gen, disc = electra_flops(p)
    return gen + p.baseline, disc


def _begin_step(objective_cfg, step, params, weights: dict) -> StepPlan:
    """The generator's maximum-likelihood warm start, then the policy gradient: the weight
    `adversarial` (0, then 1), logged as policy_gradient."""
    warm = objective_cfg.mle_warmup_steps
    adversarial = (step >= warm).astype(jnp.float32)
    plan = plain_step(objective_cfg, step, params, {**weights, "adversarial": adversarial})
    return plan._replace(metrics={"policy_gradient": adversarial})  # 0 during the warm start


ADVERSARIAL = Objective(
    name="adversarial",
    sums=lambda batch, corruption, nets, keys, **kw: adversarial_sums(
        batch, corruption, nets.generator, nets.discriminator, keys, **kw
    ),
    loss=adversarial_loss,
    metrics=_metrics,
    flops=adversarial_flops,
    begin_step=_begin_step,
    policy_baseline=True,
)
