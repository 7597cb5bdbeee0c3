"""ELECTRA's objective (Clark et al., 2020): a small generator fills the masked slots, the
discriminator tells every token replaced or original, and the loss is
gen_weight x MLM mean + disc_weight x RTD mean.

With objective.disc_mlm_weight > 0 the discriminator also predicts the original tokens at the
masked slots (its MLM head, in the same pass), a term that fades to 0 over
objective.disc_mlm_steps (0: constant). Shapes as in core.py.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from electra_jax.objectives.core import (
    Corruption,
    FlopParts,
    Networks,
    Objective,
    StepPlan,
    generate,
    mlm_loss,
    plain_step,
    ratio,
    rtd_counts,
    rtd_loss,
    schedule_value,
)


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
    gen, corrupted, labels = generate(
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
    out = electra_scalars(sums)
    out["loss"] = electra_loss(sums, denominators, **weights, disc_mlm_weight=disc_mlm_weight)
    if "disc_mlm_loss" in sums:
        out["disc_mlm_loss"] = ratio(sums["disc_mlm_loss"], sums["gen_count"])
        out["disc_mlm_accuracy"] = ratio(sums["disc_mlm_correct"], sums["gen_count"])
        out["disc_mlm_weight"] = jnp.asarray(disc_mlm_weight, jnp.float32)
    return out


def electra_scalars(sums) -> dict[str, jax.Array]:
    return {
        "gen_loss": ratio(sums["gen_loss"], sums["gen_count"]),
        "disc_loss": ratio(sums["disc_loss"], sums["tokens"]),
        "gen_accuracy": ratio(sums["gen_correct"], sums["gen_count"]),
        "disc_accuracy": ratio(sums["correct"], sums["tokens"]),
        "disc_precision": ratio(sums["true_positive"], sums["predicted"]),
        "disc_recall": ratio(sums["true_positive"], sums["replaced"]),
        "replaced_fraction": ratio(sums["replaced"], sums["tokens"]),
        "masked_fraction": ratio(sums["gen_count"], sums["tokens"]),
    }


def electra_flops(p: FlopParts) -> tuple[int, int]:
    """The generator (its head at the N masked slots) and the discriminator with its
    replaced-token head at every token; with the MLM head (the discriminator's MLM term), that
    head at the slots too. The MLM head counts with the discriminator, as in
    `model.network_param_counts`."""
    disc = p.discriminator + p.rtd_head
    if p.has_mlm_head:  # 'electra' with the discriminator's MLM term (disc_mlm_weight > 0)
        disc += p.mlm_head_slots
    return p.generator, disc


def _sums(batch, corruption, nets: Networks, keys, *, temperature, sampler):
    # The model has the MLM head, for 'electra', exactly when objective.disc_mlm_weight > 0.
    return electra_sums(
        batch,
        corruption,
        nets.generator,
        nets.discriminator,
        keys,
        temperature=temperature,
        sampler=sampler,
        disc_mlm_fn=nets.mlm,
    )


def _begin_step(objective_cfg, step, params, weights: dict) -> StepPlan:
    """The discriminator's MLM weight, faded to 0 over objective.disc_mlm_steps when set."""
    plan = plain_step(objective_cfg, step, params, weights)
    if objective_cfg.disc_mlm_weight > 0:
        w, fade = objective_cfg.disc_mlm_weight, objective_cfg.disc_mlm_steps
        weights = {**weights, "disc_mlm_weight": schedule_value(0.0, w, fade, step) if fade else w}
        plan = plan._replace(weights=weights)
    return plan


ELECTRA = Objective(
    name="electra",
    sums=_sums,
    loss=electra_loss,
    metrics=electra_metrics,
    flops=electra_flops,
    begin_step=_begin_step,
)


def metrics_with(loss: Callable) -> Callable:
    """The metrics of an objective built on ELECTRA's parts: electra_metrics' keys (zero where
    the objective has no such part) with `loss` (the objective's, given the weights the step
    gives it) as "loss", plus mlm_loss and mlm_accuracy where the sums hold the network's MLM
    loss."""

    def metrics(sums, *, gen_weight, disc_weight, **weights) -> dict[str, jax.Array]:
        out = electra_metrics(sums, gen_weight=gen_weight, disc_weight=disc_weight)
        denominators = (sums["gen_count"], sums["tokens"])
        out["loss"] = loss(
            sums, denominators, gen_weight=gen_weight, disc_weight=disc_weight, **weights
        )
        if "mlm_loss" in sums:
            out["mlm_loss"] = ratio(sums["mlm_loss"], sums["mlm_count"])
            out["mlm_accuracy"] = ratio(sums["mlm_correct"], sums["mlm_count"])
        return out

    return metrics
