"""The pre-training loop: train(config, workdir), in sections.

mesh -> data -> state -> restore -> compile -> steps (log, save). Re-running with the same workdir
resumes from the newest checkpoint: same parameters, optimizer state, data position and random
stream, so the resumed run logs what the uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from electra_jax import checkpointing, metrics, objective, sharding, validate
from electra_jax.model import (
    Electra,
    ElectraSpec,
    network_param_counts,
    param_logical_axes,
    spec_from_config,
)
from electra_jax.optim import make_optimizer
from electra_jax.train_step import (
    DEFAULT_SPECIAL,
    SpecialTokens,
    guarded_train_step,
    init_state,
    multi_step,
    special_tokens_of,
)


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def build(config: ml_collections.ConfigDict, vocab_size: int, mesh=None):
    """The model, optimizer, schedule and mask-slot count a config describes (for `mesh`, when
    given: FSDP pins activations to the batch split)."""
    spec = spec_from_config(
        config.model,
        config.generator,
        vocab_size,
        config.train.remat,
        mlm_head=objective.needs_mlm_head(config.objective.get("name", "electra")),
    )
    if mesh is not None and mesh.shape["fsdp"] > 1:
        spec = dataclasses.replace(spec, activation_sharding=sharding.batch_sharding(mesh))
    model = Electra(spec)
    tx, schedule = make_optimizer(config.train)
    num_slots = objective.num_mask_slots(config.data.seq_length, config.objective.mask_prob)
    return spec, model, tx, schedule, num_slots


@dataclasses.dataclass(frozen=True)
class StepSetup:
    """What a run compiles: the model's spec, how to make the state, and the jitted step."""

    spec: ElectraSpec
    num_slots: int
    make_state: Callable  # () -> TrainState, for jax.jit(..., out_shardings=state_sharding)
    abstract_state: Any  # jax.eval_shape(make_state)
    state_sharding: Any
    step_fn: Callable  # jitted (state, global batch) -> (state, metrics); the state is donated
    # jitted (state, [K, B, L] batches) -> (state, [K] metrics): K = train.steps_per_call steps
    # in one call (train_step.multi_step); None when K = 1
    multi_step_fn: Callable | None = None


def setup_step(
    config: ml_collections.ConfigDict,
    vocab_size: int,
    mesh,
    special: SpecialTokens = DEFAULT_SPECIAL,
) -> StepSetup:
    """The model, state layout and compiled-on-first-use train step a config describes
    (`special`: the tokenizer's [PAD], [CLS], [SEP], [MASK] ids)."""
    spec, model, tx, schedule, num_slots = build(config, vocab_size, mesh)
    make_state = functools.partial(init_state, model, tx, config.seed)
    abstract = jax.eval_shape(make_state)
    params_sharding = sharding.param_shardings(param_logical_axes(model), abstract.params, mesh)
    state_sharding = sharding.state_shardings(abstract, params_sharding, mesh)
    one_step = functools.partial(
        guarded_train_step,
        nan_policy=config.train.nan_policy,
        debug_nan_at_step=config.train.debug_nan_at_step,
        model=model,
        tx=tx,
        schedule=schedule,
        objective_cfg=config.objective,
        num_slots=num_slots,
        grad_accum_steps=config.train.grad_accum_steps,
        special=special,
    )

    def jitted(fn, batch_sharding):
        return jax.jit(
            fn,
            in_shardings=(state_sharding, batch_sharding),
            out_shardings=(state_sharding, sharding.replicated(mesh)),
            donate_argnums=(0,),
        )

    step_fn = jitted(one_step, sharding.batch_sharding(mesh))
    multi_step_fn = None
    if config.train.get("steps_per_call", 1) > 1:
        multi_step_fn = jitted(
            functools.partial(multi_step, step_fn=one_step), sharding.stacked_batch_sharding(mesh)
        )
    return StepSetup(spec, num_slots, make_state, abstract, state_sharding, step_fn, multi_step_fn)


def init_on_mesh(setup: StepSetup):
    """Fresh parameters and optimizer state, laid out as the step expects."""
    return jax.jit(setup.make_state, out_shardings=setup.state_sharding)()


