"""What a rerun of a workdir goes on from: the resume plan pre-training and fine-tuning share.

`open_run(workdir, rules, allow, new)` claims the workdir for the whole run (workdir.claim, every
process agreeing), checks the --allow_change names, surveys the checkpoints
(checkpoint_steps.survey: an entry orbax would take for a step that is not the run's is refused,
nothing moved; a workdir whose checkpoints were all set aside as damaged is not started over), reads
the stored config.json and, when it is gone, asks the command what the workdir then holds
(`Rules.without_config`); with claim=False it answers the same without claiming the workdir, for a
command line to refuse before it imports jax. `Rerun.compare` holds the new settings to the stored
ones by the command's rule table: a key of `Rules.free` may change unasked, one --allow_change names
changes and is recorded (`record_changes`: config_changes.jsonl and config.json), any other is
refused.

Each command brings its rules and what only it has on top: pre-training (resume.py) the data
record, the phase switches, train.init_from's weights and its num_steps against the step;
fine-tuning (finetune/prior_run.py) model.json, the task's labels and files (finetune/inputs.py)
and a finished run's results.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from electra_jax.errors import ConfigError
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames, paths
from electra_jax.store.jsonio import write_json

# The --allow_change name that lets a run whose config.json is gone resume with the command
# line's settings (where the command's rules allow it at all: Rules.may_lose_config).
MISSING_CONFIG = filenames.CONFIG_FILE
# What a setting on one side only of a comparison is on the other.
ABSENT = "(absent)"


@dataclasses.dataclass(frozen=True)
class Rules:
    """What a command's rerun is held to."""

    kind: str  # workdir.PRETRAIN or workdir.FINETUNE: whose workdirs these are
    command: str  # the command named in the lock ('electra_jax.train')
    # Settings a rerun may change unasked ("checkpoint." names a whole section): they change
    # how the same numbers are computed, stored or shown, never which.
    free: tuple[str, ...]
    # config.json (its path) as a dict; ConfigError when unreadable or not the command's.
    read_stored: Callable[[str], dict]
    # Called when config.json is absent, with (workdir, whether it holds checkpoints, allow):
    # ConfigError when the workdir still holds a run whose settings are then unknown.
    without_config: Callable[[str, bool, tuple[str, ...]], None]
    # True: a config.json says the workdir holds a run, checkpoints or not (fine-tuning: one cut
    # short before its first checkpoint, or finished). False: only checkpoints do, and a
    # config.json without them is a start that is written over (pre-training).
    stored_without_checkpoints: bool = False
    # True: a key on one side only differs (fine-tuning). False: a key the stored config lacks
    # was added to the framework since, and is not compared (pre-training).
    absent_differs: bool = False
    # Whether --allow_change=config.json may name a config.json that is gone.
    may_lose_config: bool = False

    def is_free(self, key: str) -> bool:
        """Whether a rerun may change the setting `key` ("a.b") unasked."""
        return any(key == k or (k.endswith(".") and key.startswith(k)) for k in self.free)


@dataclasses.dataclass
class Rerun:
    """The answer of `open_run`: the claimed workdir and what it holds."""

    workdir: str
    claim: Any  # workdir.Claim: the workdir, locked by process 0 until `release`; None: unclaimed
    rules: Rules
    resumes: bool  # the workdir holds checkpoints
    stored: dict | None  # config.json, nested; None when absent (or written over: a new start)

    @property
    def config_path(self) -> str:
        """WORKDIR/config.json."""
        return paths.join(self.workdir, filenames.CONFIG_FILE)

    def release(self) -> None:
        """Unlocks the workdir (the claim's end)."""
        if self.claim is not None:
            self.claim.release()


