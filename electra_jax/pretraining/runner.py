"""The pre-training loop: train(config, workdir), in sections.

mesh -> data -> state -> restore -> compile -> steps (log, save). Re-running with the same workdir
resumes from the newest checkpoint: same parameters, optimizer state, data position and random
stream, so the resumed run logs what the uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from electra_jax import validate
from electra_jax.config import pretrain_keys, schema
from electra_jax.data import heldout, pipeline, shards
from electra_jax.errors import ConfigError, NonFiniteError
from electra_jax.model import layer_stack, sharding
from electra_jax.model.networks import Electra, abstract_params
from electra_jax.pretraining import (
    compile_cache,
    metrics,
    profiling,
    remat_auto,
    resume,
    scoring,
    timing,
)
from electra_jax.pretraining.optimizer_step import special_tokens_of
from electra_jax.pretraining.program import (
    StepSetup,
    build,
    checked_mesh,
    eval_batch_size,
    eval_every,
    init_on_mesh,
    resolve_remat,
    setup_step,
)
from electra_jax.run import rerun
from electra_jax.store import checkpoint_steps, checkpointing, filenames, timed_saves


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_after: int | None = None,
    allow_changes: tuple[str, ...] = (),
    command: str | None = None,
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
    ConfigError naming this one. A resume must keep the stored settings but for those a resume
    may change freely (schema.Key.resume) and `allow_changes` (config keys), which are recorded
    in config_changes.jsonl. `command`, the command line, is recorded in commands.jsonl for the
    export's model card. Keys `config` lacks take their defaults (schema.complete).
    """
    config = schema.complete(config, pretrain_keys.KEYS)
    validate.check_config(config)
    planned = resume.plan(config, workdir, tuple(allow_changes), command, claim=False)
    return train_planned(planned, stop_after)


def train_planned(run: rerun.Resume, stop_after: int | None = None) -> dict:
    """`train` of the run `resume.plan` answered (its config completed, checked and settled);
    planned without the claim (the command line's, before jax), its workdir is claimed here
    (rerun.take), so that nothing planned is asked twice. Released when the run ends."""
    try:
        if run.claim is None:
            run = rerun.take(run)
        for line in run.said:  # what the run keeps of the stored one
            metrics.log(line)
        warning = validate.warmup_warning(run.config.train)
        if warning:
            metrics.log(f"warning: {warning}")
        watcher = checkpointing.PreemptionWatcher()
        try:
            return _train(run, stop_after, watcher)
        finally:
            watcher.close()
    finally:
        run.release()


