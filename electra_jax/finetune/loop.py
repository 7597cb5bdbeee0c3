"""The one fine-tuning runner: finetune(config, workdir), in sections, for every task family.

workdir -> data -> model -> features -> state (restore) -> steps (log, checkpoints) -> save ->
evaluate -> write. `config.family` picks the family (glue.py, squad.py: what is read, the head,
the loss and the scorer, behind family.Family); everything else is here, written once. The host
reads and tokenizes the task once; each step then runs forward, loss and the AdamW update (with
layer-wise learning rates) in one compiled program, data-parallel over the local devices. A run
is a pure function of the config: the same seed gives the same dev numbers, and a run stopped
and resumed from its checkpoint gives the numbers of one that ran through.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from electra_jax import checkpointing, jsonio, paths, sharding
from electra_jax import workdir as workdir_lib
from electra_jax.config import finetune_keys
from electra_jax.config.schema import ConfigError
from electra_jax.data import DataError
from electra_jax.finetune import checks, heads, inputs, saved
from electra_jax.finetune.family import ORDER_STREAM, Family
from electra_jax.finetune.glue import GLUE
from electra_jax.finetune.squad import SQUAD
from electra_jax.metrics import log
from electra_jax.model import (
    ElectraSpec,
    EncoderSpec,
    discriminator_embedding_params,
    generator_spec,
)
from electra_jax.optim import layerwise_lr_multipliers, make_finetune_optimizer
from electra_jax.train_step import TrainState
from electra_jax.weights import PretrainedError

FAMILIES: dict[str, Family] = {f.name: f for f in (GLUE, SQUAD)}
RESULTS_FILE = saved.RESULTS_FILE
PREDICTIONS_FILE = GLUE.predictions_file
NonFiniteError = checks.NonFiniteError
# Fields a resumed run may change: they change no number of the run (Key.resume FREE).
RESUMABLE_CHANGES = finetune_keys.free_on_resume()

# The ELECTRA paper's fine-tuning learning rate and layer-wise decay by model size (its Table 7),
# keyed by the discriminator's hidden size. (The released code's default learning rate is 1e-4
# for Small and Base alike; the table gives Small 3e-4.)
PAPER_HYPERPARAMETERS = (
    # name, hidden size, learning rate, layer decay
    ("Small", 256, 3e-4, 0.8),
    ("Base", 768, 1e-4, 0.8),
    ("Large", 1024, 5e-5, 0.9),
)


def check_config(config: ml_collections.ConfigDict) -> tuple[Family, Any]:
    """(family, task) of the config (checks.check_config, which says what the task is);
    ConfigError (one line naming the key) for values that cannot work."""
    name, task = checks.check_config(config)
    return FAMILIES[name], task


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


# ------------------------------------------------------------------------------------------ model


@dataclasses.dataclass(frozen=True)
class Initial:
    """Where fine-tuning starts: the network's spec, its tokenizer, pre-trained encoder params."""

    spec: ElectraSpec
    tokenizer: Any
    encoder_params: dict | None  # {'embeddings': ..., 'discriminator': ...}; None = random init
    source: str  # what init_from resolved to, or 'random'
    pretraining: dict | None = None  # saved.pretraining_record of init_from


def _load_pretrained(path: str):
    """electra_jax.pretrained.load_pretrained, imported late (tests replace this function)."""
    from electra_jax import pretrained

    return pretrained.load_pretrained(path)


def _random_spec(model_cfg: Any, vocab_size: int) -> ElectraSpec:
    disc = EncoderSpec(
        hidden_size=model_cfg.hidden_size,
        num_layers=model_cfg.num_layers,
        num_heads=model_cfg.num_heads,
        intermediate_size=model_cfg.intermediate_size,
    )
    return ElectraSpec(
        vocab_size=vocab_size,
        embedding_size=model_cfg.embedding_size,
        max_position_embeddings=model_cfg.max_position_embeddings,
        type_vocab_size=model_cfg.type_vocab_size,
        discriminator=disc,
        generator=generator_spec(disc, 0.25),  # never built: fine-tuning has no generator
        initializer_range=model_cfg.initializer_range,
        layer_norm_eps=model_cfg.layer_norm_eps,
    )


