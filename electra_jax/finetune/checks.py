"""What a fine-tuning config is checked for, and how a diverged run is reported.

`check_config` answers for the whole config: its family, the fields every family has, then the
family's own. Nothing here imports jax, flax or orbax (nor do tasks.py and squad_data.py, which
know the GLUE tasks and the SQuAD versions), so the command checks the settings before those
imports and bad ones are answered in a blink; the runner (loop.py) checks them again as its
first step, for callers of the Python API. Every message is one line naming the config key.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from electra_jax.data import DataError
from electra_jax.finetune import squad_data, tasks
from electra_jax.validate import ConfigError, NonFiniteError

# config.family -> the config file its users start from.
FAMILY_CONFIGS = {"glue": "configs/glue.py", "squad": "configs/squad.py"}

LAYER_DECAY_EXPONENTS = ("electra_jax", "original")
DTYPES = ("float32", "bfloat16")


def require(ok: bool, message: str) -> None:
    """ConfigError(message) unless `ok`."""
    if not ok:
        raise ConfigError(message)


def check_number(config, key: str, rule: str, note: str = "") -> None:
    """ConfigError unless config[key] (dotted for a section: 'model.hidden_size') is a finite
    number obeying `rule`: '> 0', '>= 0', '>= 1', '(0, 1]', '[0, 1)', with a trailing 'int'
    for whole numbers."""
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


# The numeric fields every family's config has, and the values they may take; a NaN or Inf
# never passes.
NUMBERS = (
    ("learning_rate", ">= 0", "0: the paper's for the model's size"),
    ("layer_decay", "[0, 1]", "0: the paper's for the model's size; 1: no decay"),
    ("warmup_fraction", "[0, 1)", ""),
    ("weight_decay", ">= 0", ""),
    ("adam_eps", "[1e-30, 1]", "smaller rounds to 0 in float32 and 0/0 is NaN"),
    ("clip_norm", "[1e-30, 1e30]", "gradients are scaled by it in float32"),
    ("batch_size", ">= 1 int", ""),
    ("eval_batch_size", ">= 1 int", ""),
    ("seq_length", ">= 8 int", ""),
    ("max_train_examples", ">= 0 int", "0: all"),
    ("dropout_rate", "[0, 0.999999999]", "the kept units are scaled by 1 / (1 - rate)"),
    ("log_every_steps", ">= 1 int", ""),
    ("checkpoint.every_steps", ">= 1 int", ""),
    ("checkpoint.keep", ">= 1 int", ""),
    ("seed", f"[0, {2**32}) int", "the random key takes 32 bits"),
)
# Random init only: the tokenizer trained on the task and the network's shape.
RANDOM_INIT_NUMBERS = (
    ("vocab_size", ">= 6 int", "the 5 special pieces and at least one more"),
    ("model.hidden_size", ">= 1 int", ""),
    ("model.num_layers", ">= 1 int", ""),
    ("model.num_heads", ">= 1 int", ""),
    ("model.intermediate_size", ">= 1 int", ""),
    ("model.embedding_size", ">= 1 int", ""),
    ("model.max_position_embeddings", ">= 8 int", ""),
    ("model.type_vocab_size", ">= 2 int", "segments A and B"),
    ("model.initializer_range", "[1e-30, 1000]", "squared in LayerNorm's float32 variance"),
    ("model.layer_norm_eps", "[1e-30, 1]", "smaller rounds to 0 in float32"),
)


def check_common(config) -> None:
    """The rules every fine-tuning config obeys (a family checks its own fields after these);
    ConfigError (one line naming the key) for the first value that cannot work."""
    c = config
    for key, rule, note in NUMBERS:
        check_number(c, key, rule, note)
    # As pre-training's (validate._FLOAT32_RANGES): an Adam step moves a weight by about the
    # learning rate, which float32 rounds away below 1e-9 against weights of ~0.02. A huge rate
    # is no float32 nonsense but a run that diverges, which the loop stops with one line.
    require(
        c.learning_rate == 0 or c.learning_rate >= 1e-9,
        f"config.learning_rate={c.learning_rate!r} must be 0 (the paper's for the model's size) "
        "or at least 1e-9: float32 rounds a smaller Adam step away against the weights",
    )
    require(
        c.dtype in DTYPES,
        f"config.dtype={c.dtype!r} is not supported; use 'float32' or 'bfloat16'",
    )
    require(
        c.layer_decay_exponents in LAYER_DECAY_EXPONENTS,
        f"config.layer_decay_exponents={c.layer_decay_exponents!r} is not a choice; use "
        + " or ".join(repr(x) for x in LAYER_DECAY_EXPONENTS),
    )
    require(
        not (c.init_from and c.tokenizer),
        f"config.tokenizer={c.tokenizer!r} is for random init only; a pre-trained model "
        f"(config.init_from={c.init_from!r}) brings its own tokenizer: unset one of them",
    )
    if not c.init_from:  # a pre-trained model brings its own shape (and checks it)
        for key, rule, note in RANDOM_INIT_NUMBERS:
            check_number(c, key, rule, note)
        m = c.model
        require(
            m.hidden_size % m.num_heads == 0,
            f"config.model.hidden_size={m.hidden_size} must be a multiple of "
            f"config.model.num_heads={m.num_heads}",
        )


# The numeric fields of configs/squad.py beyond the common ones (NUMBERS).
SQUAD_NUMBERS = (
    ("num_epochs", "> 0", ""),
    ("doc_stride", ">= 1 int", ""),
    ("max_query_length", ">= 1 int", ""),
    ("n_best_size", ">= 1 int", ""),
    ("max_answer_length", ">= 1 int", ""),
    ("answerable_weight", ">= 0", ""),
    ("null_threshold", ">= -1e30", "any finite number"),
    ("head_size", ">= 1 int", ""),
)


# What `--allow_change` may name for a fine-tuning, and what each lets differ on a resume
# (inputs.py holds the resume to the rest).
ALLOWED = {
    "data_dir": "the task's files (or config.data_dir)",
    "init_from": "the pre-trained weights (or config.init_from)",
}


def check_allowed(allow) -> None:
    """ConfigError for a key `--allow_change` does not take in a fine-tuning."""
    unknown = [k for k in allow if k not in ALLOWED]
    require(
        not unknown,
        f"--allow_change={','.join(unknown)}: a fine-tuning's resume may change only "
        + "; ".join(f"{k} ({what})" for k, what in ALLOWED.items()),
    )


# The keys each family's own checks and runner read, beyond the common ones.
FAMILY_KEYS = {
    "glue": ("task", "num_epochs"),
    "squad": ("version", "data_dir", *(key for key, _, _ in SQUAD_NUMBERS)),
}


def check_config(config) -> tuple[str, Any]:
    """(family name, task) of the config: the task is the GLUE task (tasks.Task) or the SQuAD
    version ('1.1' / '2.0'). ConfigError (one line naming the key) for the first value that
    cannot work: config.family, then the common fields, then the family's."""
    name = config.get("family", None)
    require(
        name in FAMILY_CONFIGS,
        f"config.family={name!r} is not a fine-tuning family; use "
        + " or ".join(f"{n!r} ({c})" for n, c in FAMILY_CONFIGS.items()),
    )
    # A config is of one family: --config.family=squad on configs/glue.py does not give it
    # SQuAD's fields, and the first read of one would be an AttributeError.
    missing = [key for key in FAMILY_KEYS[name] if key not in config]
    require(
        not missing,
        f"config.family={name!r} needs the key{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)}, which this config lacks; "
        f"start from {FAMILY_CONFIGS[name]} (changing config.family does not convert a config)",
    )
    check_common(config)
    return name, (_check_glue if name == "glue" else _check_squad)(config)