def _train(run: rerun.Resume, stop_after, watcher) -> dict:
    """The run, top to bottom: mesh -> data -> state -> restore -> compile -> steps."""
    config, workdir = run.config, run.workdir
    started = timing.now()  # the run's first start, unless a checkpoint knows an earlier one
    compile_cache.configure(config.compile.cache_dir, workdir)
    mesh = _mesh(run)
    with watcher.deferred():  # train.init_from's weights for a new run, before the data
        start_from = resume.start_from(run)
        if start_from is not None:
            _check_init_from(start_from, config)
    tokenizer, prepared, data_iter = _data(config, workdir, run)
    # From here to the first compiled call, jax and orbax work in `watcher.deferred()` blocks: a
    # signal ends the run at the end of the block it arrives in, never inside their C++ state.
    with watcher.deferred():
        special = special_tokens_of(tokenizer)
        unigram = _unigram_cdf(config, prepared, special, tokenizer.vocab_size)
        setup, choosing_sec = _setup(run, tokenizer.vocab_size, mesh, special, unigram)
        evaluator = _evaluator(config, setup, mesh, prepared, special)
    manager = checkpointing.make_manager(workdir, config.checkpoint)
    breakdown = timing.Breakdown()
    try:
        t = timing.now()
        # The start's own work before the restore, its compiles aside (their own column).
        compiled = choosing_sec or 0.0
        if evaluator is not None:
            compiled += evaluator.compile_seconds
        prepare_sec = max(t - started - compiled, 0.0)
        state, start_step = _restore(run, setup, manager, data_iter, watcher, start_from)
        startup = {"restore_sec": timing.now() - t, "prepare_sec": prepare_sec}
        saved = checkpointing.saved_goodput(workdir, start_step) if start_step else None
        totals = timing.Totals.restored(saved, started)
        profile = profiling.Profile(
            workdir,
            config.log.profile_steps,
            config.log.profile_num_steps,
            start_step,
            config.train.steps_per_call,
        )
        bounds = profile.bounds()
        calls = _CompiledCalls(config, setup, mesh, data_iter, stop_after, breakdown, bounds)
        # The first interval starts here: its batches' reading and the programs' compiling are
        # its data_wait_sec and compile_sec, not compute.
        interval_start = timing.now()
        with watcher.deferred():
            # Compiled before the watcher is armed: a signal during compilation (minutes for a
            # large model) then ends the run once the compiler returns, with no step to save,
            # rather than after compilation and a first call.
            batches = calls.first_batches(state, start_step, also=profile.steps())
    except BaseException:
        manager.close()
        raise
    # Compiled before the interval: a start's cost, not a wait in it.
    if evaluator is not None:
        startup["compile_sec"] = evaluator.compile_seconds
    if choosing_sec:
        startup["compile_sec"] = startup.get("compile_sec", 0.0) + choosing_sec
    recorder = _Recorder.start(
        config,
        workdir,
        setup,
        manager,
        data_iter,
        start_step,
        last_step=calls.last_step,
        evaluator=evaluator,
        clock=(breakdown, totals, startup, interval_start, started),
    )
    try:
        return _steps(calls, recorder, state, start_step, batches, watcher, profile)
    finally:
        profile.stop()


def _mesh(run: rerun.Resume):
    """The run's checked mesh. A resume whose batch this layout cannot split as the run did is
    refused with both layouts named, before anything is prepared or restored: the run's
    train.batch_size is not this command's to change."""
    try:
        return checked_mesh(run.config, jax.process_count())
    except ConfigError as e:
        saved = checkpointing.saved_layout(run.workdir) if run.resumes else None
        if saved is None:
            raise
        step, layout = saved
        reason = str(e)
        if "train.batch_size" in reason:  # its advice would change the batch; a resume keeps it
            reason = (
                f"{reason.split('; ')[0]}; a resume keeps train.batch_size="
                f"{run.config.train.batch_size}: run it on processes and devices that divide it"
            )
        now = checkpointing.layout_text(checkpointing.current_layout())
        raise ConfigError(
            f"checkpoint {step} in {run.workdir} was written by "
            f"{checkpointing.layout_text(layout)} and cannot go on exactly on this run's "
            f"{now}: {reason}"
        ) from None


def _setup(run: rerun.Resume, vocab_size: int, mesh, special, unigram) -> tuple[StepSetup, float]:
    """(the run's step setup, the seconds spent compiling to choose train.remat='auto''s
    policy). For 'auto', the policy the workdir records for these devices and settings, else
    the one remat_auto chooses (its program compiled once, here; the choice recorded); the
    config.json keeps 'auto'."""
    config = run.config
    if config.train.remat != remat_auto.AUTO:
        return setup_step(config, vocab_size, mesh, special, unigram), 0.0
    choice = remat_auto.for_run(
        run.workdir,
        config,
        mesh,
        lambda: resolve_remat(config, vocab_size, mesh, special, unigram),
        log=metrics.log,
        is_main=jax.process_index() == 0,
    )
    resolved = remat_auto.with_policy(config, choice.policy)
    return setup_step(resolved, vocab_size, mesh, special, unigram), choice.seconds


def _unigram_cdf(config, prepared, special, vocab_size: int):
    """The corpus's unigram distribution for objective.unigram_share > 0 (counted on the
    training rows the held-out evaluation counts its pieces on), else None."""
    if not config.objective.unigram_share > 0:
        return None
    sample = pipeline.training_sample(prepared, config.data.heldout_examples)
    return heldout.unigram_cdf(sample["input_ids"], vocab_size, tuple(special))


