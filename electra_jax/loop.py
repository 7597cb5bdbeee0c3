"""The pre-training loop: train(config, workdir), in sections.

mesh -> data -> state -> restore -> compile -> steps (log, save). Re-running with the same workdir
resumes from the newest checkpoint: same parameters, optimizer state, data position and random
stream, so the resumed run logs what the uninterrupted one would have.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import jax
import ml_collections

from electra_jax import checkpointing, metrics, objective, sharding, validate
from electra_jax.model import Electra, network_param_counts, spec_from_config
from electra_jax.optim import make_optimizer
from electra_jax.train_step import init_state, train_step


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _check_workdir(workdir: str) -> None:
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise validate.ConfigError(
            f"workdir {workdir} is not writable ({e.strerror}); choose another --workdir"
        ) from e


def build(config: ml_collections.ConfigDict, vocab_size: int):
    """The model, optimizer, schedule and mask-slot count a config describes."""
    spec = spec_from_config(config.model, config.generator, vocab_size)
    model = Electra(spec)
    tx, schedule = make_optimizer(config.train)
    num_slots = objective.num_mask_slots(config.data.seq_length, config.objective.mask_prob)
    return spec, model, tx, schedule, num_slots


def describe(config: ml_collections.ConfigDict, vocab_size: int | None = None) -> dict:
    """The dry run's summary: parameter counts and FLOPs, from shapes only (nothing allocated)."""
    vocab_size = vocab_size or config.data.vocab_size
    spec, model, tx, _, num_slots = build(config, vocab_size)
    abstract = jax.eval_shape(functools.partial(init_state, model, tx, config.seed))
    counts = network_param_counts(abstract.params)
    flops = metrics.count_flops(spec, config.train.batch_size, config.data.seq_length, num_slots)
    return {
        "discriminator_params": counts["discriminator"],
        "generator_params": counts["generator"],
        "total_params": counts["total"],
        "generator_hidden_size": spec.generator.hidden_size,
        "generator_num_heads": spec.generator.num_heads,
        "batch_size": config.train.batch_size,
        "seq_length": config.data.seq_length,
        "learning_rate": config.train.learning_rate,
        "mask_prob": config.objective.mask_prob,
        "mask_slots": num_slots,
        "flops_per_step": flops["total"],
    }


def train(config: ml_collections.ConfigDict, workdir: str, stop_after: int | None = None) -> dict:
    """Pre-trains until config.train.num_steps; returns the last logged metrics row.

    `stop_after` ends the run early at that step (with a checkpoint), as an interruption would,
    without changing the schedule: a later call resumes and finishes the same run.
    """
    from electra_jax.data import pipeline, prepare

    validate.check_config(config)
    _check_workdir(workdir)

    # ---------------------------------------------------------------- mesh
    mesh = sharding.make_mesh(config.mesh)
    validate.check_batch(
        config.train.batch_size, sharding.data_parallel_size(mesh), jax.process_count()
    )
    is_main = jax.process_index() == 0

    # ---------------------------------------------------------------- data
    tokenizer = prepare.ensure_tokenizer(
        config.data, os.path.join(workdir, "tokenizer"), config.seed
    )
    cache_dir = config.data.cache_dir or os.path.join(workdir, "data")
    prepared = prepare.prepare(config.data, tokenizer, cache_dir, config.seed)
    data_iter = pipeline.make_iterator(
        prepared,
        config.train.batch_size,
        config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )

    # ---------------------------------------------------------------- state
    spec, model, tx, schedule, num_slots = build(config, tokenizer.vocab_size)
    make_state = functools.partial(init_state, model, tx, config.seed)
    abstract = jax.eval_shape(make_state)
    state_sharding = jax.tree_util.tree_map(lambda _: sharding.replicated(mesh), abstract)

    # ---------------------------------------------------------------- restore
    manager = checkpointing.make_manager(workdir, config.checkpoint)
    state = checkpointing.restore_latest(
        manager, checkpointing.abstract_with_shardings(abstract, state_sharding), data_iter
    )
    if state is None:
        state = jax.jit(make_state, out_shardings=state_sharding)()
        if is_main:
            _write_json_atomic(os.path.join(workdir, "config.json"), config.to_dict())
        start_step = 0
    else:
        start_step = int(jax.device_get(state.step))
        metrics.log(f"resumed from checkpoint {start_step} in {workdir}")
    writer = metrics.MetricsWriter(workdir, is_main, resume_step=start_step)

    # ---------------------------------------------------------------- compile
    step_fn = jax.jit(
        functools.partial(
            train_step,
            model=model,
            tx=tx,
            schedule=schedule,
            objective_cfg=config.objective,
            num_slots=num_slots,
        ),
        in_shardings=(state_sharding, sharding.batch_sharding(mesh)),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=(0,),
    )
    num_steps = config.train.num_steps
    last_step = num_steps if stop_after is None else min(num_steps, stop_after)
    batch = sharding.global_batch(next(data_iter), mesh) if start_step < last_step else None
    t0 = time.time()
    compiled = step_fn.lower(state, batch).compile() if batch is not None else None
    if compiled is not None:
        metrics.log(f"compiled the train step in {time.time() - t0:.1f}s")

    # ---------------------------------------------------------------- steps
    tokens_per_step = config.train.batch_size * config.data.seq_length
    flops_per_step = metrics.count_flops(
        spec, config.train.batch_size, config.data.seq_length, num_slots
    )["total"]
    peak = metrics.peak_flops_per_device(jax.devices()[0].device_kind, config.log.peak_flops)
    run_start = last_time = time.time()
    last_logged = start_step
    row: dict = {}
    for step in range(start_step, last_step):
        state, step_metrics = compiled(state, batch)
        done = step + 1

        # ------------------------------------------------------------ log
        if done % config.log.every_steps == 0 or done == num_steps:
            row = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            now = time.time()
            steps_done = done - last_logged
            seconds = max(now - last_time, 1e-9)
            row["tokens_per_sec"] = tokens_per_step * steps_done / seconds
            achieved = flops_per_step * steps_done / seconds / jax.device_count()
            row["mfu"] = achieved / peak if peak else None
            row["elapsed_sec"] = now - run_start
            writer.write(done, row)
            left = (num_steps - done) * seconds / steps_done
            metrics.log(metrics.progress_line(done, num_steps, row, left))
            last_time, last_logged = now, done

        # ------------------------------------------------------------ save
        if done % config.checkpoint.every_steps == 0 or done == last_step:
            # Before the next batch is read, so the saved position is that of step `done`.
            checkpointing.save(manager, done, state, data_iter)
        if done < last_step:
            # Reading the host batch overlaps the device's work on the step just dispatched.
            batch = sharding.global_batch(next(data_iter), mesh)

    manager.wait_until_finished()
    manager.close()
    writer.close()
    return row
