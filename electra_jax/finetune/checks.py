"""What a fine-tuning config is checked for, and how a diverged run is reported.

`check_config` answers for the whole config: its family, then each key's own rule (declared with
the key in config/finetune_keys.py: kind, range, choices; schema.check_values), then the rules
between keys and the family's own (a GLUE task, a SQuAD version). Nothing here imports jax, flax or
orbax (nor do tasks.py and squad_data.py, which know the GLUE tasks and the SQuAD versions), so the
command checks the settings before those imports and bad ones are answered in a blink; the runner
(loop.py) checks them again as its first step, for callers of the Python API. Every message is one
line naming the config key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from electra_jax.config import finetune_keys, groups, schema
from electra_jax.errors import ConfigError, DataError, NonFiniteError
from electra_jax.finetune import squad_data, tasks

# config.family -> the config file its users start from.
FAMILY_CONFIGS = {"glue": "configs/glue.py", "squad": "configs/squad.py"}


def require(ok: bool, message: str) -> None:
    """ConfigError(message) unless `ok`."""
    if not ok:
        raise ConfigError(message)


def check_common(config) -> None:
    """The rules every fine-tuning config obeys (a family checks its own fields after these);
    ConfigError (one line naming the key) for the first value that cannot work."""
    c = config
    schema.check_values(c, finetune_keys.checked(c), prefix="config.")
    # Pre-training's lowest learning rate (groups.LEARNING_RATE): float32 rounds a smaller Adam
    # step away against the weights. A huge rate is no float32 nonsense but a run that diverges,
    # which the loop stops with one line.
    lowest = groups.LEARNING_RATE[0]
    require(
        c.learning_rate == 0 or c.learning_rate >= lowest,
        f"config.learning_rate={c.learning_rate!r} must be 0 (the paper's for the model's size) "
        f"or at least {lowest:g}: float32 rounds a smaller Adam step away against the weights",
    )
    require(
        not (c.init_from and c.tokenizer),
        f"config.tokenizer={c.tokenizer!r} is for random init only; a pre-trained model "
        f"(config.init_from={c.init_from!r}) brings its own tokenizer: unset one of them",
    )
    if not c.init_from:  # a pre-trained model brings its own shape (and checks it)
        m = c.model
        require(
            m.hidden_size % m.num_heads == 0,
            f"config.model.hidden_size={m.hidden_size} must be a multiple of "
            f"config.model.num_heads={m.num_heads}",
        )


# What `--allow_change` may name for a fine-tuning, and what each lets differ on a resume
# (inputs.py holds the resume to the rest): the keys declared resume=ALLOW.
ALLOWED = finetune_keys.allowed_changes()


def check_allowed(allow) -> None:
    """ConfigError for a key `--allow_change` does not take in a fine-tuning."""
    unknown = [k for k in allow if k not in ALLOWED]
    require(
        not unknown,
        f"--allow_change={','.join(unknown)}: a fine-tuning's resume may change only "
        + "; ".join(f"{k} ({what})" for k, what in ALLOWED.items()),
    )


def check_config(config) -> tuple[str, Any]:
    """(family name, task) of the config: the task is the GLUE task (tasks.Task) or the SQuAD
    version ('1.1' / '2.0'). ConfigError (one line naming the key) for the first value that
    cannot work: config.family, then the common fields, then the family's."""
    name = getattr(config, "family", None)
    require(
        name in FAMILY_CONFIGS,
        f"config.family={name!r} is not a fine-tuning family; use "
        + " or ".join(f"{n!r} ({c})" for n, c in FAMILY_CONFIGS.items()),
    )
    # A config is of one family: --config.family=squad on configs/glue.py does not give it
    # SQuAD's fields, and the first read of one would be an AttributeError.
    missing = [key for key in finetune_keys.REQUIRED[name] if key not in config]
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
    require(
        c.n_best_size <= c.seq_length,
        f"config.n_best_size={c.n_best_size} exceeds config.seq_length={c.seq_length}",
    )
    return c.version


def describe(family: str, task) -> dict:
    """What model.json records of the task (family.Family.describe), from check_config's
    (family name, task): 'task' (its name), 'labels' (class names, [] when there are none) and
    'problem_type' (transformers' word for the head's loss)."""
    if family == "squad":
        return {"task": f"SQuAD {task}", "labels": [], "problem_type": "question_answering"}
    return {
        "task": task.name,
        "labels": list(task.labels),
        "problem_type": "regression" if task.is_regression else "single_label_classification",
    }


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
