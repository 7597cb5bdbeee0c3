"""What a run continues from, asked once before any work: `plan(config, workdir, allow)`.

A workdir with checkpoints is resumed with the model it was trained with and, but for the
settings in FREE_ON_RESUME and those allowed (train's --allow_change), the settings it was
started with; the allowed changes are recorded in config_changes.jsonl. A run started before a
setting existed keeps what it meant then (its checkpoints' layer layout, no held-out slice). A
new run may start from train.init_from's weights. The workdir is claimed (workdir.claim) for the
whole run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from electra_jax import checkpointing, jsonio, metrics, paths
from electra_jax.jsonio import write_json
from electra_jax.validate import ConfigError, flatten


@dataclasses.dataclass
class Resume:
    """The answer of `plan`: what the run continues from."""

    workdir: str
    # The config as it runs: the stored run's layer layout and held-out slice kept.
    config: ml_collections.ConfigDict
    changes: dict[str, tuple[Any, Any]]  # allowed changes since config.json: {key: (old, new)}
    init_from: Any  # train.init_from's weights (pretrained.Pretrained) for a new run, else None
    claim: Any  # workdir.Claim: the workdir, locked by process 0 until `release`

    def record(self, resumed_at: int | None) -> None:
        """Once the state is restored (`resumed_at`: its step; None for a new run), writes what
        the run goes on with (process 0): config.json for a new run; for a resumed one, the
        allowed changes (config_changes.jsonl and config.json), or a config.json that was
        missing."""
        config_path = os.path.join(self.workdir, "config.json")
        is_main = jax.process_index() == 0
        if resumed_at is None:
            if is_main:
                write_json(config_path, self.config.to_dict())
        elif self.changes:
            _record_changes(self.workdir, resumed_at, self.changes, self.config)
        elif is_main and not paths.exists(config_path):
            write_json(config_path, self.config.to_dict())
            metrics.log(
                "warning: config.json was missing; wrote this run's settings (the checkpoint's "
                "shapes matched them)"
            )

    def release(self) -> None:
        self.claim.release()


def plan(config: ml_collections.ConfigDict, workdir: str, allow: tuple[str, ...] = ()) -> Resume:
    """Claims the workdir and answers what the run continues from: the config as it will run,
    the allowed changes (config keys in `allow`), train.init_from's weights.

    Raises ConfigError (the workdir is another run's, or in use; a setting the resume may not
    change; init_from unusable) or CheckpointError (only damaged checkpoints), the workdir
    released again.
    """
    claim = _claim_workdir(workdir)
    try:
        unknown = [k for k in allow if k not in flatten(config.to_dict())]
        if unknown:
            raise ConfigError(
                f"--allow_change names {', '.join(unknown)}, which is not a config key"
            )
        resumes = _has_checkpoints(workdir)
        path = os.path.join(workdir, "config.json")
        # None for a run that starts over (it writes config.json), or whose config.json is
        # gone (the checkpoints' shapes are still checked at the restore).
        stored = _read_stored_config(path) if resumes else None
        config = _checkpoint_layout(config, stored)
        changes = _check_resume(config, stored, path, tuple(allow))
        new = config.train.init_from and not resumes  # a resumed run goes on from its state
        init_from = _load_init_from(config, workdir) if new else None
    except BaseException:
        claim.release()
        raise
    return Resume(workdir, config, changes, init_from, claim)


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
    except ConfigError as e:
        error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        ok = np.asarray(multihost_utils.process_allgather(np.int32(error is None)))
        if error is None and not ok.all():
            error = ConfigError(
                f"--workdir {workdir} cannot be used by process(es) "
                f"{', '.join(map(str, np.flatnonzero(ok == 0)))}; see their error line"
            )
    if error is not None:
        if held is not None:
            held.release()
        raise error
    return held


def _read_stored_config(path: str) -> dict | None:
    """WORKDIR/config.json as a dict; None when missing; ConfigError when unreadable."""
    if not paths.exists(path):
        return None
    try:
        stored = jsonio.loads(paths.read_bytes(path))
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())
        raise ConfigError(
            f"{path} cannot be read ({reason}); restore it from a copy, or delete it to resume "
            "with the current settings (the checkpoints' shapes are still checked)"
        ) from None
    if not isinstance(stored, dict) or not {"model", "generator"} <= set(stored):
        raise ConfigError(
            f"{path} is not the config of an electra_jax run (no model and generator sections); "
            "restore it from a copy, or delete it to resume with the current settings"
        )
    return stored


def _has_checkpoints(workdir: str) -> bool:
    """Whether the workdir holds checkpoints to resume; refuses a file where they go, and a
    workdir whose checkpoints were all set aside as damaged (it is not started over)."""
    directory = checkpointing.checkpoint_dir(workdir)
    if paths.exists(directory) and not paths.isdir(directory):
        raise ConfigError(
            f"{directory} is a file, where the run keeps its checkpoints; move it away or use "
            "a new --workdir"
        )
    if checkpointing.has_checkpoints(workdir):
        return True
    aside = checkpointing.set_aside(workdir)
    if aside:
        raise checkpointing.CheckpointError(
            f"{directory} holds only checkpoints set aside as damaged ({', '.join(aside)}); "
            "this run will not start over on its own: inspect them, or use a new --workdir"
        )
    return False


def _check_resume(config, stored: dict | None, path: str, allow_changes: tuple[str, ...]) -> dict:
    """May this config resume the run `stored` (its config.json at `path`) describes?

    A workdir with checkpoints must be resumed with the model it was trained with and, but for
    the settings in FREE_ON_RESUME and `allow_changes`, the settings it was started with.
    Returns the allowed changes, {key: (stored value, new value)}; {} without a stored run.
    """
    if stored is None:
        return {}
    check_same_model(stored, config, path)
    return check_same_run(stored, config, path, tuple(allow_changes))


def _checkpoint_layout(config, stored: dict | None):
    """`config`, or where the stored run's checkpoints hold their layers in the other layout (a
    run started before model.scan_layers existed holds them unrolled) a copy that keeps theirs;
    likewise for a run started before the held-out slice, which keeps training on every row.

    The layout is how the parameters are stored, not what they compute, so a resume keeps the
    checkpoints' own rather than refusing or rewriting them.
    """
    if stored is None:
        return config
    layout = stored_scan_layers(stored)
    if bool(config.model.get("scan_layers", False)) != layout:
        config = config.copy_and_resolve_references()
        with config.unlocked():
            config.model.scan_layers = layout
        held = "stacked (scanned)" if layout else "unrolled"
        metrics.log(
            f"this run's checkpoints hold their layers {held}; resuming with "
            f"model.scan_layers={layout}"
        )
    if "heldout_examples" not in stored.get("data", {}) and config.data.get("heldout_examples"):
        # Holding rows out now would change the rows it trains on: it keeps training on all.
        config = config.copy_and_resolve_references()
        with config.unlocked():
            config.data.heldout_examples = 0
        metrics.log(
            "this run started before the held-out slice existed and trains on every row; "
            "resuming with data.heldout_examples=0 (no held-out evaluation; "
            "python -m electra_jax.evaluate reads its checkpoints on rows it has seen)"
        )
    return config


def _load_init_from(config: ml_collections.ConfigDict, workdir: str):
    """train.init_from's weights (a `pretrained.Pretrained`), its tokenizer put in the workdir.

    Only for a run without checkpoints: a resumed run continues from its own state.
    """
    from electra_jax import pretrained

    path = config.train.init_from
    try:
        loaded = pretrained.load_pretrained(path)
    except pretrained.PretrainedError as e:
        raise ConfigError(f"train.init_from: {e}") from e
    if config.data.tokenizer:
        raise ConfigError(
            f"train.init_from={path} brings its own tokenizer; leave data.tokenizer empty"
        )
    if jax.process_index() == 0:
        loaded.tokenizer.save(os.path.join(workdir, "tokenizer"))
    return loaded


def _record_changes(workdir: str, step: int, changes: dict, config) -> None:
    """Rewrites config.json with the settings the run goes on with and appends what changed, at
    which step, to config_changes.jsonl (process 0 only)."""
    if jax.process_index() != 0:
        return
    row = {"step": step, "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}}
    paths.append_text(
        os.path.join(workdir, "config_changes.jsonl"), json.dumps(row, sort_keys=True) + "\n"
    )
    write_json(os.path.join(workdir, "config.json"), config.to_dict())
    shown = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in changes.items())
    metrics.log(f"resuming at step {step} with changed settings: {shown}")


def mismatch_message(e: checkpointing.CheckpointMismatch, workdir: str) -> str:
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


# The fields that fix the parameters' shapes and meaning. model.dtype is left out: it is the compute
# type only (parameters stay float32), so resuming in bfloat16 what ran in float32 is legitimate.
_MODEL_SECTIONS = ("model", "generator")
_MODEL_KEYS = ("data.vocab_size", "data.seq_length", "objective.name")  # name: the MLM head
_NOT_MODEL = ("model.dtype",)
# What a run config written before these keys existed means by their absence: a run started
# before model.scan_layers holds its layers unrolled; one started before the held-out slice
# trained on every row.
_ADDED_DEFAULTS = {
    "model.embedding_sharing": "electra",
    "model.scan_layers": False,
    "data.heldout_examples": 0,
}


def with_added_defaults(stored: dict) -> dict:
    """A stored run config (config.json) with the keys added since filled in as `_ADDED_DEFAULTS`
    says the run had them; a new nested dict."""
    out = json.loads(json.dumps(stored))
    for key, value in _ADDED_DEFAULTS.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(leaf, value)
    return out


def stored_scan_layers(stored: dict) -> bool:
    """The layer layout of a stored run config (config.json): model.scan_layers."""
    return bool(flatten(stored).get("model.scan_layers", _ADDED_DEFAULTS["model.scan_layers"]))


def _shown(keys: list[str], old: dict, new: dict) -> str:
    """The first four differing settings, stored value against new, and how many more."""
    shown = ", ".join(f"{k}={old.get(k)!r} there vs {new.get(k)!r} now" for k in keys[:4])
    return shown + (f" (and {len(keys) - 4} more)" if len(keys) > 4 else "")


def check_same_model(stored: dict, config: Any, config_path: str) -> None:
    """Raises ConfigError when a workdir's stored config describes another model than `config`.

    stored: the parsed config.json of the workdir. Compares model.*, generator.*,
    data.vocab_size and data.seq_length, so that a resume with other sizes fails here in one line
    instead of as a shape error deep inside the restore.
    """
    # Keys added since a run was stored mean their default there.
    old = {**_ADDED_DEFAULTS, **flatten(stored)}
    new = flatten(config.to_dict())

    def is_model_key(key: str) -> bool:
        return (key.split(".", 1)[0] in _MODEL_SECTIONS or key in _MODEL_KEYS) and (
            key not in _NOT_MODEL
        )

    keys = sorted(k for k in set(old) | set(new) if is_model_key(k))
    differ = [k for k in keys if old.get(k) != new.get(k)]
    if differ:
        raise ConfigError(
            f"{config_path} describes a different model than the one asked for: "
            f"{_shown(differ, old, new)}; "
            "to resume, run with the same settings; to train this model, use a new --workdir"
        )


# Settings a resumed run may change without saying so: how long it runs, how the same numbers are
# computed and laid out, where files go and how often they are written. Every other setting
# (data, schedule, optimizer, objective, seed) shapes what the run learns, so a resume that
# changes one would no longer continue the run it resumes; it needs train's --allow_change.
FREE_ON_RESUME = (
    "train.num_steps",
    "train.steps_per_call",
    "train.remat",
    "train.grad_accum_steps",
    "train.nan_policy",
    "train.debug_nan_at_step",
    "train.init_from",  # read only by a fresh run
    "data.cache_dir",
    "data.tokenizer",  # a resumed run keeps its own; a different file is refused by fingerprint
    "data.examples_per_shard",
    "data.tfds_data_dir",
    "mesh.",
    "checkpoint.",
    "log.",
    "eval.",  # what is read and how often; never what is trained (data.heldout_examples is)
)


def _is_free(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in FREE_ON_RESUME)


def check_same_run(
    stored: dict, config: Any, config_path: str, allowed: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """Raises ConfigError when `config` changes a setting of the stored run that a resume must
    keep (see FREE_ON_RESUME), unless the key is in `allowed`.

    Keys the stored config lacks (added to the framework since) are not compared. Returns the
    allowed changes, {key: (stored value, new value)}, for the caller to record.
    """
    old, new = flatten(stored), flatten(config.to_dict())
    differ = sorted(k for k in set(old) & set(new) if old[k] != new[k] and not _is_free(k))
    refused = [k for k in differ if k not in allowed]
    if refused:
        raise ConfigError(
            f"resuming with other settings than {config_path}: {_shown(refused, old, new)}; "
            "run with the "
            "stored settings to continue exactly, or pass --allow_change="
            f"{','.join(refused)} to change them from this step on (recorded in "
            "config_changes.jsonl), or use a new --workdir"
        )
    return {k: (old[k], new[k]) for k in differ}
