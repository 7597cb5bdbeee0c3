"""Fine-tuning on one GLUE task: finetune(config, workdir), in sections.

data -> model -> features -> state -> steps (log) -> evaluate -> write. The host reads and
tokenizes the task once; each step then runs forward, loss and the AdamW update (with
layer-wise learning rates) in one compiled program, data-parallel over the local devices. A run
is a pure function of the config: the same seed gives the same dev numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from electra_jax import jsonio, sharding
from electra_jax import workdir as workdir_lib
from electra_jax.data import DataError
from electra_jax.finetune import features, heads, tasks
from electra_jax.finetune import metrics as glue_metrics
from electra_jax.metrics import log
from electra_jax.model import (
    ElectraSpec,
    EncoderSpec,
    discriminator_embedding_params,
    generator_spec,
)
from electra_jax.optim import layerwise_lr_multipliers, make_finetune_optimizer
from electra_jax.train_step import TrainState
from electra_jax.validate import ConfigError

RESULTS_FILE = "eval_results.json"
PREDICTIONS_FILE = "dev_predictions.jsonl"
# Random streams under the one seed: the subset kept by max_train_examples is drawn from a fixed
# stream (every seed fine-tunes on the same examples, so seeds measure the fine-tuning's own
# variance); the epoch shuffles from the run's seed.
_SUBSET_STREAM, _ORDER_STREAM = 1, 2


# The ELECTRA paper's fine-tuning learning rate and layer-wise decay by model size (its Table 7),
# keyed by the discriminator's hidden size. (The released code's default learning rate is 1e-4
# for Small and Base alike; the table gives Small 3e-4.)
PAPER_HYPERPARAMETERS = (
    # name, hidden size, learning rate, layer decay
    ("Small", 256, 3e-4, 0.8),
    ("Base", 768, 1e-4, 0.8),
    ("Large", 1024, 5e-5, 0.9),
)
LAYER_DECAY_EXPONENTS = ("electra_jax", "original")


class NonFiniteError(RuntimeError):
    """The training loss or gradient norm became NaN/Inf: the run diverged."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _number(config, key: str, rule: str, note: str = "") -> None:
    """ConfigError unless config[key] (dotted for config.model) is a finite number obeying `rule`:
    '> 0', '>= 0', '>= 1', '(0, 1]', '[0, 1)', with a trailing 'int' for whole numbers."""
    section, _, name = key.rpartition(".")
    value = (config[section] if section else config)[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value)
    whole = rule.endswith(" int")
    bound = rule.removesuffix(" int")
    if ok and whole:
        ok = float(value).is_integer()
    if ok:
        if bound.startswith(("(", "[")):
            low, high = (float(x) for x in bound[1:-1].split(","))
            ok = (low < value if bound[0] == "(" else low <= value) and (
                value < high if bound[-1] == ")" else value <= high
            )
        else:
            op, limit = bound.split()
            ok = value > float(limit) if op == ">" else value >= float(limit)
    if not ok:
        what = f"in {bound}" if bound.startswith(("(", "[")) else f"finite and {bound}"
        kind = "a whole number " if whole else ""
        raise ConfigError(
            f"config.{key}={value!r} must be {kind}{what}" + (f" ({note})" if note else "")
        )


# Every numeric field of configs/glue.py and the values it may take; a NaN or Inf never passes.
_NUMBERS = (
    ("learning_rate", ">= 0", "0: the paper's for the model's size"),
    ("layer_decay", "[0, 1]", "0: the paper's for the model's size; 1: no decay"),
    ("warmup_fraction", "[0, 1)", ""),
    ("weight_decay", ">= 0", ""),
    ("adam_eps", "> 0", ""),
    ("clip_norm", "> 0", ""),
    ("batch_size", ">= 1 int", ""),
    ("eval_batch_size", ">= 1 int", ""),
    ("num_epochs", ">= 0", "0: the task's"),
    ("seq_length", ">= 8 int", ""),
    ("max_train_examples", ">= 0 int", "0: all"),
    ("dropout_rate", "[0, 1)", ""),
    ("log_every_steps", ">= 1 int", ""),
    ("seed", f"[0, {2**32}) int", "the random key takes 32 bits"),
)
# Random init only: the tokenizer trained on the task and the network's shape.
_RANDOM_INIT_NUMBERS = (
    ("vocab_size", ">= 6 int", "the 5 special pieces and at least one more"),
    ("model.hidden_size", ">= 1 int", ""),
    ("model.num_layers", ">= 1 int", ""),
    ("model.num_heads", ">= 1 int", ""),
    ("model.intermediate_size", ">= 1 int", ""),
    ("model.embedding_size", ">= 1 int", ""),
    ("model.max_position_embeddings", ">= 8 int", ""),
    ("model.type_vocab_size", ">= 2 int", "segments A and B"),
    ("model.initializer_range", "> 0", ""),
    ("model.layer_norm_eps", "> 0", ""),
)