def _check_glue(config) -> tasks.Task:
    try:
        task = tasks.get_task(config.task)
    except DataError as e:
        raise ConfigError(str(e)) from None
    check_number(config, "num_epochs", ">= 0", "0: the task's")
    return task


def _check_squad(config) -> str:
    c = config
    require(
        c.version in squad_data.VERSIONS,
        f"config.version={c.version!r} is not a SQuAD version; use '1.1' or '2.0'",
    )
    require(
        bool(c.data_dir),
        f"config.data_dir is empty; point it at the folder holding "
        f"{' and '.join(squad_data.file_names(c.version))} (from {squad_data.URL})",
    )
    for key, rule, note in SQUAD_NUMBERS:
        check_number(c, key, rule, note)
    require(
        c.n_best_size <= c.seq_length,
        f"config.n_best_size={c.n_best_size} exceeds config.seq_length={c.seq_length}",
    )
    return c.version


def check_finite_losses(values: np.ndarray, first_step: int, learning_rate: float) -> None:
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


def check_finite_outputs(finite: np.ndarray, what: str, num_steps: int, learning_rate: float):
    """NonFiniteError unless every entry of `finite` ([N] bool: the model's outputs for one
    example or window are finite) is True; `what` names the N rows ('dev examples')."""
    if not finite.all():  # the last update shows in no training loss: its outputs show it
        raise NonFiniteError(
            f"fine-tuning diverged: after the last step ({num_steps}) the model's outputs are "
            f"not finite for {int((~finite).sum())} of the {len(finite)} {what}; no results "
            f"were written; lower config.learning_rate (peak {learning_rate:g})"
        )
