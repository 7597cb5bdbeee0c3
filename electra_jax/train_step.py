"""One optimizer step of ELECTRA pre-training, compiled once: train_step(state, batch)."""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from electra_jax import objective
from electra_jax.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electra_jax.model import Electra

SPECIAL_IDS = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer updates done
    params: Any
    opt_state: Any
    rng: jax.Array  # uint32[2]: the run's base key; step k uses fold_in(rng, k)


def init_state(model: Electra, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """Parameters, optimizer state and keys from one seed (jit it with out_shardings)."""
    from electra_jax.model import init_params

    init_rng, step_rng = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(model, init_rng)
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=step_rng
    )


def forward(params, batch, rng, *, model: Electra, objective_cfg: Any, num_slots: int, train: bool):
    """The ELECTRA loss of one batch: returns (loss, metrics)."""
    seg, mask = batch["segment_ids"], batch["input_mask"]
    det = not train

    def generator_fn(ids, positions, key):
        return model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            positions,
            det,
            rngs={"dropout": key},
            method=Electra.generator_logits,
        )

    def discriminator_fn(ids, key):
        return model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            det,
            rngs={"dropout": key},
            method=Electra.discriminator_logits,
        )

    return objective.electra_forward(
        rng,
        batch,
        generator_fn,
        discriminator_fn,
        mask_prob=objective_cfg.mask_prob,
        num_slots=num_slots,
        mask_id=MASK_ID,
        special_ids=SPECIAL_IDS,
        gen_weight=objective_cfg.gen_weight,
        disc_weight=objective_cfg.disc_weight,
        temperature=objective_cfg.temperature,
        mask_token_prob=objective_cfg.mask_token_prob,
        sampler=objective_cfg.sampler,
    )


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    model: Electra,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    objective_cfg: Any,
    num_slots: int,
):
    """One update of generator and discriminator together.

    batch: 'input_ids', 'segment_ids', 'input_mask', each [B, L] int32 (global arrays).
    Returns (new state, metrics dict of float32 scalars).
    """
    rng = jax.random.fold_in(state.rng, state.step)
    loss_fn = functools.partial(
        forward, model=model, objective_cfg=objective_cfg, num_slots=num_slots, train=True
    )
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def guarded_train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    nan_policy: str = "stop",
    debug_nan_at_step: int = -1,
    **step_kwargs,
):
    """train_step with a guard against non-finite updates, inside the same compiled program.

    Adds metrics["nonfinite"] (float32 1.0 when the loss or the gradient norm is NaN/Inf, else
    0.0). nan_policy 'skip' keeps the previous params and optimizer state for such a step while
    still advancing `step` (so the next step draws the next random stream and batch); 'stop'
    returns the update as computed and leaves stopping to the loop, which never saves it.
    debug_nan_at_step is a test hook: the update made from state.step == that value is
    poisoned as NaN gradients would poison it (loss, grad norm and new params NaN); -1 is off.
    """
    new_state, metrics = train_step(state, batch, **step_kwargs)
    metrics = dict(metrics)
    if debug_nan_at_step >= 0:
        poison = state.step == debug_nan_at_step
        nan_if = lambda x: (
            jnp.where(poison, jnp.nan, x) if jnp.issubdtype(x.dtype, jnp.inexact) else x
        )
        new_state = new_state.replace(params=jax.tree_util.tree_map(nan_if, new_state.params))
        metrics["loss"] = nan_if(metrics["loss"])
        metrics["grad_norm"] = nan_if(metrics["grad_norm"])
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    if nan_policy == "skip":
        keep = lambda new, old: jnp.where(finite, new, old)
        new_state = new_state.replace(
            params=jax.tree_util.tree_map(keep, new_state.params, state.params),
            opt_state=jax.tree_util.tree_map(keep, new_state.opt_state, state.opt_state),
        )
    metrics["nonfinite"] = 1.0 - finite.astype(jnp.float32)
    return new_state, metrics


def eval_step(params, batch, rng, *, model: Electra, objective_cfg: Any, num_slots: int):
    """Loss and metrics without dropout and without an update."""
    _, metrics = forward(
        params,
        batch,
        rng,
        model=model,
        objective_cfg=objective_cfg,
        num_slots=num_slots,
        train=False,
    )
    return metrics