def _evaluator(config, setup: StepSetup, mesh, prepared, special):
    """The compiled held-out evaluation (scoring.py), or None when the config asks for none."""
    every = eval_every(config)
    if not every:
        return None
    evaluator = scoring.build(
        model=Electra(setup.spec),
        num_slots=setup.num_slots,
        objective_cfg=config.objective,
        abstract_params=setup.abstract_state.params,
        params_sharding=setup.state_sharding.params,
        mesh=mesh,
        prepared=prepared,
        heldout_examples=config.data.heldout_examples,
        batch_size=eval_batch_size(config),
        every=every,
        special=special,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        compiled=setup.compiled,
    )
    what = f"the held-out evaluation ({config.data.heldout_examples} rows)"
    if isinstance(prepared, shards.PreparedMixture):
        what = (
            f"the held-out evaluation ({config.data.heldout_examples} rows of each of "
            f"{len(prepared.parts)} parts)"
        )
    if evaluator.reused:
        metrics.log(f"reusing {what} compiled earlier in this process")
    else:
        metrics.log(f"compiled {what} in {evaluator.compile_seconds:.1f}s")
    return evaluator


# -------------------------------------------------------------------------------------- data


def _data(config, workdir: str, run: rerun.Resume | None = None):
    """(the run's tokenizer, its prepared data, the iterator over its training batches).

    Process 0 trains the tokenizer and prepares the shards while the others wait; they then find
    both in the workdir (storage every host sees: gs://, written through paths.py, or NFS)
    instead of making their own. A resumed run's corpus and tokenizer are checked against what
    the run started from (resume.check_corpus) before anything is prepared.
    """
    is_main = jax.process_index() == 0
    if not is_main:
        _barrier("electra_jax_prepared")
    tokenizer = shards.ensure_tokenizer(
        config.data, os.path.join(workdir, filenames.TOKENIZER_DIR), config.seed
    )
    standing_in = resume.check_corpus(run, tokenizer) if is_main and run is not None else None
    if standing_in is not None:
        prepared = standing_in  # the corpus is gone; check_corpus proved its shards
    else:
        # As many tokenizing processes as the corpus's size warrants on this host (the same
        # rule as `python -m electra_jax.prepare`); the shards are the same bytes for any number.
        prepared = resume.prepared_data(config, workdir, tokenizer, num_workers=None)
    if is_main:
        _barrier("electra_jax_prepared")
    if isinstance(prepared, shards.PreparedMixture):
        metrics.log(_mixture_line(prepared))
    data_iter = pipeline.make_iterator(
        prepared,
        config.train.batch_size,
        config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        heldout_examples=config.data.heldout_examples,
    )
    return tokenizer, prepared, data_iter


def _mixture_line(prepared: shards.PreparedMixture) -> str:
    """One line naming a mixture's parts: share of the rows, prepared rows, folder."""
    total = sum(prepared.proportions)
    parts = [
        f"{name} {p / total:.1%} ({part.num_examples:,} rows in {part.directory})"
        for name, p, part in zip(prepared.names, prepared.proportions, prepared.parts, strict=True)
    ]
    return f"data.mixture: {'; '.join(parts)}"


