"""A fine-tuning's training: the learning rate and layer decay (the config's or the ELECTRA
paper's), the batch order, AdamW with layer-wise learning rates, the compiled step and the loop
over the steps (log lines, NaN/Inf checks, checkpoints, preemption).

Each step runs forward, loss and the AdamW update in one compiled program, data-parallel over
the local devices. Step s reads batch s of `batch_order` and dropout key fold_in(rng, s), so a
run stopped and resumed from its checkpoint takes the steps of one that ran through.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.finetune import checks
from electra_jax.finetune.family import ORDER_STREAM
from electra_jax.model import sharding
from electra_jax.model.optim import TrainState, layerwise_lr_multipliers, make_finetune_optimizer
from electra_jax.model.sharding import log
from electra_jax.store import checkpointing

# The ELECTRA paper's fine-tuning learning rate and layer-wise decay by model size (its Table 7),
# keyed by the discriminator's hidden size. (The released code's default learning rate is 1e-4
# for Small and Base alike; the table gives Small 3e-4.)
PAPER_HYPERPARAMETERS = (
    # name, hidden size, learning rate, layer decay
    ("Small", 256, 3e-4, 0.8),
    ("Base", 768, 1e-4, 0.8),
    ("Large", 1024, 5e-5, 0.9),
)


def paper_hyperparameters(hidden_size: int) -> tuple[str, int, float, float]:
    """(size name, its hidden size, learning rate, layer decay) of the paper's model size nearest
    to hidden_size, by ratio (128 -> Small, 512 -> Base): the ELECTRA paper's Table 7."""
    return min(PAPER_HYPERPARAMETERS, key=lambda row: abs(math.log(hidden_size / row[1])))


def resolve_hyperparameters(config, hidden_size: int) -> dict:
    """The learning rate and layer decay a run uses: the config's, or where it says 0 the
    paper's for the model's size; each with its source ('config', or 'paper: ELECTRA-Small' and
    the like, noting when the model's width is not one of the paper's)."""
    name, size, lr, decay = paper_hyperparameters(hidden_size)
    paper = f"paper: ELECTRA-{name}"
    if size != hidden_size:
        paper += f", the nearest size to hidden {hidden_size}"
    out = {}
    for key, default in (("learning_rate", lr), ("layer_decay", decay)):
        given = float(config[key])
        out[key] = given or default
        out[f"{key}_source"] = "config" if given else paper
    return out


def batch_order(num_examples: int, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
    """[num_steps, batch_size] example indices: epoch after epoch, each a fresh permutation.

    Batches run across epoch boundaries (the original repeats and shuffles the data), so every
    batch is full and the step count is int(examples x epochs / batch), at least 1. Step s reads
    row s whether the run went through or was resumed.
    """
    rng = np.random.default_rng([seed & (2**63 - 1), ORDER_STREAM])
    need = num_steps * batch_size
    perms = [rng.permutation(num_examples) for _ in range(math.ceil(need / num_examples))]
    return np.concatenate(perms)[:need].reshape(num_steps, batch_size)


def optimizer_and_state(
    config, params, spec, num_steps: int, layer_decay, learning_rate, dropout_rng, mesh
):
    """(optimizer, schedule, initial TrainState replicated over `mesh`) of a fine-tuning run:
    AdamW with the layer-wise learning rates over `params`, warm-up of config.warmup_fraction
    of `num_steps`, then linear decay (GLUE and SQuAD alike)."""
    multipliers = layerwise_lr_multipliers(
        params, spec.discriminator.num_layers, layer_decay, config.layer_decay_exponents
    )
    tx, schedule = make_finetune_optimizer(
        learning_rate,
        num_steps,
        int(config.warmup_fraction * num_steps),
        multipliers,
        weight_decay=config.weight_decay,
        eps=config.adam_eps,
        clip_norm=config.clip_norm,
        bias_correction=config.adam_bias_correction,
    )
    state = TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng
    )
    return tx, schedule, jax.device_put(state, sharding.replicated(mesh))