def check_config(config: ml_collections.ConfigDict) -> tasks.Task:
    """The config's task; ConfigError (one line naming the key) for values that cannot work."""
    c = config
    try:
        task = tasks.get_task(c.task)
    except DataError as e:
        raise ConfigError(str(e)) from None
    for key, rule, note in _NUMBERS:
        _number(c, key, rule, note)
    _require(
        c.dtype in ("float32", "bfloat16"),
        f"config.dtype={c.dtype!r} is not supported; use 'float32' or 'bfloat16'",
    )
    _require(
        c.layer_decay_exponents in LAYER_DECAY_EXPONENTS,
        f"config.layer_decay_exponents={c.layer_decay_exponents!r} is not a choice; use "
        + " or ".join(repr(x) for x in LAYER_DECAY_EXPONENTS),
    )
    _require(
        not (c.init_from and c.tokenizer),
        f"config.tokenizer={c.tokenizer!r} is for random init only; a pre-trained model "
        f"(config.init_from={c.init_from!r}) brings its own tokenizer: unset one of them",
    )
    if not c.init_from:  # a pre-trained model brings its own shape (and checks it)
        for key, rule, note in _RANDOM_INIT_NUMBERS:
            _number(c, key, rule, note)
        m = c.model
        _require(
            m.hidden_size % m.num_heads == 0,
            f"config.model.hidden_size={m.hidden_size} must be a multiple of "
            f"config.model.num_heads={m.num_heads}",
        )
    return task


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


def regression_targets(task: tasks.Task, scaled: bool) -> tuple[float, float]:
    """(low, width): the model trains on (score - low) / width and reports low + width x output.

    With `scaled`, a task's scores become [0, 1] targets, as the original ELECTRA trains STS-B
    (its classification_tasks.py divides the 0-5 score by 5); otherwise the raw scores.
    """
    if not (scaled and task.is_regression):
        return 0.0, 1.0
    low, high = task.score_range
    return low, high - low


# ------------------------------------------------------------------------------------------ data


def training_set(
    task: tasks.Task, examples: list[tasks.Example], max_examples: int, double_unordered: bool
) -> list[tasks.Example]:
    """The examples trained on: a fixed random subset of at most max_examples (0 = all, kept in
    file order), then for MRPC and STS-B also every pair the other way round."""
    if 0 < max_examples < len(examples):
        rng = np.random.default_rng([0, _SUBSET_STREAM])
        keep = np.sort(rng.choice(len(examples), max_examples, replace=False))
        examples = [examples[i] for i in keep]
    if double_unordered and task.double_unordered:
        swapped = [
            dataclasses.replace(e, text_a=e.text_b, text_b=e.text_a, source=e.source + ":swapped")
            for e in examples
        ]
        examples = examples + swapped
    return examples


def batch_order(num_examples: int, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
    """[num_steps, batch_size] example indices: epoch after epoch, each a fresh permutation.

    Batches run across epoch boundaries (the original repeats and shuffles the data), so every
    batch is full and the step count is int(examples x epochs / batch), at least 1.
    """
    rng = np.random.default_rng([seed & (2**63 - 1), _ORDER_STREAM])
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
            os.path.join(workdir, "tokenizer"),
            vocab_size=int(config.vocab_size),
            character_coverage=0.9995,
            seed=int(config.seed),
            sample_sentences=len(texts) + 1,
        )
    except DataError as e:  # its message names the pre-training key
        raise DataError(str(e).replace("data.vocab_size", "config.vocab_size")) from None


