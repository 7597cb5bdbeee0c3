"""What a fine-tuning run reads from outside its workdir, and a resume held to it (TASK_FILES,
fine-tuning's record of its inputs for the resume plan, run/rerun.py).

At a run's first start, model.json records under "inputs":

- "data_files": each task file it read (GLUE's TSVs, SQuAD's JSON files) by path, size,
  modification time and SHA-256. TFDS sources (GLUE with an empty data_dir) are named by their
  dataset and version in "tfds" instead (TFDS versions a prepared dataset; its files are not
  ours to hash).
- "init_from": the pre-trained model resolved once: "load", the exact path read (a pre-training
  workdir's newest checkpoint becomes WORKDIR@STEP, so that a pre-training that goes on meanwhile
  does not change what a resume reads), and "weights_sha256", a digest of the encoder weights
  taken from it.

A resume reads the same: init_from at that step, and the files and weights are held to the
record (Resume.hold_inputs). A difference is refused in one line unless `--allow_change` names
it ("data_dir": the task's files, or data_dir itself, may differ; "init_from": the pre-trained
weights, or init_from itself), and an allowed one is appended to config_changes.jsonl and
becomes the record. A run whose model.json predates the record resumes as before and gets one.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from electra_jax.errors import ConfigError
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import filenames, jsonio, paths

CHANGES_FILE = workdir_lib.CHANGES_FILE


def file_facts(path: str) -> dict:
    """{'size', 'mtime' (UTC, ISO 8601), 'sha256'} of a local file."""
    stat = os.stat(path)
    mtime = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc)
    return {"size": stat.st_size, "mtime": mtime.isoformat(), "sha256": paths.sha256_of_file(path)}


def data_record(files: Sequence[str]) -> dict[str, dict]:
    """{absolute path: file_facts} of the task files a run read."""
    return {os.path.abspath(p): file_facts(p) for p in files}


def task_files(files: Sequence[str], tfds: dict | None) -> dict:
    """The "inputs" fields of the task's files as they are now (tfds None: local files)."""
    return {"data_files": data_record(files), "tfds": tfds}


def hold_files(run: rerun.Resume, files: Sequence[str], tfds: dict | None) -> None:
    """Holds the task's files (`files`; TFDS's `tfds`) read on a resume to the run's record:
    ConfigError for other files unless --allow_change=data_dir."""
    run.hold_inputs({**(TASK_FILES.read(run) or {}), **task_files(files, tfds)})


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


def _file_changes(recorded: dict, now: dict) -> list[str]:
    """'PATH: what changed' for every task file that differs from the record, is gone or new,
    then the TFDS source (recorded, now: "inputs" records)."""
    out = []
    before, after = recorded.get("data_files", {}), now.get("data_files", {})
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old is None:
            out.append(f"{path} is read now but was not at the start")
        elif new is None:
            out.append(f"{path} was read at the start but is not now")
        elif old.get("sha256") != new["sha256"]:
            was = f"{old.get('size')} bytes of {old.get('mtime')}"
            out.append(f"{path} changed ({new['size']} bytes of {new['mtime']}, was {was})")
    if (recorded.get("tfds") or None) != (now.get("tfds") or None):
        out.append(f"TFDS is {now.get('tfds')} now, was {recorded.get('tfds')}")
    return out


def _first(changes: list[str]) -> str:
    return changes[0] + (f" (and {len(changes) - 1} more)" if len(changes) > 1 else "")


class TaskFiles(rerun.InputsRecord):
    """Fine-tuning's record of its inputs: model.json's "inputs" (the run's, Resume.started)."""

    def read(self, run: rerun.Resume) -> dict | None:
        return (run.started or {}).get("inputs")

    def same(self, field: str, old: Any, new: Any) -> bool:
        if field == "data_files":  # the same bytes, whenever they were written
            return _file_changes({field: old or {}}, {field: new}) == []
        return old == new

    def allow_key(self, field: str) -> str:
        return "init_from" if field == "init_from" else "data_dir"

    def refusal(self, run: rerun.Resume, recorded: dict, now: dict, refused: list[str]) -> str:
        if "init_from" in refused:
            return (
                f"--workdir {run.workdir}: the pre-trained weights at "
                f"{recorded['init_from'].get('load')} are not the ones the run started from "
                "(another digest); restore them to resume it, or resume with "
                f"--allow_change=init_from to start from these (recorded in {CHANGES_FILE}), or "
                "use a new --workdir"
            )
        return (
            f"--workdir {run.workdir}: the run started from other task files: "
            f"{_first(_file_changes(recorded, now))}; restore them to resume it, or resume with "
            f"--allow_change=data_dir to go on with these (recorded in {CHANGES_FILE}), or use "
            "a new --workdir"
        )


TASK_FILES = TaskFiles()


def hold_weights(run: rerun.Resume, encoder) -> None:
    """Holds the pre-trained encoder read on a resume to the run's record of it (where it has
    one): ConfigError for other weights unless --allow_change=init_from."""
    current = run.inputs or TASK_FILES.read(run) or {}
    pinned = current.get("init_from")
    if pinned is not None:
        digest = weights_digest(encoder)
        run.hold_inputs({**current, "init_from": {**pinned, "weights_sha256": digest}})


def check_finished(run: rerun.Resume, files: Sequence[str], tfds: dict | None) -> str | None:
    """A finished run asked again: its results are of the task files it read, so files that
    changed since are refused in one line (ConfigError) saying what changed, as mid-run, rather
    than the old results given back without a word; with --allow_change=data_dir, the line to
    print that they are the earlier files' results. None when nothing changed (or the run
    predates the record)."""
    recorded = TASK_FILES.read(run)
    if recorded is None:
        return None
    changes = _file_changes(recorded, task_files(files, tfds))
    if not changes:
        return None
    if "data_dir" in run.allow:
        return (
            f"warning: {run.workdir} holds this run, finished on other task files "
            f"({_first(changes)}): its results are of those; fine-tune in a new --workdir for these"
        )
    raise ConfigError(
        f"--workdir {run.workdir} holds this run, finished on other task files: "
        f"{_first(changes)}; its results are of those: restore them, or fine-tune on these in a "
        "new --workdir"
    )


def record_resume(run: rerun.Resume, step: int) -> None:
    """What a resume found changed and was allowed to (Resume.inputs_changes, and the settings
    that changed, Resume.changes: config.data_dir or init_from themselves): config_changes.jsonl
    gets them at `step` (rerun.record_changes), config.json the settings and model.json the new
    record (Resume.inputs). A run that predates the record gets one, and no row for it."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.model.sharding import log

    found = {f"inputs.{k}": run.inputs_changes[k] for k in sorted(run.inputs_changes)}
    every = {**found, **run.changes}
    if every:
        rerun.record_changes(run.workdir, step, every, run.config.to_dict())
    if run.inputs is not None:
        model = {**run.started, "inputs": run.inputs}
        jsonio.write_json(paths.join(run.workdir, filenames.MODEL_FILE), model)
    if every:
        log(f"resuming at step {step} with changed inputs: {', '.join(every)}")