def _barrier(name: str) -> None:
    """Every process waits here until all have arrived (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------- state, restore


def _restore(run: rerun.Resume, setup, manager, data_iter, watcher, start_from):
    """(state, its step): the newest checkpoint's (the iterator put back to its position), else
    a new state (with `start_from`, init_from's weights); what the run goes on with is
    recorded."""
    try:
        with watcher.deferred():
            state = checkpointing.restore_latest(
                manager,
                checkpointing.abstract_with_shardings(setup.abstract_state, setup.state_sharding),
                data_iter,
                log=metrics.log,
            )
    except checkpointing.CheckpointMismatch as e:
        raise ConfigError(resume.mismatch_message(e, run.workdir)) from None
    if state is None:
        with watcher.deferred():
            state = init_on_mesh(setup)
            if start_from is not None:
                state = _with_params(state, start_from, setup)
        if start_from is not None:
            metrics.log(f"starting from the weights of {start_from.source}")
        run.record(None)
        return state, 0
    start_step = int(jax.device_get(state.step))
    # plan checked the newest checkpoint; a damaged one set aside, this is an older one.
    resume.check_step(run, start_step)
    metrics.log(f"resumed from checkpoint {start_step} in {run.workdir}")
    run.record(start_step)
    return state, start_step


def _in_layout(loaded, abstract_params, scan_layers: bool):
    """`loaded`'s parameters in the step's layer layout (a model saved unrolled or stacked
    starts this run in its own); ConfigError when their shapes are not `abstract_params'`."""
    loaded_params = layer_stack.to_layout(loaded.params, scan_layers)
    want = jax.tree_util.tree_map(lambda x: tuple(x.shape), abstract_params)
    have = jax.tree_util.tree_map(lambda x: tuple(x.shape), loaded_params)
    if want != have:
        raise ConfigError(
            f"train.init_from={loaded.source} holds a model of other shapes than the config's "
            f"(discriminator {loaded.spec.discriminator}, generator {loaded.spec.generator}, "
            f"vocab {loaded.spec.vocab_size}); set model.* and generator.* to match"
        )
    return loaded_params


def _check_init_from(loaded, config) -> None:
    """The shape check of _with_params from the config alone (the vocabulary is init_from's
    tokenizer's), by abstract evaluation: a model of another width is refused before the
    corpus is tokenized and packed, not after."""
    pieces, rows = loaded.tokenizer.vocab_size, loaded.spec.vocab_size
    if pieces != rows:
        # Named as such: the shape check below would blame model.* for it.
        raise ConfigError(
            f"train.init_from={loaded.source}: its tokenizer has {pieces:,} pieces but its "
            f"embeddings {rows:,} rows, and pre-training needs one row per piece (the generator "
            "predicts every piece): start from weights made for that tokenizer"
        )
    spec, model, *_ = build(config, loaded.tokenizer.vocab_size)
    abstract, _ = abstract_params(model)
    _in_layout(loaded, abstract, spec.scan_layers)


def _with_params(state, loaded, setup: StepSetup):
    """The fresh state with `loaded`'s parameters, laid out as the step expects."""
    loaded_params = _in_layout(loaded, setup.abstract_state.params, setup.spec.scan_layers)
    params = jax.device_put(loaded_params, setup.state_sharding.params)
    return state.replace(params=params)


# ------------------------------------------------------------------------------------ compile


class _CompiledCalls:
    """How the steps are grouped into compiled calls, their batches and their programs.

    Steps run in whole calls of train.steps_per_call (K) on the grid of multiples of K. A call
    ends early at a log, evaluation or checkpoint step, or at the last step; such a short call,
    and one that starts off the grid (a resume after stop_after), runs its steps one at a time. A
    whole call computes what K single steps do, bit for bit (tests/pretraining/test_runner.py).
    """

    def __init__(
        self,
        config,
        setup: StepSetup,
        mesh,
        data_iter,
        stop_after: int | None,
        breakdown: timing.Breakdown,
        bounds: tuple[int, ...] = (),
    ):
        self.setup, self.mesh, self.data_iter = setup, mesh, data_iter
        self.breakdown = breakdown
        self.bounds = bounds  # steps calls also end at (a profile's first - 1 and last)
        self.num_steps = config.train.num_steps
        self.last_step = self.num_steps if stop_after is None else min(self.num_steps, stop_after)
        self.per_call = config.train.steps_per_call
        self.log_every, self.save_every = config.log.every_steps, config.checkpoint.every_steps
        self.eval_every = eval_every(config)  # a row at each evaluation, too
        self.programs: dict[bool, Any] = {}  # whole call of K (True) or one step (False)

    def size(self, step: int) -> int:
        """The number of steps of the call that starts after `step`."""
        return min(
            self.per_call - step % self.per_call,
            self.log_every - step % self.log_every,
            self.save_every - step % self.save_every,
            self.eval_every - step % self.eval_every if self.eval_every else self.per_call,
            self.last_step - step,
            *(b - step for b in self.bounds if b > step),
        )

    def row_due(self, step: int) -> bool:
        """Whether step `step` writes a metrics row: every log.every_steps, at each held-out
        evaluation and at the last step of this call to `train` (the run's, or stop_after's,
        so that metrics.jsonl ends at the checkpoint a later call resumes from, as after a
        preemption)."""
        evaluated = self.eval_every and step % self.eval_every == 0
        return step % self.log_every == 0 or step == self.last_step or bool(evaluated)

    def read(self, step: int, busy=None):
        """The batches of the call after `step`: [K, B, L] for a whole call, else a list of
        [B, L].

        `busy`: an output of the call in flight, or None when none is. The seconds from when
        the device is found idle (`busy` ready; at once without one) to the end of the read
        are the interval's data_wait_sec: a read the device's work hides costs nothing.
        """
        n = self.size(step)
        idle_from = timing.now() if busy is None else None
        local = []
        for _ in range(n):
            if idle_from is None and busy.is_ready():
                idle_from = timing.now()
            local.append(next(self.data_iter))
        if idle_from is None and busy.is_ready():  # done during the last batch: its transfer
            idle_from = timing.now()
        if n == self.per_call > 1:
            out = sharding.global_batches(local, self.mesh)
        else:
            out = [sharding.global_batch(b, self.mesh) for b in local]
        if idle_from is not None:
            self.breakdown.add("data_wait_sec", timing.now() - idle_from)
        return out

    def program(self, whole: bool, state, batches):
        """The compiled whole call or single step (compiled at its first use; `batches` may be
        abstract)."""
        if whole not in self.programs:
            # The batches' shapes and layout follow from the setup's config and mesh, so the
            # program is the setup's: compiled once per process (program.setup_step).
            name = "multi_step" if whole else "step"
            t0, hits = timing.now(), compile_cache.hits()
            reused = name in self.setup.compiled
            if not reused:
                fn = self.setup.multi_step_fn if whole else self.setup.step_fn
                self.setup.compiled[name] = fn.lower(state, batches).compile()
            self.programs[whole] = self.setup.compiled[name]
            seconds, loaded = timing.now() - t0, compile_cache.hits() - hits
            self.breakdown.add("compile_sec", seconds)
            self.breakdown.cache_hits += loaded
            steps = f"{self.per_call} train steps per call" if whole else "train step"
            if reused:
                metrics.log(f"reusing the {steps} compiled earlier in this process")
            else:
                cached = " (from the compilation cache)" if loaded else ""
                metrics.log(f"compiled the {steps} in {seconds:.1f}s{cached}")
        return self.programs[whole]

    def first_batches(self, state, start_step: int, also: tuple[int, int] | None = None):
        """The first call's batches (None when no step is left), its program compiled; with
        `also` = (first, last), those of the calls running steps first .. last too (a
        profile's steps then compile nothing)."""
        if start_step >= self.last_step:
            return None
        batches = self.read(start_step)
        whole = isinstance(batches, dict)
        self.program(whole, state, batches if whole else batches[0])
        step, last = (also[0] - 1, also[1]) if also else (0, 0)
        while step < min(last, self.last_step):
            n = self.size(step)
            each = n == self.per_call > 1
            if each not in self.programs:
                self.program(each, state, self._abstract(batches, each))
            step += n
        return batches

    def _abstract(self, batches, whole: bool):
        """The shapes (with shardings) of a whole call's batches or of one step's, from either."""
        if isinstance(batches, dict):
            one = {k: (v.shape[1:], v.dtype) for k, v in batches.items()}
        else:
            one = {k: (v.shape, v.dtype) for k, v in batches[0].items()}
        if whole:
            spec = sharding.stacked_batch_sharding(self.mesh)
            return {
                k: jax.ShapeDtypeStruct((self.per_call, *shape), dtype, sharding=spec)
                for k, (shape, dtype) in one.items()
            }
        spec = sharding.batch_sharding(self.mesh)
        return {
            k: jax.ShapeDtypeStruct(shape, dtype, sharding=spec)
            for k, (shape, dtype) in one.items()
        }

    def run(self, state, step: int, batches, flags: list):
        """One call from `step`: (state, the step it reaches, its metrics). Appends the call's
        non-finite flags, with the first step each covers, to `flags`."""
        if isinstance(batches, dict):  # a whole call: K steps, metrics stacked [K]
            state, step_metrics = self.program(True, state, batches)(state, batches)
            flags.append((step + 1, step_metrics.pop("nonfinite")))
            return state, step + self.per_call, step_metrics
        for batch in batches:
            state, step_metrics = self.program(False, state, batch)(state, batch)
            step += 1
            flags.append((step, step_metrics.pop("nonfinite")))
        return state, step, step_metrics


# -------------------------------------------------------------------------------------- steps


def _steps(
    calls: _CompiledCalls, recorder: _Recorder, state, start_step: int, batches, watcher, profile
) -> dict:
    """Runs the calls until the last step or a preemption; returns the last metrics row."""
    watcher.arm()
    if start_step >= calls.last_step:
        # A finished run run again (or stop_after at or below its step): said, not silent.
        asked = (
            f"train.num_steps={calls.num_steps}"
            if calls.last_step == calls.num_steps
            else f"stop_after={calls.last_step}"
        )
        metrics.log(
            f"the run in {recorder.workdir} is already at step {start_step} ({asked}): nothing "
            f"was trained; raise train.num_steps above {start_step} to go on"
        )
    preempted_at = start_step if watcher.requested(start_step) else None
    step = start_step
    while step < calls.last_step and preempted_at is None:
        with profile.call(step, calls.size(step)):
            state, done, step_metrics = calls.run(state, step, batches, recorder.flags)
            step = done
            save_due = done % calls.save_every == 0 or done == calls.last_step
            if not save_due and recorder.timed.asks(done):
                # checkpoint.every_minutes, before the next batches are read: process 0's
                # answer, which the others wait for (at most orbax's 300 s). Once this call is
                # done every process has dispatched it, so process 0 is at this question too,
                # not a first compile or a slow row behind; only this row's read is not hidden.
                jax.block_until_ready(recorder.flags[-1][1])
                save_due = recorder.timed.due(done)
            # The next call's batches are read while the device works on this one, except
            # before a save, which records the iterator's position at step `done`; a
            # preemption puts the position back (`position`) before it saves.
            position = None
            if done < calls.last_step and not save_due:
                position = calls.data_iter.get_state()
                batches = calls.read(done, busy=recorder.flags[-1][1])
            # At most one call in flight. Dispatch is asynchronous: unchecked, the host would
            # run ahead to the next log step's read (up to log.every_steps steps, minutes on a
            # slow device), and a SIGTERM would wait for all of them; its Python handler cannot
            # even run while the main thread blocks in that read. Waiting here costs the device
            # only the dispatch of the next call, whose batches are already on it.
            jax.block_until_ready(recorder.flags[-1][1])
        if calls.row_due(done):
            recorder.log_row(done, step_metrics, state)
        if watcher.requested(done):
            if position is not None:
                calls.data_iter.set_state(position)
            preempted_at = done
            break
        if save_due:
            recorder.save(done, state)
            if done < calls.last_step:
                batches = calls.read(done)
    if preempted_at is not None:
        if recorder.last_logged != preempted_at:
            # The row of the step the checkpoint holds, so that metrics.jsonl ends where a
            # resumed run starts (a resume keeps rows up to its checkpoint's step).
            recorder.log_row(preempted_at, step_metrics)
        if recorder.last_saved != preempted_at:
            recorder.save(preempted_at, state)
        checkpointing.wait(recorder.manager)
        metrics.log(
            f"preempted at step {preempted_at}; checkpoint saved; run the same command to resume"
        )
        recorder.row = dict(recorder.row, preempted_at=preempted_at)
    recorder.close(compiled=bool(calls.programs))
    return recorder.row


# -------------------------------------------------------------------------------- log, save


@dataclasses.dataclass
class _Recorder:
    """What a run records of its steps: their metrics rows (with the held-out readings when due)
    and checkpoints, after checking that no update in them was non-finite. Keeps between calls
    the flags not yet read, the timing of the rows and the last saved step. Built whole by
    `start`."""

    workdir: str
    manager: Any
    writer: metrics.MetricsWriter
    data_iter: Any
    skip: bool  # train.nan_policy == 'skip'
    num_steps: int
    # The step this call to `train` ends at (num_steps, or stop_after): it gets the held-out
    # readings too, as the run's last step does.
    last_step: int
    tokens_per_step: int
    flops_per_step: float
    peak: float | None
    evaluator: Any  # scoring.Evaluator, or None without held-out evaluation
    timed: timed_saves.TimedSaves  # checkpoint.every_minutes
    # The waits of the interval since the last row (shared with _CompiledCalls), the run's
    # goodput totals, and what this start cost before its first interval (its first row's).
    breakdown: timing.Breakdown
    totals: timing.Totals
    startup: dict
    run_start: float
    last_time: float
    last_logged: int
    last_saved: int | None
    # Non-finite flags (device arrays) since the last check, each with the first step it covers
    # (one step's scalar, or a whole call's [K]); read only when logging or saving, so that the
    # host never waits on the device every step.
    flags: list = dataclasses.field(default_factory=list)
    skipped: int = 0  # non-finite updates skipped since the previous row
    save_seconds: float = 0.0
    step_seconds: float = 0.0  # the steps' seconds, evaluations left out
    row: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def start(
        cls,
        config,
        workdir,
        setup: StepSetup,
        manager,
        data_iter,
        start_step: int,
        last_step: int,
        evaluator,
        clock: tuple,
    ):
        """The recorder of a run's steps from `start_step` to `last_step`. `clock`: the
        interval's waits (shared with the calls), the goodput totals, the start's own costs
        for its first row, when the first interval began and when this start began (what a
        resume lost before it goes in its first row too: timing.resume_columns)."""
        batch, length = config.train.batch_size, config.data.seq_length
        flops = metrics.count_flops(
            setup.spec, batch, length, setup.num_slots, config.objective.name
        )["total"]
        breakdown, totals, startup, interval_start, started = clock
        unknown_peak = metrics.unknown_peak_line(jax.devices()[0], config.log.peak_flops)
        if unknown_peak:
            metrics.log(unknown_peak)
        writer = metrics.MetricsWriter(
            workdir, jax.process_index() == 0, resume_step=start_step, config=config
        )
        lost = timing.resume_columns(writer.previous, start_step, started - totals.first_start)
        return cls(
            workdir=workdir,
            manager=manager,
            writer=writer,
            data_iter=data_iter,
            skip=config.train.nan_policy == "skip",
            num_steps=config.train.num_steps,
            tokens_per_step=batch * length,
            flops_per_step=flops,
            peak=metrics.peak_flops_per_device(jax.devices()[0].device_kind, config.log.peak_flops),
            run_start=timing.now(),
            last_time=interval_start,
            last_logged=start_step,
            last_saved=start_step if start_step > 0 else None,
            evaluator=evaluator,
            timed=timed_saves.TimedSaves(
                config.checkpoint.every_minutes, config.log.every_steps, start_step
            ),
            last_step=last_step,
            breakdown=breakdown,
            totals=totals,
            startup={**startup, **lost},
        )

    def check_finite(self) -> None:
        """Reads the flags gathered since the last check: counts skips, or stops the run."""
        values = jax.device_get([f for _, f in self.flags])
        per_step = [
            (s + i, v)
            for (s, _), vs in zip(self.flags, values, strict=True)
            for i, v in enumerate(np.ravel(vs))
        ]
        bad = [s for s, v in per_step if v > 0]
        first, last = (per_step[0][0], per_step[-1][0]) if per_step else (None, None)
        self.flags.clear()
        self.skipped += len(bad)
        if bad and not self.skip:
            good = (
                f"{checkpoint_steps.checkpoint_dir(self.workdir)}/{self.last_saved}"
                if self.last_saved is not None
                else "none (a rerun starts from step 0)"
            )
            checkpointing.wait(self.manager)
            raise NonFiniteError(
                f"non-finite loss or gradient norm at step {bad[0]} (found checking steps "
                f"{first}-{last}; nothing from them was saved); last good checkpoint: {good}; "
                "lower train.learning_rate, or set train.nan_policy='skip' to skip such updates"
            )

    def log_row(self, done: int, step_metrics: dict, state=None) -> None:
        """Writes the metrics row of step `done` (the last step of `step_metrics`, a whole
        call's being stacked [K]) and its progress line; with `state`, the held-out readings of
        its parameters too when they are due."""
        self.check_finite()
        row = {k: float(np.ravel(v)[-1]) for k, v in jax.device_get(step_metrics).items()}
        # Timed apart from the steps (the evaluation's own seconds are in its row), so that
        # tokens_per_sec and mfu stay the training's.
        step_seconds = timing.now() - self.last_time
        self.totals.productive += max(step_seconds - self.breakdown.waited(), 0.0)
        waits = self.breakdown.take()
        held_out = {}
        last = self.last_step
        if state is not None and self.evaluator and self.evaluator.due(done, last):
            t = timing.now()
            held_out = self.evaluator.run(state.params)
            waits["eval_sec"] = timing.now() - t
        self.step_seconds += step_seconds
        row["skipped_updates"] = self.skipped
        if self.skipped:
            metrics.log(f"warning: skipped {self.skipped} non-finite update(s) up to step {done}")
        self.skipped = 0
        now = timing.now()
        steps_done = done - self.last_logged
        # Without the compiling a first call (or a first short call) waited for.
        compiled = waits.get("compile_sec", 0.0)
        seconds = max(step_seconds - compiled, 1e-9)
        row["tokens_per_sec"] = self.tokens_per_step * steps_done / seconds
        achieved = self.flops_per_step * steps_done / seconds / jax.device_count()
        row["mfu"] = achieved / self.peak if self.peak else None
        row["elapsed_sec"] = now - self.run_start
        row.update(waits)
        for column, seconds_before in self.startup.items():  # this start's first row
            row[column] = row.get(column, 0.0) + seconds_before
        self.startup = {}
        row.update(self.totals.columns(now))
        row.update(held_out)
        self.writer.write(done, row)
        left = (self.num_steps - done) * (now - self.last_time - compiled) / steps_done
        line = metrics.progress_line(done, self.num_steps, row, left)
        # The interval's own waits: a start's compiling before it (the evaluation's) is not.
        metrics.log(line + timing.not_compute_note(waits, step_seconds))
        self.row, self.last_time, self.last_logged = row, now, done

    def save(self, done: int, state) -> None:
        self.check_finite()  # never save a state that a non-finite update produced
        t = timing.now()
        # The productive seconds up to step `done`: those of the rows, and of its steps since.
        pending = max(t - self.last_time - self.breakdown.waited(), 0.0)
        self.writer.flush()  # a gs:// workdir's metrics.jsonl, uploaded with each checkpoint
        # Before the next batch is read, so the saved position is that of step `done`.
        checkpointing.save(
            self.manager, done, state, self.data_iter, goodput=self.totals.saved(pending)
        )
        seconds = timing.now() - t
        self.save_seconds += seconds
        self.breakdown.add("checkpoint_block_sec", seconds)
        self.last_saved = done
        self.timed.saved(done)

    def close(self, compiled: bool) -> None:
        checkpointing.wait(self.manager)
        self.manager.close()
        self.writer.close()
        if self.save_seconds and compiled:
            metrics.log(f"checkpoint saves blocked the loop for {self.save_seconds:.2f}s in total")
        ev = self.evaluator
        if ev is not None and ev.runs and self.step_seconds > 0:
            made = (
                "compiled earlier in this process"
                if ev.reused
                else f"compiled once, in {ev.compile_seconds:.1f}s"
            )
            metrics.log(
                f"held-out evaluation: {ev.runs} run(s), {ev.seconds:.1f}s, "
                f"{100 * ev.seconds / self.step_seconds:.1f}% of the steps' time ({made})"
            )