def _task_tokenizer(config, texts: list[str], workdir: str):
    """config.tokenizer, or a SentencePiece model trained on the task's training texts."""
    from electra_jax.data import tokenizer as tokenizer_lib

    if config.tokenizer:
        return tokenizer_lib.Tokenizer.load(config.tokenizer)
    try:
        return tokenizer_lib.train_tokenizer(
            texts,
            paths.join(workdir, saved.TOKENIZER_DIR),
            vocab_size=int(config.vocab_size),
            character_coverage=0.9995,
            seed=int(config.seed),
            sample_sentences=len(texts) + 1,
        )
    except DataError as e:  # its message names the pre-training key
        raise DataError(str(e).replace("data.vocab_size", "config.vocab_size")) from None


def _pretrained(config, path: str | None = None):
    """init_from's Pretrained (or that of `path`, init_from pinned to a step); ConfigError when
    it cannot be read."""
    try:
        return _load_pretrained(path or config.init_from)
    except PretrainedError as e:  # its message names the path and what would work
        raise ConfigError(f"config.init_from: {e}") from None


def _encoder_params(pre) -> dict:
    params = {k: pre.params[k] for k in heads.PRETRAINED_SUBTREES}
    # The discriminator's own embeddings (under 'gdes': the shared tables plus its deltas).
    params["embeddings"] = discriminator_embedding_params(pre.params, pre.spec.embedding_sharing)
    return params


def training_spec(spec: ElectraSpec, config) -> ElectraSpec:
    """`spec` with fine-tuning's training choices: dropout, compute type, einsum attention."""
    return dataclasses.replace(
        spec,
        dropout_rate=config.dropout_rate,
        attention_dropout_rate=config.dropout_rate,
        dtype=config.dtype,
        # Fine-tuning keeps attention dropout, which only the einsum attention has.
        attention="einsum",
        remat="none",
        # One plain embedding block (a 'gdes' run's discriminator tables are merged below) and
        # no pre-training heads.
        embedding_sharing="electra",
        mlm_head=False,
        policy_baseline=False,
    )


def initial_model(config, task_texts: list[str], workdir: str) -> Initial:
    """The spec, tokenizer and (pre-trained) encoder params fine-tuning starts from.

    With config.init_from, everything but the training choices (dropout, compute type) comes
    from the pre-trained model; otherwise config.model and config.tokenizer (or a tokenizer
    trained on task_texts, the task's training text) make a randomly initialised one.
    """
    if config.init_from:
        pre = _pretrained(config)
        record = saved.pretraining_record(config.init_from, pre)
        return Initial(
            training_spec(pre.spec, config), pre.tokenizer, _encoder_params(pre), pre.source, record
        )
    tokenizer = _task_tokenizer(config, task_texts, workdir)
    spec = training_spec(_random_spec(config.model, tokenizer.vocab_size), config)
    return Initial(spec, tokenizer, None, "random")


# ------------------------------------------------------------------------------------------ steps


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


