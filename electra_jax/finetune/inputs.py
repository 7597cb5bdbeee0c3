"""What a fine-tuning run reads from outside its workdir, and a resume held to it.

At a run's first start, model.json records under "inputs":

- "data_files": each task file it read (GLUE's TSVs, SQuAD's JSON files) by path, size,
  modification time and SHA-256. TFDS sources (GLUE with an empty data_dir) are named by their
  dataset and version in "tfds" instead (TFDS versions a prepared dataset; its files are not
  ours to hash).
- "init_from": the pre-trained model resolved once: "load", the exact path read (a pre-training
  workdir's newest checkpoint becomes WORKDIR@STEP, so that a pre-training that goes on meanwhile
  does not change what a resume reads), and "weights_sha256", a digest of the encoder weights
  taken from it.

A resume reads the same: init_from at that step, and the files and weights are compared with the
record. A difference is refused in one line unless `--allow_change` names it ("data_dir": the
task's files, or data_dir itself, may differ; "init_from": the pre-trained weights, or init_from
itself), and an allowed one is appended to config_changes.jsonl and becomes the record. A run
whose model.json predates the record resumes as before and gets one.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from electra_jax.errors import ConfigError
from electra_jax.finetune import saved
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import jsonio, paths

CHANGES_FILE = workdir_lib.CHANGES_FILE


def file_facts(path: str) -> dict:
    """{'size', 'mtime' (UTC, ISO 8601), 'sha256'} of a local file."""
    stat = os.stat(path)
    mtime = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc)
    return {"size": stat.st_size, "mtime": mtime.isoformat(), "sha256": paths.sha256_of_file(path)}


def data_record(files: Sequence[str]) -> dict[str, dict]:
    """{absolute path: file_facts} of the task files a run read."""
    return {os.path.abspath(p): file_facts(p) for p in files}


def weights_digest(params: dict) -> str:
    """SHA-256 over a nested dict of arrays: each leaf's path, dtype, shape and bytes, in sorted
    order (the same weights give the same digest wherever they were read from)."""
    digest = hashlib.sha256()

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key in sorted(node):
                walk(node[key], f"{prefix}/{key}")
            return
        array = np.ascontiguousarray(np.asarray(node))
        digest.update(f"{prefix}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())

    walk(params, "")
    return digest.hexdigest()


def pinned_init_from(config: Any, pretraining: dict | None) -> str:
    """What init_from reads, fixed at the first start: a pre-training workdir at the step read
    then (PATH@STEP); anything else (an export, hf:DIR) as the config names it."""
    if pretraining and pretraining.get("kind") == "workdir" and "step" in pretraining:
        return f"{pretraining['path']}@{pretraining['step']}"
    return config.init_from


def first_record(files: Sequence[str], tfds: dict | None, init_from: str, encoder) -> dict:
    """model.json's "inputs" at a run's first start (encoder: the pre-trained encoder params,
    None for random init)."""
    record: dict = {"data_files": data_record(files)}
    if tfds:
        record["tfds"] = tfds
    if encoder is not None:
        record["init_from"] = {"load": init_from, "weights_sha256": weights_digest(encoder)}
    return record


def _file_changes(recorded: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """'PATH: what changed' for every task file that differs from the record, is gone or new."""
    out = []
    for path in sorted(set(recorded) | set(now)):
        old, new = recorded.get(path), now.get(path)
        if old is None:
            out.append(f"{path} is read now but was not at the start")
        elif new is None:
            out.append(f"{path} was read at the start but is not now")
        elif old.get("sha256") != new["sha256"]:
            was = f"{old.get('size')} bytes of {old.get('mtime')}"
            out.append(f"{path} changed ({new['size']} bytes of {new['mtime']}, was {was})")
    return out


def check_data(
    workdir: str, record: dict, files: Sequence[str], tfds: dict | None, allow: Sequence[str]
) -> dict | None:
    """Compares the task's files (and TFDS version) now with model.json's record. Returns the
    new "inputs" record when it must be written (a record made now for a run that predates
    it, or an allowed change), else None. ConfigError (one line) for a change not allowed."""
    inputs = record.get("inputs")
    now = data_record(files)
    if inputs is None:
        return {"data_files": now, **({"tfds": tfds} if tfds else {})}
    changes = _file_changes(inputs.get("data_files", {}), now)
    if (inputs.get("tfds") or None) != (tfds or None):
        changes.append(f"TFDS is {tfds} now, was {inputs.get('tfds')}")
    if not changes:
        return None
    if "data_dir" not in allow:
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        raise ConfigError(
            f"--workdir {workdir}: the run started from other task files: {changes[0]}{more}; "
            "restore them to resume it, or resume with --allow_change=data_dir to go on with "
            f"these (recorded in {CHANGES_FILE}), or use a new --workdir"
        )
    return {**inputs, "data_files": now, "tfds": tfds} if tfds else {**inputs, "data_files": now}


def check_finished(
    workdir: str, record: dict, files: Sequence[str], tfds: dict | None, allow: Sequence[str]
) -> str | None:
    """A finished run asked again: its results are of the task files it read, so files that
    changed since are refused in one line (ConfigError) saying what changed, as mid-run, rather
    than the old results given back without a word; with --allow_change=data_dir, the line to
    print that they are the earlier files' results. None when nothing changed (or the run
    predates the record)."""
    inputs = record.get("inputs")
    if inputs is None:
        return None
    changes = _file_changes(inputs.get("data_files", {}), data_record(files))
    if (inputs.get("tfds") or None) != (tfds or None):
        changes.append(f"TFDS is {tfds} now, was {inputs.get('tfds')}")
    if not changes:
        return None
    more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
    if "data_dir" in allow:
        return (
            f"warning: {workdir} holds this run, finished on other task files ({changes[0]}"
            f"{more}): its results are of those; fine-tune in a new --workdir for these"
        )
    raise ConfigError(
        f"--workdir {workdir} holds this run, finished on other task files: {changes[0]}{more}; "
        "its results are of those: restore them, or fine-tune on these in a new --workdir"
    )


def check_weights(workdir: str, record: dict, encoder, allow: Sequence[str]) -> dict | None:
    """Compares the pre-trained encoder read on a resume with model.json's record; returns the
    new "inputs" record when it must be written, else None. ConfigError for a change not
    allowed."""
    inputs = record.get("inputs") or {}
    pinned = inputs.get("init_from")
    digest = weights_digest(encoder)
    if pinned is None or pinned.get("weights_sha256") == digest:
        return None
    if "init_from" not in allow:
        raise ConfigError(
            f"--workdir {workdir}: the pre-trained weights at {pinned.get('load')} are not the "
            "ones the run started from (another digest); restore them to resume it, or resume "
            f"with --allow_change=init_from to start from these (recorded in {CHANGES_FILE}), or "
            "use a new --workdir"
        )
    return {**inputs, "init_from": {**pinned, "weights_sha256": digest}}


def rewrite_record(workdir: str, record: dict, inputs: dict) -> dict:
    """model.json with `inputs` in place (written atomically); returns it."""
    record = {**record, "inputs": inputs}
    jsonio.write_json(paths.join(workdir, saved.MODEL_FILE), record)
    return record


def record_resume(
    workdir: str,
    record: dict,
    new: dict | None,
    step: int,
    config,
    changes: dict,
    log: Callable[[str], None],
) -> None:
    """What a resume found changed and was allowed to (`new`: model.json's new "inputs", or
    None when the inputs are as recorded; `changes`: the settings that changed, {key: (from,
    to)}, as prior_run.plan allowed them: config.data_dir or init_from themselves):
    config_changes.jsonl gets them at `step` (rerun.record_changes), model.json and config.json
    the new record and settings. A run that predates the record gets one, and no row for it."""
    old = record.get("inputs")
    if old is None:
        rewrite_record(workdir, record, new)
        found = {}
    else:
        found = {
            f"inputs.{key}": (old.get(key), new.get(key))
            for key in sorted(set(old) | set(new or {}))
            if new is not None and old.get(key) != new.get(key)
        }
    every = {**found, **changes}
    if not every:
        return
    rerun.record_changes(workdir, step, every, config.to_dict())
    if old is not None and new is not None:
        rewrite_record(workdir, record, new)
    log(f"resuming at step {step} with changed inputs: {', '.join(every)}")