def train_step(state: TrainState, batch: dict, *, loss_fn, tx, schedule):
    """One AdamW update on a batch; loss_fn(params, batch, rng) is the family's loss.

    Dropout's key is fold_in(state.rng, step). Returns (new state, float32 scalar metrics).
    """
    rng = jax.random.fold_in(state.rng, state.step)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch, rng))(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1,
        params=optax.apply_updates(state.params, updates),
        opt_state=opt_state,
    )
    metrics = {
        "loss": loss,
        "grad_norm": optax.global_norm(grads),
        "learning_rate": jnp.asarray(schedule(state.step), jnp.float32),
    }
    return new_state, metrics


def window_loss(history: np.ndarray, done: int, log_every: int) -> float:
    """The mean training loss of the log window that ends at step `done` (windows end at the
    multiples of log_every and at the last step); history: [num_steps, 2] (loss, grad norm)."""
    start = ((done - 1) // log_every) * log_every
    return float(np.mean(history[start:done, 0].astype(np.float64)))


def run_steps(step_fn, state, take, *, first, last, num_steps, history, config, rate, unit, save):
    """Runs steps first..last-1 of `num_steps` on `take(step)`'s batches; returns (state, the
    step count done, whether a termination signal stopped it).

    The losses and gradient norms are read (and checked for NaN/Inf: NonFiniteError) only for
    the log lines (every config.log_every_steps and the last step) and before each checkpoint
    (every config.checkpoint.every_steps, at `last`, and when SIGTERM / SIGINT asks to stop); they
    go into `history` ([num_steps, 2], saved with every checkpoint, so a resumed run logs and
    reports the losses of one that ran through). `save(done, state)` writes a checkpoint.
    """
    watcher = checkpointing.PreemptionWatcher()
    try:
        if first < last:
            t0 = time.time()
            with watcher.deferred():
                step_fn = step_fn.lower(state, take(first)).compile()
            log(f"compiled the train step in {time.time() - t0:.1f}s")
        watcher.arm()
        pending: list[Any] = []  # device (loss, grad norm) since the last read
        last_time = steps_started = time.time()
        since_log, done, stopped = 0, first, False
        for step in range(first, last):
            state, step_metrics = step_fn(state, take(step))
            pending.append((step_metrics["loss"], step_metrics["grad_norm"]))
            done, since_log = step + 1, since_log + 1
            stopped = watcher.requested(done)
            logs = done % config.log_every_steps == 0 or done == num_steps
            saves = done % config.checkpoint.every_steps == 0 or done == last or stopped
            if logs or saves:
                values = np.asarray(jax.device_get(pending), np.float64)  # [steps, 2]
                checks.check_finite_losses(values, done - len(pending) + 1, rate)
                history[done - len(pending) : done] = values
                pending = []
            if logs:
                now = time.time()
                speed = since_log * config.batch_size / max(now - last_time, 1e-9)
                left = (num_steps - done) * (now - steps_started) / (done - first)
                log(
                    f"step {done}/{num_steps}  "
                    f"loss {window_loss(history, done, config.log_every_steps):.4f}  "
                    f"lr {float(step_metrics['learning_rate']):.2e}  {speed:.0f} {unit}/s  "
                    f"eta {time.strftime('%H:%M:%S', time.gmtime(left))}"
                )
                last_time, since_log = now, 0
            if saves:
                save(done, state)
            if stopped:
                log(f"preempted at step {done}; checkpoint saved; run the same command to resume")
                break
        return state, done, stopped
    finally:
        watcher.close()


def compiled_steps(family, config, task, model, tx, schedule, mesh):
    """(train step, prediction step) of `model`, jitted over `mesh`: the state and params
    replicated, each batch split over the data-parallel devices; the train step donates its
    state (family.loss and family.predict_step give the numbers)."""
    replicated, split_batch = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    loss_fn = functools.partial(family.loss, config, task, model)
    step_fn = jax.jit(
        functools.partial(train_step, loss_fn=loss_fn, tx=tx, schedule=schedule),
        in_shardings=(replicated, split_batch),
        out_shardings=(replicated, replicated),
        donate_argnums=(0,),
    )
    predict_fn = jax.jit(
        functools.partial(family.predict_step, config, task, model),
        in_shardings=(replicated, split_batch),
        out_shardings=replicated,
    )
    return step_fn, predict_fn