def describe(
    config: ml_collections.ConfigDict, vocab_size: int | None = None, compile: bool = True
) -> dict:
    """The dry run's summary, from shapes only: no parameter is allocated.

    Parameter counts and counted FLOPs always; with `compile`, the train step is also lowered
    and compiled ahead of time for a mesh over all devices (as the run would), adding the
    per-device memory XLA planned for it and XLA's own FLOP count, so an out-of-memory or a
    counting error shows before any hardware is booked.
    """
    vocab_size = vocab_size or config.data.vocab_size
    spec, model, tx, _, num_slots = build(config, vocab_size)
    abstract = jax.eval_shape(functools.partial(init_state, model, tx, config.seed))
    counts = network_param_counts(abstract.params)
    batch_size, seq_length = config.train.batch_size, config.data.seq_length
    flops = metrics.count_flops(spec, batch_size, seq_length, num_slots, config.objective.name)
    summary = {
        "discriminator_params": counts["discriminator"],
        "generator_params": counts["generator"],
        "total_params": counts["total"],
        "generator_hidden_size": spec.generator.hidden_size,
        "generator_num_heads": spec.generator.num_heads,
        "batch_size": batch_size,
        "seq_length": seq_length,
        "learning_rate": config.train.learning_rate,
        "mask_prob": config.objective.mask_prob,
        "mask_slots": num_slots,
        "flops_per_step": flops["total"],
    }
    if compile:
        summary.update(compile_report(config, vocab_size))
    return summary


def checked_mesh(config: ml_collections.ConfigDict, process_count: int):
    """The run's mesh over all devices; ConfigError when it or the batch does not fit them."""
    try:
        mesh = sharding.make_mesh(config.mesh)
    except ValueError as e:
        raise validate.ConfigError(f"{e}; choose a mesh.fsdp that divides it") from e
    validate.check_batch(
        config.train.batch_size,
        sharding.data_parallel_size(mesh),
        process_count,
        config.train.grad_accum_steps,
    )
    return mesh


