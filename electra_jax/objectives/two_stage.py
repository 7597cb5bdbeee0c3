"""The paper's Two-Stage ELECTRA (Section 3.2): the generator alone with the MLM loss for
objective.two_stage_steps steps; then the discriminator, initialised from the generator's
weights (so the two are the same size), with the generator frozen.

Both stages are one run: the stage is a function of the step, inside the compiled step, so a
resume on either side of the switch continues exactly. The sums, loss and metrics are ELECTRA's,
its two weights switched by the step. The embeddings are one block shared by both networks, so
in the second stage they train with the discriminator.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from electra_jax.objectives import electra
from electra_jax.objectives.core import Objective, StepPlan

# The generator's own parameters: frozen in the second stage.
GENERATOR_ONLY = (
    "generator",
    "generator_predictions_dense",
    "generator_predictions_LayerNorm",
    "generator_lm_head_bias",
)


def two_stage_weights(second, *, gen_weight: float, disc_weight: float) -> dict:
    """The loss weights: the generator's MLM loss alone in the first stage, the discriminator's
    loss alone in the second (`second`, a boolean scalar); float32 scalars."""
    return {
        "gen_weight": jnp.where(second, 0.0, gen_weight),
        "disc_weight": jnp.where(second, disc_weight, 0.0),
    }


def discriminator_from_generator(params: dict, at) -> dict:
    """`params` with the discriminator's encoder replaced by the generator's where `at` (a
    boolean scalar) is true: the second stage's initialisation. The two encoders must have the
    same shapes (validate.check_config refuses 'two_stage' otherwise)."""
    copied = jax.tree_util.tree_map(
        lambda g, d: jnp.where(at, g, d), params["generator"], params["discriminator"]
    )
    return {**params, "discriminator": copied}


def frozen_generator(updates: dict, frozen) -> dict:
    """`updates` with those of GENERATOR_ONLY zeroed where `frozen` (a boolean scalar) is true,
    weight decay included: the generator does not move in the second stage."""
    return {
        k: jax.tree_util.tree_map(lambda u: jnp.where(frozen, jnp.zeros_like(u), u), v)
        if k in GENERATOR_ONLY
        else v
        for k, v in updates.items()
    }


def _begin_step(objective_cfg, step, params, weights: dict) -> StepPlan:
    """At the switch the discriminator starts from the generator; from it on, the weights are
    the second stage's and the generator's updates are zeroed. Logs the stage (1 or 2)."""
    switch = objective_cfg.two_stage_steps
    second = step >= switch  # the discriminator's stage
    return StepPlan(
        params=discriminator_from_generator(params, step == switch),
        weights=two_stage_weights(second, **weights),
        updates=functools.partial(frozen_generator, frozen=second),
        metrics={"stage": jnp.where(second, 2.0, 1.0)},
    )


TWO_STAGE = Objective(
    name="two_stage",
    sums=electra.ELECTRA.sums,
    loss=electra.electra_loss,
    metrics=electra.electra_metrics,
    flops=electra.electra_flops,  # both networks run every step (the idle one's loss weighted 0)
    begin_step=_begin_step,
)
