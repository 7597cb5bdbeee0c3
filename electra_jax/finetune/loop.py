"""The one fine-tuning runner: finetune(config, workdir), in sections, for every task family.

workdir (prior_run.py) -> data -> model (initial.py) -> features -> state (restore) -> steps
(fit.py: log, checkpoints) -> evaluate and write (results.py). `config.family` picks the
family (glue.py, squad.py: what is read, the head, the loss and the scorer, behind
family.Family); everything else is written once, for both. The host reads and tokenizes the task
once; each step then runs forward, loss and the AdamW update (with layer-wise learning rates) in
one compiled program, data-parallel over the local devices. A run
is a pure function of the config: the same seed gives the same dev numbers, and a run stopped
and resumed from its checkpoint gives the numbers of one that ran through.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from electra_jax.config import finetune_keys
from electra_jax.errors import ConfigError
from electra_jax.finetune import (
    checks,
    fit,
    glue_heads,
    initial,
    inputs,
    prior_run,
    results,
    saved,
)
from electra_jax.finetune.family import Data, Family
from electra_jax.finetune.glue import GLUE
from electra_jax.finetune.squad import SQUAD
from electra_jax.model import sharding
from electra_jax.model.sharding import log
from electra_jax.run import rerun
from electra_jax.store import checkpoint_steps, checkpointing, jsonio, paths

FAMILIES: dict[str, Family] = {f.name: f for f in (GLUE, SQUAD)}
RESULTS_FILE = saved.RESULTS_FILE
PREDICTIONS_FILE = GLUE.predictions_file


def check_config(config: ml_collections.ConfigDict) -> tuple[Family, Any]:
    """(family, task) of the config (checks.check_config, which says what the task is);
    ConfigError (one line naming the key) for values that cannot work."""
    name, task = checks.check_config(config)
    return FAMILIES[name], task


def finetune(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_after: int | None = None,
    command: str | None = None,
    allow_changes: tuple[str, ...] = (),
    data: Data | None = None,
) -> dict:
    """Fine-tunes on the config's task, evaluates on its dev set(s), writes the results and the
    model; returns the results (eval_results.json's fields).

    Writes WORKDIR/config.json, model.json and tokenizer/ when the run starts, checkpoints/ as
    it goes, then model.safetensors, the family's prediction files and eval_results.json (see
    docs/finetuning.md). A workdir that holds this run continues from its newest checkpoint
    (a finished one returns its results); one that holds another run is refused.

    stop_after: end after that step with a checkpoint, as a preemption would (returns
      {'stopped_at': step, 'steps': num_steps}; SIGTERM / SIGINT during the steps does the same).
    command: the command line that started the run, recorded in model.json for the model card.
    allow_changes: what a resume may find changed since the run started (checks.ALLOWED:
      'data_dir', 'init_from'; prior_run.plan holds the rest to the free keys); recorded in
      config_changes.jsonl.
    data: the task's examples, when the caller has read them for this config
      (reading.READERS[config.family]); else they are read here (a finished run reads none).

    Raises:
      ConfigError / DataError: bad config values, data files or init_from, or a workdir that
        holds another run (one-line messages), found before anything is written.
      NonFiniteError: the training loss or gradient norm became NaN/Inf (checked as the losses
        are read for each log line and checkpoint), or the final model's dev outputs are; no
        results are written.
    """
    config = finetune_keys.complete(config)  # keys it lacks at their defaults
    name, task = checks.check_config(config)
    checks.check_allowed(allow_changes)
    planned = prior_run.plan(
        config, workdir, name, task, tuple(allow_changes), command, claim=False
    )
    return finetune_planned(planned, stop_after, data)


def finetune_planned(run: rerun.Resume, stop_after: int | None = None, data=None) -> dict:
    """`finetune` of the run prior_run.plan answered (its config completed and checked; `data`
    as `finetune` takes it): planned without the claim (the command line's, before jax), its
    workdir is claimed here (rerun.take), so that nothing planned is asked twice; a pre-training
    workdir (or any folder not ours) was refused, since fine-tuning writes its own config.json
    and tokenizer/ there. Released when the run ends."""
    started = time.time()
    family, task = FAMILIES[run.rules.family], run.rules.task
    mesh = local_mesh(run.config)  # one process: before the claim, which every process would join
    run = rerun.take(run)
    try:
        return _finetune(run, mesh, family, task, started, stop_after, data)
    finally:
        run.release()


def local_mesh(config):
    """The mesh of all local devices, data-parallel; ConfigError when the batch sizes do not
    split over them or the run is multi-process."""
    checks.require(
        jax.process_count() == 1,
        "fine-tuning runs in one process (all its local devices data-parallel); start it "
        "without jax.distributed",
    )
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"fsdp": 1}))
    devices = sharding.data_parallel_size(mesh)
    for key in ("batch_size", "eval_batch_size"):
        checks.require(
            config[key] % devices == 0,
            f"config.{key}={config[key]} is not divisible by the {devices} local devices",
        )
    return mesh


def _finetune(
    run: rerun.Resume, mesh, family: Family, task, started, stop_after, data: Data | None
) -> dict:
    config, workdir, record = run.config, run.workdir, run.started
    if run.finished is not None:
        files, tfds = family.input_files(config, task)
        changed = inputs.check_finished(run, files, tfds)
        if changed:
            log(changed)
        log(f"{workdir} holds this run, finished: {paths.join(workdir, RESULTS_FILE)}")
        return run.finished

    if data is None:
        data = family.read(config, task)
    files, tfds = family.input_files(config, task)
    resuming = record is not None
    has_checkpoint = resuming and run.resumes
    if resuming:  # what model.json's "inputs" becomes is written once the resumed step is known
        inputs.hold_files(run, files, tfds)
        init = initial.resumed_model(config, workdir, record, not has_checkpoint, run.allow)
        if init.encoder_params is not None:
            inputs.hold_weights(run, init.encoder_params)
    else:
        init = initial.initial_model(config, data.texts, workdir)
    spec = init.spec
    checks.require(
        config.seq_length <= spec.max_position_embeddings,
        f"config.seq_length={config.seq_length} exceeds the model's "
        f"{spec.max_position_embeddings} positions",
    )

    feats = family.featurize(config, task, data, init.tokenizer)
    # Logged only now, so that bad input above fails with its one line and nothing else.
    log(feats.summary)
    log(
        f"model from {init.source}: {spec.discriminator.num_layers} layers x "
        f"{spec.discriminator.hidden_size}, vocab {spec.vocab_size}"
    )

    num_rows = len(feats.train["input_ids"])
    num_steps = max(1, int(num_rows * feats.epochs / config.batch_size))
    last_step = num_steps if stop_after is None else max(0, min(num_steps, int(stop_after)))
    if resuming:
        how = f"{num_rows} {feats.unit} x {feats.epochs:g} epochs / batch {config.batch_size}"
        prior_run.check_steps(run, num_steps, how)
    model = family.network(config, task, spec)
    hyper = fit.resolve_hyperparameters(config, spec.discriminator.hidden_size)
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    params = _initial_params(config, family, model, init, init_rng)
    tx, schedule, state = fit.optimizer_and_state(
        config,
        params,
        spec,
        num_steps,
        hyper["layer_decay"],
        hyper["learning_rate"],
        dropout_rng,
        mesh,
    )
    step_fn, predict_fn = fit.compiled_steps(family, config, task, model, tx, schedule, mesh)
    if not resuming:
        _write_start(config, workdir, family, task, init, run.command, num_steps, files, tfds)

    def resumed(first: int) -> None:
        if resuming:
            run.record(first)

    state, history, done, stopped = _train(
        config, workdir, mesh, state, step_fn, feats, hyper, (num_steps, last_step), resumed
    )
    if done < num_steps:
        return {"stopped_at": done, "steps": num_steps, "preempted": stopped}
    return results.evaluate_and_write(
        config,
        workdir,
        family,
        task,
        params=state.params,
        predict_fn=predict_fn,
        data=data,
        feats=feats,
        num_steps=num_steps,
        hyper=hyper,
        init_source=init.source,
        train_loss=fit.window_loss(history, num_steps, config.log_every_steps),
        started=started,
    )


def _initial_params(config, family: Family, model, init: initial.Initial, init_rng) -> dict:
    """The network's parameters at step 0: the family's initialisation from `init_rng`, the
    pre-trained encoder (when there is one) put in place."""
    # Jitted: one compilation rather than one per operation.
    params = jax.jit(functools.partial(family.init_params, model))(init_rng)
    if init.encoder_params is None:
        return params
    try:
        return glue_heads.with_pretrained(params, init.encoder_params)
    except ValueError as e:
        raise ConfigError(f"config.init_from={config.init_from!r}: {e}") from None


def _write_start(config, workdir, family: Family, task, init, command, num_steps, files, tfds):
    """The records of a run's first start: tokenizer/, model.json (what it fine-tunes, from
    what, on which inputs), then config.json, whose presence says the run started and
    model.json is whole."""
    saved.save_tokenizer(init.tokenizer, workdir)
    record = {
        "format": saved.FORMAT,
        "version": saved.VERSION,
        "family": family.name,
        **family.describe(task),
        "spec": saved.spec_to_json(init.spec),
        "tokenizer_fingerprint": init.tokenizer.fingerprint,
        "init_from": config.init_from,
        "init_source": init.source,
        "pretraining": init.pretraining,
        "command": command,
        "num_steps": num_steps,
        "inputs": inputs.first_record(
            files, tfds, inputs.pinned_init_from(config, init.pretraining), init.encoder_params
        ),
    }
    jsonio.write_json(paths.join(workdir, saved.MODEL_FILE), record)
    jsonio.write_json(paths.join(workdir, saved.CONFIG_FILE), config.to_dict())


def _train(config, workdir, mesh, state, step_fn, feats, hyper, steps, resumed):
    """Restores the newest checkpoint (when there is one; `resumed(step)` is told the step the
    run goes on from, 0 for a new one) and runs the steps up to `last_step` of `num_steps`
    (`steps`: the two).
    Returns (state, history: [num_steps, 2] (loss, grad norm), steps done, whether a
    termination signal stopped it)."""
    num_steps, last_step = steps
    manager = checkpointing.make_manager(workdir, config.checkpoint)
    history = np.zeros((num_steps, 2), np.float32)  # every step's (loss, grad norm)
    first = 0
    try:
        if checkpoint_steps.has_checkpoints(workdir):
            abstract = {
                "train": jax.tree_util.tree_map(
                    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
                ),
                "history": jax.ShapeDtypeStruct(
                    history.shape, history.dtype, sharding=sharding.replicated(mesh)
                ),
            }
            restored = checkpointing.restore_latest(
                manager, abstract, None, log=log, step_of=lambda r: r["train"].step
            )
            if restored is not None:
                state, history = restored["train"], np.array(restored["history"])
                first = int(state.step)
                log(f"resumed from checkpoint {first} of {num_steps} steps")
        resumed(first)

        num_rows = len(feats.train["input_ids"])
        order = fit.batch_order(num_rows, config.batch_size, num_steps, config.seed)
        sources = {hyper["learning_rate_source"], hyper["layer_decay_source"]} - {"config"}
        log(
            f"fine-tuning {num_steps} steps ({feats.epochs:g} epochs of {num_rows} {feats.unit}, "
            f"batch {config.batch_size}, "
            f"peak lr {hyper['learning_rate']:g}, layer decay {hyper['layer_decay']:g}"
            + "".join(f"; {s}" for s in sorted(sources))  # where the defaults came from
            + ")"
        )
        take = lambda step: {k: v[order[step]] for k, v in feats.train.items()}

        def save(done, state):
            checkpointing.save(manager, done, {"train": state, "history": history.copy()})

        state, done, stopped = fit.run_steps(
            step_fn,
            state,
            take,
            first=first,
            last=last_step,
            num_steps=num_steps,
            history=history,
            config=config,
            rate=hyper["learning_rate"],
            unit=feats.unit,
            save=save,
        )
        checkpointing.wait(manager)
    finally:
        manager.close()
    return state, history, done, stopped