def initial_model(config, task_texts: list[str], workdir: str) -> Initial:
    """The spec, tokenizer and (pre-trained) encoder params fine-tuning starts from.

    With config.init_from, everything but the training choices (dropout, compute type) comes
    from the pre-trained model; otherwise config.model and config.tokenizer (or a tokenizer
    trained on task_texts, the task's training text) make a randomly initialised one.
    """
    training = dict(
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
    )
    if config.init_from:
        from electra_jax.pretrained import PretrainedError

        try:
            pre = _load_pretrained(config.init_from)
        except PretrainedError as e:  # its message names the path and what would work
            raise ConfigError(f"config.init_from: {e}") from None
        spec = dataclasses.replace(pre.spec, **training)
        params = {k: pre.params[k] for k in heads.PRETRAINED_SUBTREES}
        # The discriminator's own embeddings (under 'gdes': the shared tables plus its deltas).
        params["embeddings"] = discriminator_embedding_params(
            pre.params, pre.spec.embedding_sharing
        )
        return Initial(spec, pre.tokenizer, params, pre.source)
    tokenizer = _task_tokenizer(config, task_texts, workdir)
    spec = dataclasses.replace(_random_spec(config.model, tokenizer.vocab_size), **training)
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


def train_step(state: TrainState, batch: dict, *, model, tx, schedule, regression: bool):
    """One AdamW update on a batch of [B, L] ids, segments, mask and [B] labels.

    Dropout's key is fold_in(state.rng, step). Returns (new state, float32 scalar metrics).
    """
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
        outputs = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            False,
            rngs={"dropout": rng},
        )
        total, count = heads.task_loss(outputs, batch["labels"], regression)
        return total / count

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
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


def predict_step(params, batch: dict, *, model, regression: bool):
    """[B, L] inputs -> ([B] predicted classes or scores, [B] whether every output is finite),
    without dropout."""
    outputs = model.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"], True
    )
    finite = jnp.all(jnp.isfinite(outputs), axis=-1)
    return heads.predictions(outputs, regression), finite


