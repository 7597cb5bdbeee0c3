"""Fine-tuning on SQuAD 1.1 or 2.0: finetune(config, workdir), in sections.

data -> model -> features -> state -> steps (log) -> predict -> decode -> write. The host reads
the official JSON files and cuts every question into windows once; each step runs the forward
pass, the span loss and the AdamW update (layer-wise learning rates) in one compiled program,
data-parallel over the local devices, and prediction keeps each window's top starts and ends
on the device, so that only the n-best spans come back to be decoded into text. A run is a pure
function of the config: the same seed gives the same dev numbers.

The optimizer, the paper's hyperparameters by model size and the model's start (init_from or a
random init with a tokenizer trained on the training questions and contexts) are the GLUE
loop's (finetune/loop.py).
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from electra_jax import jsonio, sharding
from electra_jax import workdir as workdir_lib
from electra_jax.data import DataError
from electra_jax.finetune import heads, loop, squad_data, squad_eval, squad_heads
from electra_jax.metrics import log
from electra_jax.train_step import TrainState
from electra_jax.validate import ConfigError

RESULTS_FILE = "eval_results.json"
PREDICTIONS_FILE = "dev_predictions.json"
NULL_SCORES_FILE = "dev_null_odds.json"  # 2.0: the official script's --na-prob-file input

# Every numeric field of configs/squad.py and the values it may take; a NaN or Inf never passes.
_NUMBERS = (
    ("learning_rate", ">= 0", "0: the paper's for the model's size"),
    ("layer_decay", "[0, 1]", "0: the paper's for the model's size; 1: no decay"),
    ("warmup_fraction", "[0, 1)", ""),
    ("weight_decay", ">= 0", ""),
    ("adam_eps", "> 0", ""),
    ("clip_norm", "> 0", ""),
    ("batch_size", ">= 1 int", ""),
    ("eval_batch_size", ">= 1 int", ""),
    ("num_epochs", "> 0", ""),
    ("seq_length", ">= 8 int", ""),
    ("doc_stride", ">= 1 int", ""),
    ("max_query_length", ">= 1 int", ""),
    ("n_best_size", ">= 1 int", ""),
    ("max_answer_length", ">= 1 int", ""),
    ("answerable_weight", ">= 0", ""),
    ("null_threshold", ">= -1e30", "any finite number"),
    ("head_size", ">= 1 int", ""),
    ("max_train_examples", ">= 0 int", "0: all"),
    ("dropout_rate", "[0, 1)", ""),
    ("log_every_steps", ">= 1 int", ""),
    ("seed", f"[0, {2**32}) int", "the random key takes 32 bits"),
)


def check_config(config: ml_collections.ConfigDict) -> None:
    """ConfigError (one line naming the key) for values that cannot work."""
    c = config
    loop._require(
        c.version in squad_data.VERSIONS,
        f"config.version={c.version!r} is not a SQuAD version; use '1.1' or '2.0'",
    )
    loop._require(
        bool(c.data_dir),
        f"config.data_dir is empty; point it at the folder holding "
        f"{' and '.join(squad_data.file_names(c.version))} (from {squad_data.URL})",
    )
    for key, rule, note in _NUMBERS:
        loop._number(c, key, rule, note)
    loop._require(
        c.n_best_size <= c.seq_length,
        f"config.n_best_size={c.n_best_size} exceeds config.seq_length={c.seq_length}",
    )
    loop._require(
        c.dtype in ("float32", "bfloat16"),
        f"config.dtype={c.dtype!r} is not supported; use 'float32' or 'bfloat16'",
    )
    loop._require(
        c.layer_decay_exponents in loop.LAYER_DECAY_EXPONENTS,
        f"config.layer_decay_exponents={c.layer_decay_exponents!r} is not a choice; use "
        + " or ".join(repr(x) for x in loop.LAYER_DECAY_EXPONENTS),
    )
    loop._require(
        not (c.init_from and c.tokenizer),
        f"config.tokenizer={c.tokenizer!r} is for random init only; a pre-trained model "
        f"(config.init_from={c.init_from!r}) brings its own tokenizer: unset one of them",
    )
    if not c.init_from:
        for key, rule, note in loop._RANDOM_INIT_NUMBERS:
            loop._number(c, key, rule, note)
        m = c.model
        loop._require(
            m.hidden_size % m.num_heads == 0,
            f"config.model.hidden_size={m.hidden_size} must be a multiple of "
            f"config.model.num_heads={m.num_heads}",
        )


def training_subset(
    examples: list[squad_data.Example], max_examples: int
) -> list[squad_data.Example]:
    """At most max_examples questions (0 = all): a fixed random subset, kept in file order, the
    same for every seed (as the GLUE loop draws its subset)."""
    if 0 < max_examples < len(examples):
        rng = np.random.default_rng([0, loop._SUBSET_STREAM])
        keep = np.sort(rng.choice(len(examples), max_examples, replace=False))
        examples = [examples[i] for i in keep]
    return examples


# ------------------------------------------------------------------------------------------ steps


def train_step(state: TrainState, batch: dict, *, model, tx, schedule, answerable_weight: float):
    """One AdamW update on a batch of [B, L] ids, segments, mask and [B] span labels.

    Dropout's key is fold_in(state.rng, step). Returns (new state, float32 scalar metrics).
    """
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
        outputs = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["start_positions"],
            False,
            rngs={"dropout": rng},
        )
        return squad_heads.span_loss(outputs, batch, answerable_weight)

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


def predict_step(params, batch: dict, *, model) -> dict:
    """SpanModel.predict on a batch of [B, L] inputs (see there for the outputs)."""
    return model.apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        method=squad_heads.SpanModel.predict,
    )


def predict(predict_fn, params, features: squad_data.Features, batch_size: int) -> dict:
    """predict_step's outputs for every window ([N, ...] numpy), in fixed-size batches (the last
    one padded with empty rows, so that one compiled shape serves every batch)."""
    inputs = {k: getattr(features, k) for k in ("input_ids", "segment_ids", "input_mask")}
    chunks = []
    for start in range(0, len(features), batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        real = len(chunk["input_ids"])
        if real < batch_size:
            chunk = {k: np.pad(v, ((0, batch_size - real), (0, 0))) for k, v in chunk.items()}
        out = jax.device_get(predict_fn(params, chunk))
        chunks.append({k: np.asarray(v)[:real] for k, v in out.items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]} if chunks else {}


# ------------------------------------------------------------------------------------------ run


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Fine-tunes on SQuAD config.version, predicts the dev set, writes the results; returns them.

    Writes WORKDIR/config.json, WORKDIR/eval_results.json (see docs/finetuning.md),
    WORKDIR/dev_predictions.json ({question id: answer text}, '' for no answer) and for 2.0
    WORKDIR/dev_null_odds.json ({question id: no-answer score}).

    Raises:
      ConfigError / DataError: bad config values, data files or init_from (one-line messages),
        found before any compiling or training.
      NonFiniteError: the training loss or gradient norm became NaN/Inf, or the final model's
        dev outputs are; nothing is written.
    """
    started = time.time()
    check_config(config)
    with workdir_lib.claimed(workdir, workdir_lib.FINETUNE, command="electra_jax.finetune"):
        return _finetune(config, workdir, started)