def predict(predict_fn, params, arrays: dict, batch_size: int) -> dict:
    """predict_fn's outputs ([N, ...] numpy) for [N, L] input_ids, segment_ids, input_mask, in
    fixed-size batches (the last one padded with empty rows, so that one compiled shape serves
    every batch)."""
    inputs = {k: np.asarray(arrays[k]) for k in ("input_ids", "segment_ids", "input_mask")}
    n = len(inputs["input_ids"])
    chunks = []
    for start in range(0, max(n, 1), batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        real = len(chunk["input_ids"])
        if real < batch_size:
            chunk = {k: np.pad(v, ((0, batch_size - real), (0, 0))) for k, v in chunk.items()}
        out = jax.device_get(predict_fn(params, chunk))
        chunks.append({k: np.asarray(v)[:real] for k, v in out.items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


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


# ------------------------------------------------------------------------------------------ run


def finetune(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_after: int | None = None,
    command: str | None = None,
    allow_changes: tuple[str, ...] = (),
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
    allow_changes: what a resume may find changed since the run started (inputs.ALLOWED:
      'data_dir', 'init_from'); recorded in config_changes.jsonl.

    Raises:
      ConfigError / DataError: bad config values, data files or init_from, or a workdir that
        holds another run (one-line messages), found before anything is written.
      NonFiniteError: the training loss or gradient norm became NaN/Inf (checked as the losses
        are read for each log line and checkpoint), or the final model's dev outputs are; no
        results are written.
    """
    started = time.time()
    config = finetune_keys.complete(config)  # keys it lacks at their defaults
    family, task = check_config(config)
    checks.check_allowed(allow_changes)
    # Locked for the run; a pre-training workdir (or any folder not ours) is refused, since
    # fine-tuning writes its own config.json and tokenizer/ there.
    with workdir_lib.claimed(workdir, workdir_lib.FINETUNE, command="electra_jax.finetune"):
        return _finetune(
            config, workdir, family, task, started, stop_after, command, tuple(allow_changes)
        )


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


def _differences(
    saved_config: dict, config: dict, prefix: str = "", free: tuple[str, ...] = ()
) -> list[str]:
    """'key: now X, there Y' for every field that differs between two config dicts, but those
    of RESUMABLE_CHANGES and `free`."""
    out = []
    for key in sorted(set(saved_config) | set(config)):
        a, b = saved_config.get(key, "(absent)"), config.get(key, "(absent)")
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, name + ".", free)
        elif a != b and name not in RESUMABLE_CHANGES and name not in free:
            out.append(f"{name} is {b!r} now, {a!r} there")
    return out


# What a run writes once it is under way (after config.json): a workdir holding one of these
# holds a run, whatever else is missing.
_RUN_OUTPUTS = (
    saved.RESULTS_FILE,
    saved.WEIGHTS_FILE,
    GLUE.predictions_file,
    SQUAD.predictions_file,
    "dev_null_odds.json",
)


def _check_started_run(workdir: str, family: Family, task) -> None:
    """ConfigError when WORKDIR, without its config.json, still holds a run: model.json of
    another task, or what a run writes once under way (results, weights, checkpoints). A start
    cut short (model.json of this task and the tokenizer only) is started over."""
    model_path = paths.join(workdir, saved.MODEL_FILE)
    now = family.describe(task)["task"]
    if paths.exists(model_path):
        try:
            record = saved.read_model(workdir)
        except PretrainedError as e:
            raise ConfigError(str(e)) from None
        there = record.get("task")
        if there != now or record.get("family", family.name) != family.name:
            raise ConfigError(
                f"--workdir {workdir} holds a {record.get('family', '?')} fine-tuning of {there} "
                f"({model_path}), not of {now}; a workdir holds one task and one run: choose a "
                "new --workdir"
            )
    _refuse_a_run_missing(workdir, saved.CONFIG_FILE)


def _refuse_a_run_missing(workdir: str, missing: str) -> None:
    """ConfigError when WORKDIR holds what a run writes once under way (results, weights,
    checkpoints) but not `missing`, one of the records written when it starts: what it ran is
    then unknown, and starting over would write over it (or die on its checkpoints)."""
    found = [n for n in _RUN_OUTPUTS if paths.exists(paths.join(workdir, n))]
    if checkpointing.has_checkpoints(workdir):
        found.append("checkpoints/")
    if found:
        raise ConfigError(
            f"--workdir {workdir} holds a fine-tuning run ({', '.join(found)}) whose {missing} "
            f"is missing, so what it ran is unknown and it is not replaced: put {missing} back "
            "(from a copy), or choose a new --workdir"
        )


def previous_run(
    config, workdir: str, family: Family, task, allow: tuple[str, ...] = ()
) -> tuple[dict | None, dict | None]:
    """(model.json, eval_results.json) of the run WORKDIR holds, (None, None) when it holds none.

    Raises ConfigError when the workdir holds another run: another family or task, other
    settings (but those of RESUMABLE_CHANGES and the keys `allow` names), or other labels than
    the task has now.
    """
    config_path = paths.join(workdir, saved.CONFIG_FILE)
    model_path = paths.join(workdir, saved.MODEL_FILE)
    if not paths.exists(config_path):
        _check_started_run(workdir, family, task)
        return None, None
    try:
        there = saved.read_json(config_path, "restore it or use a new --workdir")
    except PretrainedError as e:
        raise ConfigError(str(e)) from None
    results_path = paths.join(workdir, RESULTS_FILE)
    finished = paths.exists(results_path)
    differences = _differences(there, config.to_dict(), free=allow)
    if differences:
        what = there.get("task") or (f"SQuAD {there['version']}" if "version" in there else "?")
        kind = f"a {there['family']} fine-tuning" if "family" in there else "a fine-tuning"
        if "family" not in there:
            kind += " of an earlier version"
        more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
        raise ConfigError(
            f"--workdir {workdir} holds {'the finished' if finished else 'the unfinished'} "
            f"{kind.removeprefix('a ')} of {what}, and this run differs ({differences[0]}{more}); "
            "a workdir holds one run: choose a new --workdir, or the same settings to resume it"
        )
    if not paths.exists(model_path):  # stopped before its start was written: start over
        _refuse_a_run_missing(workdir, saved.MODEL_FILE)  # unless it went on (then: lost)
        return None, None
    try:
        record = saved.read_model(workdir)
    except PretrainedError as e:
        raise ConfigError(str(e)) from None
    now = family.describe(task)
    if record.get("labels") != now["labels"]:
        raise ConfigError(
            f"--workdir {workdir}: {now['task']}'s labels are {now['labels']} now but the run "
            f"there trained with {record.get('labels')} ({model_path}); a resumed run keeps its "
            "labels: choose a new --workdir to fine-tune with the new ones"
        )
    results = None
    if finished and paths.exists(paths.join(workdir, saved.WEIGHTS_FILE)):
        try:
            results = saved.read_json(results_path, "rerun in a new --workdir")
        except PretrainedError as e:
            raise ConfigError(str(e)) from None
    return record, results


def _resumed_model(
    config, workdir: str, record: dict, needs_encoder: bool, allow: tuple[str, ...]
) -> Initial:
    """The Initial of a run that started in WORKDIR: its spec and tokenizer as it saved them;
    the encoder from init_from only when no checkpoint holds the weights yet, read where the
    first start read it (inputs.py: a workdir at the step it had then), unless the resume may
    change init_from."""
    try:
        spec = saved.spec_from_json(record.get("spec"), paths.join(workdir, saved.MODEL_FILE))
        tokenizer = saved.load_tokenizer(workdir, record.get("tokenizer_fingerprint"))
    except PretrainedError as e:
        raise ConfigError(str(e)) from None
    encoder = None
    if needs_encoder and config.init_from:
        pinned = (record.get("inputs") or {}).get("init_from", {}).get("load")
        path = config.init_from if "init_from" in allow or not pinned else pinned
        encoder = _encoder_params(_pretrained(config, path))
    return Initial(
        spec, tokenizer, encoder, record.get("init_source", "?"), record.get("pretraining")
    )


def _finetune(config, workdir, family: Family, task, started, stop_after, command, allow) -> dict:
    # ---------------------------------------------------------------- workdir
    mesh = local_mesh(config)
    record, finished = previous_run(config, workdir, family, task, allow)
    if finished is not None:
        log(f"{workdir} holds this run, finished: {paths.join(workdir, RESULTS_FILE)}")
        return finished

    # ---------------------------------------------------------------- data
    data = family.read(config, task)
    files, tfds = family.input_files(config, task)

    # ---------------------------------------------------------------- model
    resuming = record is not None
    has_checkpoint = resuming and checkpointing.has_checkpoints(workdir)
    new_inputs = None  # model.json's "inputs" to write once the resumed step is known
    if resuming:
        new_inputs = inputs.check_data(workdir, record, files, tfds, allow)
        init = _resumed_model(config, workdir, record, not has_checkpoint, allow)
        if init.encoder_params is not None:
            seen = {**record, "inputs": new_inputs or record.get("inputs")}
            new_inputs = inputs.check_weights(workdir, seen, init.encoder_params, allow) or (
                new_inputs
            )
    else:
        init = initial_model(config, data.texts, workdir)
    spec = init.spec
    checks.require(
        config.seq_length <= spec.max_position_embeddings,
        f"config.seq_length={config.seq_length} exceeds the model's "
        f"{spec.max_position_embeddings} positions",
    )

    # ---------------------------------------------------------------- features
    feats = family.featurize(config, task, data, init.tokenizer)
    # Logged only now, so that bad input above fails with its one line and nothing else.
    log(feats.summary)
    log(
        f"model from {init.source}: {spec.discriminator.num_layers} layers x "
        f"{spec.discriminator.hidden_size}, vocab {spec.vocab_size}"
    )

    # ---------------------------------------------------------------- state
    num_rows = len(feats.train["input_ids"])
    num_steps = max(1, int(num_rows * feats.epochs / config.batch_size))
    last_step = num_steps if stop_after is None else max(0, min(num_steps, int(stop_after)))
    model = family.network(config, task, spec)
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    # Jitted: one compilation rather than one per operation.
    params = jax.jit(functools.partial(family.init_params, model))(init_rng)
    if init.encoder_params is not None:
        try:
            params = heads.with_pretrained(params, init.encoder_params)
        except ValueError as e:
            raise ConfigError(f"config.init_from={config.init_from!r}: {e}") from None
    hyper = resolve_hyperparameters(config, spec.discriminator.hidden_size)
    learning_rate, layer_decay = hyper["learning_rate"], hyper["layer_decay"]
    tx, schedule, state = optimizer_and_state(
        config, params, spec, num_steps, layer_decay, learning_rate, dropout_rng, mesh
    )
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

    # ---------------------------------------------------------------- start records
    if not resuming:
        saved.save_tokenizer(init.tokenizer, workdir)
        record = {
            "format": saved.FORMAT,
            "version": saved.VERSION,
            "family": family.name,
            **family.describe(task),
            "spec": saved.spec_to_json(spec),
            "tokenizer_fingerprint": init.tokenizer.fingerprint,
            "init_from": config.init_from,
            "init_source": init.source,
            "pretraining": init.pretraining,
            "command": command,
            "num_steps": num_steps,
            "inputs": inputs.first_record(
                files,
                tfds,
                inputs.pinned_init_from(config, init.pretraining),
                init.encoder_params,
            ),
        }
        jsonio.write_json(paths.join(workdir, saved.MODEL_FILE), record)
        # config.json last: its presence says the run started and model.json is whole.
        jsonio.write_json(paths.join(workdir, saved.CONFIG_FILE), config.to_dict())

    # ---------------------------------------------------------------- restore
    manager = checkpointing.make_manager(workdir, config.checkpoint)
    history = np.zeros((num_steps, 2), np.float32)  # every step's (loss, grad norm)
    first = 0
    try:
        if has_checkpoint:
            abstract = {
                "train": jax.tree_util.tree_map(
                    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
                ),
                "history": jax.ShapeDtypeStruct(history.shape, history.dtype, sharding=replicated),
            }
            restored = checkpointing.restore_latest(
                manager, abstract, None, log=log, step_of=lambda r: r["train"].step
            )
            if restored is not None:
                state, history = restored["train"], np.array(restored["history"])
                first = int(state.step)
                log(f"resumed from checkpoint {first} of {num_steps} steps")
        if resuming:
            inputs.record_resume(workdir, record, new_inputs, first, config, log)

        # ------------------------------------------------------------ steps
        order = batch_order(num_rows, config.batch_size, num_steps, config.seed)
        sources = {hyper["learning_rate_source"], hyper["layer_decay_source"]} - {"config"}
        log(
            f"fine-tuning {num_steps} steps ({feats.epochs:g} epochs of {num_rows} {feats.unit}, "
            f"batch {config.batch_size}, "
            f"peak lr {learning_rate:g}, layer decay {layer_decay:g}"
            + "".join(f"; {s}" for s in sorted(sources))  # where the defaults came from
            + ")"
        )
        take = lambda step: {k: v[order[step]] for k, v in feats.train.items()}

        def save(done, state):
            checkpointing.save(manager, done, {"train": state, "history": history.copy()})

        state, done, stopped = run_steps(
            step_fn,
            state,
            take,
            first=first,
            last=last_step,
            num_steps=num_steps,
            history=history,
            config=config,
            rate=learning_rate,
            unit=feats.unit,
            save=save,
        )
        checkpointing.wait(manager)
    finally:
        manager.close()
    if done < num_steps:
        return {"stopped_at": done, "steps": num_steps, "preempted": stopped}
    train_loss = window_loss(history, num_steps, config.log_every_steps)

    # ---------------------------------------------------------------- evaluate
    check = functools.partial(
        checks.check_finite_outputs, num_steps=num_steps, learning_rate=learning_rate
    )
    run_predict = lambda arrays: predict(predict_fn, state.params, arrays, config.eval_batch_size)
    results, files = family.evaluate(config, task, run_predict, data, feats, check)
    lines, score = family.shown(results)
    for line in lines:
        log(line)

    # ---------------------------------------------------------------- write
    saved.save_weights(workdir, jax.device_get(state.params))
    results.update(
        {
            "steps": num_steps,
            "epochs": feats.epochs,
            "batch_size": config.batch_size,
            **hyper,
            "layer_decay_exponents": config.layer_decay_exponents,
            "seed": config.seed,
            "init_from": config.init_from,
            "init_source": init.source,
            "train_loss": train_loss,
            "predictions_file": family.predictions_file,
            "elapsed_sec": time.time() - started,
        }
    )
    for name, text in files.items():
        jsonio.write_atomic(paths.join(workdir, name), text)
    # eval_results.json last: its presence (with the weights) says the run is finished.
    jsonio.write_json(paths.join(workdir, RESULTS_FILE), results)
    log(f"wrote {paths.join(workdir, RESULTS_FILE)} ({score}) and {saved.WEIGHTS_FILE}")
    return results