def predict(predict_fn, params, arrays: dict, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Predictions [N] for encoded examples, in fixed-size batches (the last one padded), and
    [N] bool: whether the model's outputs for the example were finite."""
    n = len(arrays["labels"])
    inputs = {k: arrays[k] for k in ("input_ids", "segment_ids", "input_mask")}
    preds, finite = [], []
    for start in range(0, n, batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        short = batch_size - len(chunk["input_ids"])
        if short:  # pad with empty rows so that one compiled shape serves every batch
            chunk = {k: np.pad(v, ((0, short), (0, 0))) for k, v in chunk.items()}
        p, f = jax.device_get(predict_fn(params, chunk))
        preds.append(np.asarray(p)[: batch_size - short])
        finite.append(np.asarray(f)[: batch_size - short])
    if not preds:
        return np.zeros((0,), np.float32), np.ones((0,), bool)
    return np.concatenate(preds), np.concatenate(finite)


# ------------------------------------------------------------------------------------------ run


def run_steps(step_fn, state, take, num_steps: int, config, learning_rate: float, unit: str):
    """Compiles `step_fn` on the first batch and runs `num_steps` updates on `take(step)`'s
    batches, logging every config.log_every_steps (loss, lr, `unit`s/s, eta) and checking the
    losses there for NaN/Inf (NonFiniteError). Returns (final state, the last logged mean
    training loss). GLUE and SQuAD alike."""
    t0 = time.time()
    step_fn = step_fn.lower(state, take(0)).compile()
    log(f"compiled the train step in {time.time() - t0:.1f}s")
    pending: list[Any] = []  # device (loss, grad norm) since the last line: read when logging
    train_loss = float("nan")
    last_time = steps_started = time.time()
    for step in range(num_steps):
        state, step_metrics = step_fn(state, take(step))
        pending.append((step_metrics["loss"], step_metrics["grad_norm"]))
        done = step + 1
        # The last step always logs: the run ends only after its losses were checked.
        if done % config.log_every_steps == 0 or done == num_steps:
            values = np.asarray(jax.device_get(pending), np.float64)  # [steps, 2]
            _check_finite(values, done - len(pending) + 1, learning_rate)
            train_loss = float(np.mean(values[:, 0]))
            now = time.time()
            rate = len(pending) * config.batch_size / max(now - last_time, 1e-9)
            left = (num_steps - done) * (now - steps_started) / done
            log(
                f"step {done}/{num_steps}  loss {train_loss:.4f}  "
                f"lr {float(step_metrics['learning_rate']):.2e}  {rate:.0f} {unit}/s  "
                f"eta {time.strftime('%H:%M:%S', time.gmtime(left))}"
            )
            pending, last_time = [], now
    return state, train_loss


def _check_finite(values: np.ndarray, first_step: int, learning_rate: float) -> None:
    """NonFiniteError naming the first step whose loss or gradient norm is NaN/Inf.

    values: [steps, 2] (loss, gradient norm) of the steps first_step, first_step + 1, ... (1-based
    counts of updates done).
    """
    bad = np.flatnonzero(~np.all(np.isfinite(values), axis=1))
    if bad.size:
        last = first_step + len(values) - 1
        raise NonFiniteError(
            f"fine-tuning diverged: the training loss or gradient norm is not finite at step "
            f"{first_step + int(bad[0])} (checking steps {first_step}-{last}); no results were "
            f"written; lower config.learning_rate (peak {learning_rate:g})"
        )


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Fine-tunes on config.task, evaluates on its dev set(s), writes the results; returns them.

    Writes WORKDIR/config.json, WORKDIR/eval_results.json (see docs/finetuning.md) and
    WORKDIR/dev_predictions.jsonl (one row per dev example: split, source, label, prediction).

    Raises:
      ConfigError / DataError: bad config values, data files or init_from (one-line messages).
      NonFiniteError: the training loss or gradient norm became NaN/Inf (checked as the losses
        are read for each log line), or the final model's dev outputs are; nothing is written.
    """
    started = time.time()
    task = check_config(config)
    # Locked for the run; a pre-training workdir (or any folder not ours) is refused, since
    # fine-tuning writes its own config.json and tokenizer/ there.
    with workdir_lib.claimed(workdir, workdir_lib.FINETUNE, command="electra_jax.finetune"):
        return _finetune(config, workdir, task, started)


def _finetune(config: ml_collections.ConfigDict, workdir: str, task, started: float) -> dict:

    # ---------------------------------------------------------------- mesh
    _require(
        jax.process_count() == 1,
        "fine-tuning runs in one process (all its local devices data-parallel); start it "
        "without jax.distributed",
    )
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"fsdp": 1}))
    devices = sharding.data_parallel_size(mesh)
    for key in ("batch_size", "eval_batch_size"):
        _require(
            config[key] % devices == 0,
            f"config.{key}={config[key]} is not divisible by the {devices} local devices",
        )

    # ---------------------------------------------------------------- data
    read = lambda split: tasks.load_split(task, split, config.data_dir, config.tfds_data_dir)
    train_read = read(tasks.TRAIN)
    devs = {split.name: read(split) for split in task.dev_splits}
    train = training_set(task, train_read, config.max_train_examples, config.double_unordered)
    if not train:
        raise DataError(f"{task.name} has no training examples; check config.data_dir")

    # ---------------------------------------------------------------- model
    texts = [t for e in train_read for t in (e.text_a, e.text_b) if t]
    init = initial_model(config, texts, workdir)
    spec = init.spec
    _require(
        config.seq_length <= spec.max_position_embeddings,
        f"config.seq_length={config.seq_length} exceeds the model's "
        f"{spec.max_position_embeddings} positions",
    )
    # Logged only now, so that bad input above fails with its one line and nothing else.
    log(
        f"{task.name}: {len(train)} training examples ({len(train_read)} read), "
        + ", ".join(f"{name} {len(ex)}" for name, ex in devs.items())
    )
    log(
        f"model from {init.source}: {spec.discriminator.num_layers} layers x "
        f"{spec.discriminator.hidden_size}, vocab {spec.vocab_size}"
    )

    # ---------------------------------------------------------------- features
    encode = functools.partial(
        features.encode_examples,
        init.tokenizer,
        seq_length=config.seq_length,
        regression=task.is_regression,
    )
    train_arrays = encode(train)
    dev_arrays = {name: encode(ex) for name, ex in devs.items()}
    # Regression trains on targets in [0, 1] (by default, as the original); dev labels, metrics
    # and predictions stay on the task's own scale.
    low, width = regression_targets(task, config.scale_regression_targets)
    if task.is_regression:
        train_arrays["labels"] = ((train_arrays["labels"] - low) / width).astype(np.float32)

    # ---------------------------------------------------------------- state
    epochs = config.num_epochs or task.num_epochs
    num_steps = max(1, int(len(train) * epochs / config.batch_size))
    model = heads.Classifier(spec, task.num_outputs)
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    # Jitted: one compilation rather than one per operation.
    params = jax.jit(functools.partial(heads.init_params, model))(init_rng)
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
    regression = task.is_regression
    step_fn = jax.jit(
        functools.partial(train_step, model=model, tx=tx, schedule=schedule, regression=regression),
        in_shardings=(replicated, split_batch),
        out_shardings=(replicated, replicated),
        donate_argnums=(0,),
    )
    predict_fn = jax.jit(
        functools.partial(predict_step, model=model, regression=regression),
        in_shardings=(replicated, split_batch),
        out_shardings=replicated,
    )

    # ---------------------------------------------------------------- steps
    order = batch_order(len(train), config.batch_size, num_steps, config.seed)
    sources = {hyper["learning_rate_source"], hyper["layer_decay_source"]} - {"config"}
    log(
        f"fine-tuning {num_steps} steps ({epochs:g} epochs of {len(train)} examples, "
        f"batch {config.batch_size}, peak lr {learning_rate:g}, layer decay {layer_decay:g}"
        + "".join(f"; {s}" for s in sorted(sources))  # where the defaults came from
        + ")"
    )
    take = lambda step: {k: v[order[step]] for k, v in train_arrays.items()}
    state, train_loss = run_steps(step_fn, state, take, num_steps, config, learning_rate, unit="ex")

    # ---------------------------------------------------------------- evaluate
    results_metrics, rows = {}, []
    for name, arrays in dev_arrays.items():
        preds, finite = predict(predict_fn, state.params, arrays, config.eval_batch_size)
        if not finite.all():  # the last update shows in no training loss: check its outputs
            raise NonFiniteError(
                f"fine-tuning diverged: after the last step ({num_steps}) the model's outputs "
                f"are not finite for {int((~finite).sum())} of the {len(finite)} {name} examples; "
                f"no results were written; lower config.learning_rate (peak {learning_rate:g})"
            )
        if task.is_regression:  # back on the task's scale
            preds = (low + width * preds.astype(np.float64)).astype(np.float32)
        results_metrics[name] = glue_metrics.task_metrics(task, preds, arrays["labels"])
        shown = "  ".join(f"{k} {v:.4f}" for k, v in results_metrics[name].items())
        log(f"{task.name} {name}: {shown}")
        for i, (example, pred) in enumerate(zip(devs[name], preds, strict=True)):
            rows.append(
                {
                    "split": name,
                    "index": i,
                    "source": example.source,
                    "label": tasks.label_text(task, example.label),
                    "prediction": tasks.label_text(task, pred),
                }
            )

    # ---------------------------------------------------------------- write
    first_dev = task.dev_splits[0].name
    results = {
        "task": task.name,
        "metrics": results_metrics,
        "score": results_metrics[first_dev][task.score],
        "score_metric": f"{first_dev}/{task.score}",
        "num_train_examples": len(train),
        "num_train_examples_read": len(train_read),
        "num_dev_examples": {name: len(ex) for name, ex in devs.items()},
        "steps": num_steps,
        "epochs": epochs,
        "batch_size": config.batch_size,
        **hyper,
        "layer_decay_exponents": config.layer_decay_exponents,
        "scale_regression_targets": bool(task.is_regression and config.scale_regression_targets),
        "seed": config.seed,
        "init_from": config.init_from,
        "init_source": init.source,
        "train_loss": train_loss,
        "predictions_file": PREDICTIONS_FILE,
        "elapsed_sec": time.time() - started,
    }
    jsonio.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    jsonio.write_jsonl(os.path.join(workdir, PREDICTIONS_FILE), rows)
    jsonio.write_json(os.path.join(workdir, RESULTS_FILE), results)
    score = f"{results['score_metric']} {results['score']:.4f}"
    log(f"wrote {os.path.join(workdir, RESULTS_FILE)} ({score})")
    return results