def _finetune(config: ml_collections.ConfigDict, workdir: str, started: float) -> dict:
    # ---------------------------------------------------------------- mesh
    loop._require(
        jax.process_count() == 1,
        "fine-tuning runs in one process (all its local devices data-parallel); start it "
        "without jax.distributed",
    )
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"fsdp": 1}))
    devices = sharding.data_parallel_size(mesh)
    for key in ("batch_size", "eval_batch_size"):
        loop._require(
            config[key] % devices == 0,
            f"config.{key}={config[key]} is not divisible by the {devices} local devices",
        )

    # ---------------------------------------------------------------- data
    version = config.version
    train_path, dev_path = (
        os.path.join(config.data_dir, name) for name in squad_data.file_names(version)
    )
    train_read = squad_data.read_squad(train_path, version)
    dev = squad_data.read_squad(dev_path, version)
    train = training_subset(train_read, config.max_train_examples)
    if not train:
        raise DataError(f"{train_path} has no questions; check config.data_dir")
    if not dev:
        raise DataError(f"{dev_path} has no questions; check config.data_dir")

    # ---------------------------------------------------------------- model
    texts = sorted({e.context for e in train_read}) + [e.question for e in train_read]
    init = loop.initial_model(config, texts, workdir)
    spec = init.spec
    loop._require(
        config.seq_length <= spec.max_position_embeddings,
        f"config.seq_length={config.seq_length} exceeds the model's "
        f"{spec.max_position_embeddings} positions",
    )

    # ---------------------------------------------------------------- features
    featurize = functools.partial(
        squad_data.make_features,
        init.tokenizer,
        seq_length=config.seq_length,
        doc_stride=config.doc_stride,
        max_query_length=config.max_query_length,
    )
    train_features, dev_features = featurize(train), featurize(dev)
    # Logged only now, so that bad input above fails with its one line and nothing else.
    log(
        f"SQuAD {version}: {len(train)} training questions ({len(train_read)} read) in "
        f"{len(train_features)} windows, dev {len(dev)} in {len(dev_features)} windows"
    )
    log(
        f"model from {init.source}: {spec.discriminator.num_layers} layers x "
        f"{spec.discriminator.hidden_size}, vocab {spec.vocab_size}"
    )

    # ---------------------------------------------------------------- state
    # Steps count windows, as the original counts its training records.
    num_steps = max(1, int(len(train_features) * config.num_epochs / config.batch_size))
    answerable = version == "2.0"
    model = squad_heads.SpanModel(
        spec,
        joint=config.joint_prediction,
        answerable=answerable,
        head_size=config.head_size,
        top_k=config.n_best_size,
    )
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    params = jax.jit(functools.partial(squad_heads.init_params, model))(init_rng)
    if init.encoder_params is not None:
        try:
            params = heads.with_pretrained(params, init.encoder_params)
        except ValueError as e:
            raise ConfigError(f"config.init_from={config.init_from!r}: {e}") from None
    hyper = loop.resolve_hyperparameters(config, spec.discriminator.hidden_size)
    learning_rate, layer_decay = hyper["learning_rate"], hyper["layer_decay"]
    tx, schedule, state = loop.optimizer_and_state(
        config, params, spec, num_steps, layer_decay, learning_rate, dropout_rng, mesh
    )
    replicated, split_batch = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    answerable_weight = float(config.answerable_weight) if answerable else 0.0
    step_fn = jax.jit(
        functools.partial(
            train_step, model=model, tx=tx, schedule=schedule, answerable_weight=answerable_weight
        ),
        in_shardings=(replicated, split_batch),
        out_shardings=(replicated, replicated),
        donate_argnums=(0,),
    )
    predict_fn = jax.jit(
        functools.partial(predict_step, model=model),
        in_shardings=(replicated, split_batch),
        out_shardings=replicated,
    )

    # ---------------------------------------------------------------- steps
    order = loop.batch_order(len(train_features), config.batch_size, num_steps, config.seed)
    sources = {hyper["learning_rate_source"], hyper["layer_decay_source"]} - {"config"}
    log(
        f"fine-tuning {num_steps} steps ({config.num_epochs:g} epochs of {len(train_features)} "
        f"windows, batch {config.batch_size}, peak lr {learning_rate:g}, layer decay "
        f"{layer_decay:g}" + "".join(f"; {s}" for s in sorted(sources)) + ")"
    )
    train_arrays = train_features.model_inputs()
    take = lambda step: {k: v[order[step]] for k, v in train_arrays.items()}
    state, train_loss = loop.run_steps(
        step_fn, state, take, num_steps, config, learning_rate, unit="windows"
    )

    # ---------------------------------------------------------------- predict
    outputs = predict(predict_fn, state.params, dev_features, config.eval_batch_size)
    finite = outputs["finite"]
    if not finite.all():  # the last update shows in no training loss: check its outputs
        raise loop.NonFiniteError(
            f"fine-tuning diverged: after the last step ({num_steps}) the model's outputs are "
            f"not finite for {int((~finite).sum())} of the {len(finite)} dev windows; no "
            f"results were written; lower config.learning_rate (peak {learning_rate:g})"
        )
    answers, null_scores = squad_eval.predict_answers(
        dev,
        dev_features,
        outputs,
        version=version,
        n_best_size=config.n_best_size,
        max_answer_length=config.max_answer_length,
        null_threshold=config.null_threshold,
    )
    metrics = squad_eval.evaluate(dev, answers, version)
    shown = "  ".join(f"{k} {v:.2f}" for k, v in metrics.items() if not k.endswith("total"))
    log(f"SQuAD {version} dev: {shown}")

    # ---------------------------------------------------------------- write
    results = {
        "task": f"SQuAD {version}",
        "version": version,
        **metrics,
        "num_train_examples": len(train),
        "num_train_examples_read": len(train_read),
        "num_train_windows": len(train_features),
        "num_dev_examples": len(dev),
        "num_dev_windows": len(dev_features),
        "steps": num_steps,
        "epochs": config.num_epochs,
        "batch_size": config.batch_size,
        **hyper,
        "layer_decay_exponents": config.layer_decay_exponents,
        "joint_prediction": config.joint_prediction,
        "seed": config.seed,
        "init_from": config.init_from,
        "init_source": init.source,
        "train_loss": train_loss,
        "predictions_file": PREDICTIONS_FILE,
        "elapsed_sec": time.time() - started,
    }
    if version == "2.0":
        results["null_threshold"] = config.null_threshold
    write = lambda name, obj: jsonio.write_json(os.path.join(workdir, name), obj)
    write("config.json", config.to_dict())
    write(PREDICTIONS_FILE, answers)
    if version == "2.0":
        write(NULL_SCORES_FILE, null_scores)
    write(RESULTS_FILE, results)
    score = f"exact_match {metrics['exact_match']:.2f}, f1 {metrics['f1']:.2f}"
    log(f"wrote {os.path.join(workdir, RESULTS_FILE)} ({score})")
    return results