def compile_report(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    """Compiles the train step from abstract inputs; returns XLA's memory plan and FLOPs.

    memory_per_device_bytes = arguments + outputs - donated aliases + temporaries: what one
    device holds at the step's peak (state, batch, activations, gradients, optimizer update).
    xla_flops_per_step is XLA's cost analysis of one device's program times the device count
    (None with gradient accumulation: XLA counts the micro-batch loop's body once).
    This is the one-step program; the run's calls of train.steps_per_call steps scan it and hold
    about as much (configs/small.py at 32 x 128: 963 MB of temporaries for 4 steps, 945 for 1).
    """
    mesh = checked_mesh(config, process_count=1)
    setup = setup_step(config, vocab_size, mesh)
    state = checkpointing.abstract_with_shardings(setup.abstract_state, setup.state_sharding)
    shape = (config.train.batch_size, config.data.seq_length)
    row = jax.ShapeDtypeStruct(shape, jax.numpy.int32, sharding=sharding.batch_sharding(mesh))
    batch = {"input_ids": row, "segment_ids": row, "input_mask": row}
    t0 = time.time()
    compiled = setup.step_fn.lower(state, batch).compile()
    seconds = time.time() - t0
    mem = compiled.memory_analysis()
    per_device = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    xla_flops = float(cost.get("flops", 0.0)) * jax.device_count() if cost else None
    if config.train.grad_accum_steps > 1:
        xla_flops = None  # XLA counts a loop's body once, not once per micro-batch
    return {
        "devices": jax.device_count(),
        "mesh": dict(mesh.shape),
        "memory_per_device_bytes": int(per_device),
        "memory_state_bytes": int(mem.argument_size_in_bytes),
        "memory_temp_bytes": int(mem.temp_size_in_bytes),
        "xla_flops_per_step": xla_flops,
        "compile_seconds": round(seconds, 1),
    }


def _load_init_from(config: ml_collections.ConfigDict, workdir: str):
    """train.init_from's weights (a `pretrained.Pretrained`), its tokenizer put in the workdir.

    Only for a run without checkpoints: a resumed run continues from its own state.
    """
    from electra_jax import pretrained

    if checkpointing.has_checkpoints(workdir):
        return None
    path = config.train.init_from
    try:
        loaded = pretrained.load_pretrained(path)
    except pretrained.PretrainedError as e:
        raise validate.ConfigError(f"train.init_from: {e}") from e
    if config.data.tokenizer:
        raise validate.ConfigError(
            f"train.init_from={path} brings its own tokenizer; leave data.tokenizer empty"
        )
    if jax.process_index() == 0:
        loaded.tokenizer.save(os.path.join(workdir, "tokenizer"))
    return loaded


def _with_params(state, loaded, setup: StepSetup):
    """The fresh state with `loaded`'s parameters, laid out as the step expects."""
    want = jax.tree_util.tree_map(lambda x: x.shape, setup.abstract_state.params)
    have = jax.tree_util.tree_map(lambda x: tuple(x.shape), loaded.params)
    if want != have:
        raise validate.ConfigError(
            f"train.init_from={loaded.source} holds a model of other shapes than the config's "
            f"(discriminator {loaded.spec.discriminator}, generator {loaded.spec.generator}, "
            f"vocab {loaded.spec.vocab_size}); set model.* and generator.* to match"
        )
    params = jax.device_put(loaded.params, setup.state_sharding.params)
    return state.replace(params=params)


def _barrier(name: str) -> None:
    """Every process waits here until all have arrived (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class NonFiniteError(RuntimeError):
    """The loss or gradient norm became NaN/Inf under train.nan_policy='stop'."""


def _read_stored_config(path: str) -> dict | None:
    """WORKDIR/config.json as a dict; None when missing; ConfigError when unreadable."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())
        raise validate.ConfigError(
            f"{path} cannot be read ({reason}); restore it from a copy, or delete it to resume "
            "with the current settings (the checkpoints' shapes are still checked)"
        ) from None
    if not isinstance(stored, dict) or not {"model", "generator"} <= set(stored):
        raise validate.ConfigError(
            f"{path} is not the config of an electra_jax run (no model and generator sections); "
            "restore it from a copy, or delete it to resume with the current settings"
        )
    return stored


def _check_resume(config, workdir: str, allow_changes: tuple[str, ...]) -> dict:
    """Before any work: may this config resume what the workdir holds?

    A workdir with checkpoints must be resumed with the model it was trained with and, but for
    the settings in validate.FREE_ON_RESUME and `allow_changes`, the settings it was started
    with. A workdir whose checkpoints were all set aside as damaged is not started over.
    Returns the allowed changes, {key: (stored value, new value)}.
    """
    directory = checkpointing.checkpoint_dir(workdir)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise validate.ConfigError(
            f"{directory} is a file, where the run keeps its checkpoints; move it away or use "
            "a new --workdir"
        )
    unknown = [k for k in allow_changes if k not in validate.flatten(config.to_dict())]
    if unknown:
        raise validate.ConfigError(
            f"--allow_change names {', '.join(unknown)}, which is not a config key"
        )
    if not checkpointing.has_checkpoints(workdir):
        aside = checkpointing.set_aside(workdir)
        if aside:
            raise checkpointing.CheckpointError(
                f"{directory} holds only checkpoints set aside as damaged ({', '.join(aside)}); "
                "this run will not start over on its own: inspect them, or use a new --workdir"
            )
        return {}  # nothing to restore: the run starts over and rewrites config.json
    path = os.path.join(workdir, "config.json")
    stored = _read_stored_config(path)
    if stored is None:
        return {}
    validate.check_same_model(stored, config, path)
    return validate.check_same_run(stored, config, path, tuple(allow_changes))


def _record_changes(workdir: str, step: int, changes: dict, config) -> None:
    """Rewrites config.json with the settings the run goes on with and appends what changed, at
    which step, to config_changes.jsonl (process 0 only)."""
    if jax.process_index() != 0:
        return
    row = {"step": step, "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}}
    with open(os.path.join(workdir, "config_changes.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    _write_json_atomic(os.path.join(workdir, "config.json"), config.to_dict())
    shown = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in changes.items())
    metrics.log(f"resuming at step {step} with changed settings: {shown}")


def _mismatch_message(e: checkpointing.CheckpointMismatch, workdir: str) -> str:
    """One line for a checkpoint of another model or optimizer, naming the settings involved."""
    names = [line.split(":", 1)[0] for line in e.differences]
    params = [n for n in names if n.startswith("params.")]
    if any(not n.startswith("params.generator") for n in params):
        settings = "the model (model.*, data.vocab_size, objective.name)"
    elif params:
        settings = "the generator (generator.*)"
    elif any(n.startswith("opt_state") for n in names):
        # The optimizer's tree, not its numbers: e.g. train.adam_bias_correction.
        settings = "the optimizer (train.adam_bias_correction, train.weight_decay, ...)"
    else:
        settings = "the train state"
    return (
        f"checkpoint {e.step} in {checkpointing.checkpoint_dir(workdir)} holds another state "
        f"than this config describes, in {settings}: {checkpointing.shown(e.differences)}; "
        "nothing was moved aside: resume with the settings the run was started with, or use a "
        "new --workdir"
    )


def _claim_workdir(workdir: str):
    """The workdir, locked by process 0 for the run; every process agrees before going on."""
    from electra_jax import workdir as workdir_lib

    error, held = None, None
    try:
        held = workdir_lib.claim(
            workdir,
            workdir_lib.PRETRAIN,
            lock=jax.process_index() == 0,
            command="electra_jax.train",
        )
    except validate.ConfigError as e:
        error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        ok = np.asarray(multihost_utils.process_allgather(np.int32(error is None)))
        if error is None and not ok.all():
            error = validate.ConfigError(
                f"--workdir {workdir} cannot be used by process(es) "
                f"{', '.join(map(str, np.flatnonzero(ok == 0)))}; see their error line"
            )
    if error is not None:
        if held is not None:
            held.release()
        raise error
    return held


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_after: int | None = None,
    allow_changes: tuple[str, ...] = (),
) -> dict:
    """Pre-trains until config.train.num_steps; returns the last logged metrics row.

    `stop_after` ends the run early at that step (with a checkpoint), as an interruption would,
    without changing the schedule: a later call resumes and finishes the same run.

    SIGTERM / SIGINT during the steps end the run after the call in flight (at most
    train.steps_per_call steps: the host never runs further ahead of the device) with a metrics
    row and a checkpoint of its last step (the returned row then has "preempted_at"); before the
    steps, compilation of the first call included, they raise checkpointing.Preempted. A
    NaN/Inf loss or gradient norm raises NonFiniteError under train.nan_policy='stop' (nothing
    non-finite is saved) and is skipped under 'skip'.

    The workdir is locked for the whole call (workdir.claim): a second run on it gets a
    ConfigError naming this one. A resume must keep the stored settings but for those in
    validate.FREE_ON_RESUME and `allow_changes` (config keys), which are recorded in
    config_changes.jsonl.
    """
    validate.check_config(config)
    held = _claim_workdir(workdir)
    try:
        changes = _check_resume(config, workdir, tuple(allow_changes))
        warning = validate.warmup_warning(config.train)
        if warning:
            metrics.log(f"warning: {warning}")
        watcher = checkpointing.PreemptionWatcher()
        try:
            return _train(config, workdir, stop_after, watcher, changes)
        finally:
            watcher.close()
    finally:
        held.release()


def _train(config, workdir, stop_after, watcher, changes) -> dict:
    from electra_jax.data import pipeline, prepare

    # ---------------------------------------------------------------- mesh
    mesh = checked_mesh(config, jax.process_count())
    is_main = jax.process_index() == 0

    # ---------------------------------------------------------------- data
    # Process 0 trains the tokenizer and prepares the shards while the others wait; they then
    # find both in the workdir (shared storage: NFS or a gcsfuse-mounted bucket, not gs://, since
    # it is written with os calls) instead of making their own.
    if not is_main:
        _barrier("electra_jax_prepared")
    start_from = _load_init_from(config, workdir) if config.train.init_from else None
    tokenizer = prepare.ensure_tokenizer(
        config.data, os.path.join(workdir, "tokenizer"), config.seed
    )
    cache_dir = config.data.cache_dir or os.path.join(workdir, "data")
    # As many tokenizing processes as the corpus's size warrants on this host (the same rule as
    # `python -m electra_jax.prepare`); the shards are the same bytes for any number.
    prepared = prepare.prepare(config.data, tokenizer, cache_dir, config.seed, num_workers=None)
    if is_main:
        _barrier("electra_jax_prepared")
    data_iter = pipeline.make_iterator(
        prepared,
        config.train.batch_size,
        config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )

    # ---------------------------------------------------------------- state
    # From here to the first compiled call, jax and orbax work in `watcher.deferred()` blocks: a
    # signal ends the run at the end of the block it arrives in, never inside their C++ state.
    with watcher.deferred():
        setup = setup_step(config, tokenizer.vocab_size, mesh, special_tokens_of(tokenizer))
    spec, num_slots = setup.spec, setup.num_slots

    # ---------------------------------------------------------------- restore
    manager = checkpointing.make_manager(workdir, config.checkpoint)
    try:
        with watcher.deferred():
            state = checkpointing.restore_latest(
                manager,
                checkpointing.abstract_with_shardings(setup.abstract_state, setup.state_sharding),
                data_iter,
                log=metrics.log,
            )
    except checkpointing.CheckpointMismatch as e:
        manager.close()
        raise validate.ConfigError(_mismatch_message(e, workdir)) from None
    except BaseException:
        manager.close()
        raise
    if state is None:
        try:
            with watcher.deferred():
                state = init_on_mesh(setup)
                if start_from is not None:
                    state = _with_params(state, start_from, setup)
        except BaseException:
            manager.close()
            raise
        if start_from is not None:
            metrics.log(f"starting from the weights of {start_from.source}")
        if is_main:
            _write_json_atomic(os.path.join(workdir, "config.json"), config.to_dict())
        start_step = 0
    else:
        start_step = int(jax.device_get(state.step))
        metrics.log(f"resumed from checkpoint {start_step} in {workdir}")
        if changes:
            _record_changes(workdir, start_step, changes, config)
        elif is_main and not os.path.exists(os.path.join(workdir, "config.json")):
            _write_json_atomic(os.path.join(workdir, "config.json"), config.to_dict())
            metrics.log(
                "warning: config.json was missing; wrote this run's settings (the checkpoint's "
                "shapes matched them)"
            )

    # ---------------------------------------------------------------- compile
    # Steps run in whole calls of train.steps_per_call (K) on the grid of multiples of K. A call
    # ends early at a log or checkpoint step, or at the last step; such a short call, and one
    # that starts off the grid (a resume after stop_after), runs its steps one at a time. A
    # whole call computes what K single steps do, bit for bit (tests/test_loop.py).
    num_steps = config.train.num_steps
    last_step = num_steps if stop_after is None else min(num_steps, stop_after)
    per_call = config.train.get("steps_per_call", 1)
    log_every, save_every = config.log.every_steps, config.checkpoint.every_steps

    def call_size(step: int) -> int:
        return min(
            per_call - step % per_call,
            log_every - step % log_every,
            save_every - step % save_every,
            last_step - step,
        )

    def read_batches(n: int):
        """The next n steps' batches: [K, B, L] for a whole call, else a list of [B, L]."""
        local = [next(data_iter) for _ in range(n)]
        if n == per_call > 1:
            return sharding.global_batches(local, mesh)
        return [sharding.global_batch(b, mesh) for b in local]

    programs: dict[bool, Any] = {}  # whole call of K (True) or one step (False) -> compiled

    def program(whole: bool, batches):
        if whole not in programs:
            t0 = time.time()
            fn = setup.multi_step_fn if whole else setup.step_fn
            programs[whole] = fn.lower(state, batches).compile()
            steps = f"{per_call} train steps per call" if whole else "train step"
            metrics.log(f"compiled the {steps} in {time.time() - t0:.1f}s")
        return programs[whole]

    try:
        with watcher.deferred():
            batches = read_batches(call_size(start_step)) if start_step < last_step else None
            if batches is not None:
                # Compiled before the watcher is armed: a signal during compilation (minutes for
                # a large model) then ends the run once the compiler returns, with no step to
                # save, rather than after compilation and a first call.
                whole = isinstance(batches, dict)
                program(whole, batches if whole else batches[0])
    except BaseException:
        manager.close()
        raise
    writer = metrics.MetricsWriter(workdir, is_main, resume_step=start_step)

    # ---------------------------------------------------------------- steps
    tokens_per_step = config.train.batch_size * config.data.seq_length
    flops_per_step = metrics.count_flops(
        spec, config.train.batch_size, config.data.seq_length, num_slots, config.objective.name
    )["total"]
    peak = metrics.peak_flops_per_device(jax.devices()[0].device_kind, config.log.peak_flops)
    skip = config.train.nan_policy == "skip"
    run_start = last_time = time.time()
    last_logged = start_step
    last_saved = start_step if start_step > 0 else None
    # Non-finite flags (device arrays) since the last check, each with the first step it covers
    # (one step's scalar, or a whole call's [K]); read only when logging or saving, so that the
    # host never waits on the device every step.
    flags: list[tuple[int, Any]] = []
    save_seconds = 0.0
    row: dict = {}

    skipped = 0  # non-finite updates skipped since the previous row

    def check_finite() -> None:
        """Reads the flags gathered since the last check: counts skips, or stops the run."""
        nonlocal skipped
        values = jax.device_get([f for _, f in flags])
        per_step = [
            (s + i, v)
            for (s, _), vs in zip(flags, values, strict=True)
            for i, v in enumerate(np.ravel(vs))
        ]
        bad = [s for s, v in per_step if v > 0]
        first, last = (per_step[0][0], per_step[-1][0]) if per_step else (None, None)
        flags.clear()
        skipped += len(bad)
        if bad and not skip:
            good = (
                f"{checkpointing.checkpoint_dir(workdir)}/{last_saved}"
                if last_saved is not None
                else "none (a rerun starts from step 0)"
            )
            checkpointing.wait(manager)
            raise NonFiniteError(
                f"non-finite loss or gradient norm at step {bad[0]} (found checking steps "
                f"{first}-{last}; nothing from them was saved); last good checkpoint: {good}; "
                "lower train.learning_rate, or set train.nan_policy='skip' to skip such updates"
            )

    def log_row(done: int, step_metrics: dict) -> None:
        """Writes the metrics row of step `done` (the last step of `step_metrics`, a whole
        call's being stacked [K]) and its progress line."""
        nonlocal row, skipped, last_time, last_logged
        check_finite()
        row = {k: float(np.ravel(v)[-1]) for k, v in jax.device_get(step_metrics).items()}
        row["skipped_updates"] = skipped
        if skipped:
            metrics.log(f"warning: skipped {skipped} non-finite update(s) up to step {done}")
        skipped = 0
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

    def save(done: int) -> None:
        nonlocal last_saved, save_seconds
        check_finite()  # never save a state that a non-finite update produced
        t = time.time()
        # Before the next batch is read, so the saved position is that of step `done`.
        checkpointing.save(manager, done, state, data_iter)
        save_seconds += time.time() - t
        last_saved = done

    watcher.arm()
    preempted_at = start_step if watcher.requested(start_step) else None
    step = start_step
    while step < last_step and preempted_at is None:
        if isinstance(batches, dict):  # a whole call: K steps, metrics stacked [K]
            state, step_metrics = program(True, batches)(state, batches)
            flags.append((step + 1, step_metrics.pop("nonfinite")))
            step += per_call
        else:
            for batch in batches:
                state, step_metrics = program(False, batch)(state, batch)
                step += 1
                flags.append((step, step_metrics.pop("nonfinite")))
        done = step
        save_due = done % save_every == 0 or done == last_step

        # ------------------------------------------------------------ read ahead
        # The next call's batches are read while the device works on this one, except before a
        # save, which records the iterator's position at step `done`; a preemption puts the
        # position back (`position`) before it saves.
        position = None
        if done < last_step and not save_due:
            position = data_iter.get_state()
            batches = read_batches(call_size(done))
        # At most one call in flight. Dispatch is asynchronous: unchecked, the host would run
        # ahead to the next log step's read (up to log.every_steps steps, minutes on a slow
        # device), and a SIGTERM would wait for all of them; its Python handler cannot even run
        # while the main thread blocks in that read. Waiting here costs the device only the
        # dispatch of the next call, whose batches are already on it.
        jax.block_until_ready(flags[-1][1])

        # ------------------------------------------------------------ log
        if done % log_every == 0 or done == num_steps:
            log_row(done, step_metrics)

        # ------------------------------------------------------------ save
        if watcher.requested(done):
            if position is not None:
                data_iter.set_state(position)
            preempted_at = done
            break
        if save_due:
            save(done)
            if done < last_step:
                batches = read_batches(call_size(done))

    if preempted_at is not None:
        if last_logged != preempted_at:
            # The row of the step the checkpoint holds, so that metrics.jsonl ends where a
            # resumed run starts (a resume keeps rows up to its checkpoint's step).
            log_row(preempted_at, step_metrics)
        if last_saved != preempted_at:
            save(preempted_at)
        checkpointing.wait(manager)
        metrics.log(
            f"preempted at step {preempted_at}; checkpoint saved; run the same command to resume"
        )
        row = dict(row, preempted_at=preempted_at)
    checkpointing.wait(manager)
    manager.close()
    writer.close()
    if save_seconds and programs:
        metrics.log(f"checkpoint saves blocked the loop for {save_seconds:.2f}s in total")
    return row