def open_run(
    workdir: str, rules: Rules, allow: tuple[str, ...], new: dict, claim: bool = True
) -> Rerun:
    """Claims the workdir and answers what it holds (`new`: the settings asked for, flat, whose
    keys --allow_change may name). Raises ConfigError (the workdir is another's or in use, an
    --allow_change name is no key, config.json unreadable or gone from a run) or CheckpointError
    (only damaged checkpoints), the workdir released again. With `claim` False, the answer
    without the claim (Rerun.claim None): the claim's checks (workdir.claim without the lock),
    nothing written, for a command line before it imports jax; the run claims it later."""
    if claim:
        held = claim_workdir(workdir, rules.kind, rules.command)
    else:
        workdir_lib.claim(workdir, rules.kind, lock=False)  # its checks; nothing written
        held = None
    try:
        names = set(new) | ({MISSING_CONFIG} if rules.may_lose_config else set())
        unknown = [k for k in allow if k not in names]
        if unknown:
            raise ConfigError(
                f"--allow_change names {', '.join(unknown)}, which is not a config key"
            )
        resumes = has_checkpoints(workdir)
        path = paths.join(workdir, filenames.CONFIG_FILE)
        stored = None
        if resumes or rules.stored_without_checkpoints:
            stored = rules.read_stored(path) if paths.exists(path) else None
            if stored is None:
                rules.without_config(workdir, resumes, tuple(allow))
    except BaseException:
        if held is not None:
            held.release()
        raise
    return Rerun(workdir, held, rules, resumes, stored)


def compare(
    old: dict, new: dict, rules: Rules, allow: tuple[str, ...]
) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """(allowed changes {key: (stored, new)}, refused keys, sorted) between `old`, the stored
    settings, and `new`, both flat ({"a.b": value}): every differing key but `rules.free`,
    refused unless `allow` names it. A key on one side only is ABSENT on the other where the
    rules say it differs, else not compared."""
    keys = set(old) | set(new) if rules.absent_differs else set(old) & set(new)
    differ = sorted(
        k for k in keys if old.get(k, ABSENT) != new.get(k, ABSENT) and not rules.is_free(k)
    )
    changes = {k: (old.get(k, ABSENT), new.get(k, ABSENT)) for k in differ if k in allow}
    return changes, [k for k in differ if k not in allow]


def claim_workdir(workdir: str, kind: str, command: str):
    """The workdir, locked by process 0 for the run; every process agrees before going on."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax
    import numpy as np

    error, held = None, None
    try:
        held = workdir_lib.claim(workdir, kind, lock=jax.process_index() == 0, command=command)
    except ConfigError as e:
        error = e
    if jax.process_count() > 1:
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
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


def has_checkpoints(workdir: str) -> bool:
    """Whether the workdir holds checkpoints to resume; refuses a file where they go, and a
    workdir whose checkpoints were all set aside as damaged (it is not started over)."""
    directory = checkpoint_steps.checkpoint_dir(workdir)
    if paths.exists(directory) and not paths.isdir(directory):
        raise ConfigError(
            f"{directory} is a file, where the run keeps its checkpoints; move it away or use "
            "a new --workdir"
        )
    # Before any step is taken for a checkpoint: an entry orbax would take for one that is not
    # (an export put there, a checkpoint renamed by hand) is refused, nothing moved.
    checkpoint_steps.survey(directory)
    if checkpoint_steps.has_checkpoints(workdir):
        return True
    aside = checkpoint_steps.set_aside(workdir)
    if aside:
        raise checkpoint_steps.CheckpointError(
            f"{directory} holds only checkpoints set aside as damaged ({', '.join(aside)}); "
            "this run will not start over on its own: inspect them, or use a new --workdir"
        )
    return False


def append_change(workdir: str, row: dict) -> None:
    """One row of WORKDIR/config_changes.jsonl: what a resume changed, at which step."""
    paths.append_text(
        os.path.join(workdir, workdir_lib.CHANGES_FILE), json.dumps(row, sort_keys=True) + "\n"
    )


def change_row(step: int, changes: dict[str, tuple[Any, Any]]) -> dict:
    """config_changes.jsonl's row of `changes` ({key: (from, to)}) at `step`."""
    return {"step": step, "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}}


def record_changes(workdir: str, step: int, changes: dict, config: dict) -> None:
    """Appends the allowed `changes` ({key: (from, to)}) at `step` to config_changes.jsonl and
    rewrites config.json with `config`, the settings the run goes on with (process 0 only)."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    if jax.process_index() != 0:
        return
    append_change(workdir, change_row(step, changes))
    write_json(paths.join(workdir, filenames.CONFIG_FILE), config)
