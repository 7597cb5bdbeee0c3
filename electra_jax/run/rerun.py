"""What a rerun of a workdir goes on from: the one resume plan of pre-training and fine-tuning.

`plan(rules, config, workdir, allow)` answers it without jax and without the lock, writing
nothing: the command line asks it before it imports jax, so that what the run would refuse is
answered in a blink. The runner then takes the workdir for the whole run (`take`: workdir.hold,
process 0's lock, every process agreeing) and asks again only what another process may have
changed before the lock, the checkpoints and config.json: as the plan saw them, its answer stands.

The plan asks the claim's checks (workdir.check) and the --allow_change names, surveys the
checkpoints (checkpoint_steps.survey: an entry orbax would take for a step that is not the run's is
refused, nothing moved; a workdir whose checkpoints were all set aside as damaged is not started
over), reads the stored config.json (gone, the command says what the workdir then holds:
Rules.without_config) and holds the stored settings to the new ones (`compare`): a key the stored
run lacks means what its Key.absent says (the run predates it), a key of Key.resume FREE may change
unasked, one --allow_change names changes and is recorded (`record_changes`: config_changes.jsonl
and config.json), any other is refused in the command's words (Rules.refusal). Then the command asks
its own questions (Rules.settle).

What the run read from outside its workdir is held to its record the same way once the runner
knows it (`Resume.hold_inputs`; Rules.record, an InputsRecord: the corpus for pre-training,
pretraining/resume.py; the task files and pre-trained weights for fine-tuning,
finetune/inputs.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from electra_jax.config import schema
from electra_jax.config.schema import flatten
from electra_jax.errors import ConfigError
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames, paths
from electra_jax.store.jsonio import write_json

# The --allow_change name that lets a run whose config.json is gone resume with the command
# line's settings (where the command's rules allow it at all: Rules.may_lose_config).
MISSING_CONFIG = filenames.CONFIG_FILE


class InputsRecord:
    """What a command's runs read from outside the workdir (a corpus, task files, pre-trained
    weights), recorded when a run starts and held on a resume by `Resume.hold_inputs`: a field
    that differs from the record is refused unless --allow_change names its key. Each command
    says where its record is and what its fields mean (see each method)."""

    def read(self, run: Resume) -> dict | None:
        """The record of the run `run` goes on with; None when it has none (a new run, or one
        started before the record: it gets one). ConfigError when it cannot be read."""
        raise NotImplementedError

    def fields(self, record: dict) -> dict:
        """What of a record is held to, {field: value}."""
        return record

    def same(self, field: str, old: Any, new: Any) -> bool:
        """Whether `field`'s recorded value and its value now name the same inputs."""
        return old == new

    def allow_key(self, field: str) -> str:
        """The --allow_change name that lets `field` differ."""
        raise NotImplementedError

    def refusal(self, run: Resume, recorded: dict, now: dict, refused: list[str]) -> str:
        """The one line refusing the changes of the `refused` fields between the records."""
        raise NotImplementedError


class Rules:
    """What a command's rerun is held to: each command's subclass says its own."""

    kind: str  # workdir.PRETRAIN or workdir.FINETUNE: whose workdirs these are
    command: str  # the command named in the lock ('electra_jax.train')
    keys: tuple[schema.Key, ...]  # the settings: their Key.resume and Key.absent
    record: InputsRecord
    # True: a config.json says the workdir holds a run, checkpoints or not (fine-tuning: one cut
    # short before its first checkpoint, or finished). False: only checkpoints do, and a
    # config.json without them is a start that is written over (pre-training).
    stored_without_checkpoints = False
    may_lose_config = False  # whether --allow_change=config.json may name a config.json gone

    def read_stored(self, path: str) -> dict:
        """config.json (its path) as a dict; ConfigError when unreadable or not the command's."""
        raise NotImplementedError

    def without_config(self, workdir: str, resumes: bool, allow: tuple[str, ...]) -> None:
        """Asked when config.json is absent (`resumes`: the workdir holds checkpoints):
        ConfigError when the workdir still holds a run whose settings are then unknown."""

    def keep(self, old: dict, new: dict, say: Callable[[str], None]) -> dict:
        """The settings the stored run keeps over the asked ones ({key: value}, flat; `say`
        gets a line for each); {} by default."""
        return {}

    def refusal(self, run: Resume, old: dict, new: dict, refused: list[str]) -> str:
        """The one line refusing the `refused` settings (old: stored, new: asked, flat)."""
        raise NotImplementedError

    def settle(self, run: Resume) -> None:
        """The command's own questions of the run, once its settings are held (ConfigError)."""

    def write(self, run: Resume, step: int | None) -> None:
        """What the run goes on with, once restored at `step` (None: a new run)."""

    def is_free(self, key: str) -> bool:
        """Whether a rerun may change the setting `key` ("a.b") unasked (Key.resume FREE)."""
        return schema.resume_rule(key, self.keys) == schema.FREE


@dataclasses.dataclass
class Resume:
    """The answer of `plan`: what the run goes on from."""

    workdir: str
    config: Any  # the settings the run goes on with (ConfigDict): as asked, but what it keeps
    rules: Rules
    allow: tuple[str, ...] = ()  # --allow_change
    command: str | None = None  # the command line, recorded by the command (None: the API's)
    asked: Any = None  # the settings as asked (completed and checked by the caller)
    claim: Any = None  # workdir.Claim: locked by process 0 until `release`; None: unclaimed
    resumes: bool = False  # the workdir holds checkpoints
    newest: int | None = None  # its newest checkpoint's step
    stored: dict | None = None  # config.json, nested; None when absent (or a start written over)
    changes: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # allowed
    said: list[str] = dataclasses.field(default_factory=list)  # lines of what the run keeps
    started: dict | None = None  # fine-tuning: model.json of the run it resumes
    finished: dict | None = None  # fine-tuning: a finished run's results, answered as they are
    # The inputs record to write (None: the one there stands) and its allowed changes,
    # {field: (recorded, now)} (`hold_inputs`).
    inputs: dict | None = None
    inputs_changes: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)

    @property
    def config_path(self) -> str:
        """WORKDIR/config.json."""
        return paths.join(self.workdir, filenames.CONFIG_FILE)

    def hold_inputs(self, now: dict) -> None:
        """Holds `now`, the record of what the run reads from outside its workdir as it reads
        it, to the run's (Rules.record; or to what an earlier call set to write): ConfigError in
        the command's words for a field that differs unless --allow_change names its key; else
        `inputs` is what to write (`now`, its None values left out; None while the record
        stands) and `inputs_changes` gains the allowed changes."""
        record = self.rules.record
        recorded = self.inputs if self.inputs is not None else record.read(self)
        if recorded is not None:
            old, new = record.fields(recorded), record.fields(now)
            differ = {
                k: (old.get(k), v) for k, v in new.items() if not record.same(k, old.get(k), v)
            }
            refused = [k for k in differ if record.allow_key(k) not in self.allow]
            if refused:
                raise ConfigError(record.refusal(self, recorded, now, refused))
            if not differ:
                return
            self.inputs_changes.update(differ)
        self.inputs = {k: v for k, v in now.items() if v is not None}

    def record(self, step: int | None) -> None:
        """Once the state is restored (`step`: its step; None for a new run), writes what the
        run goes on with (Rules.write)."""
        self.rules.write(self, step)

    def release(self) -> None:
        """Unlocks the workdir (the claim's end)."""
        if self.claim is not None:
            self.claim.release()


def plan(
    rules: Rules, config, workdir: str, allow: tuple[str, ...] = (), command: str | None = None
) -> Resume:
    """What the run of `config` (completed and checked by the caller) goes on from in `workdir`,
    asked without jax and without the claim (its checks, the lock left to `take`), nothing
    written. Raises ConfigError (the workdir is another's, an --allow_change name is no key,
    config.json unreadable or gone from a run, a setting the rerun may not change, the
    command's own refusals) or CheckpointError (only damaged checkpoints)."""
    workdir_lib.check(workdir, rules.kind)  # the claim's checks; nothing written
    return _planned(Resume(workdir, config, rules, tuple(allow), command, asked=config))


def take(planned: Resume) -> Resume:
    """The run `plan` answered, its workdir now claimed for it (process 0 holds the lock, every
    process agreeing). Its checkpoints and config.json are asked again: as the plan saw them,
    its answer stands; else it is planned anew. Raises as `plan` does, the workdir released."""
    rules = planned.rules
    held = claim_workdir(planned.workdir, rules.kind, rules.command)
    try:
        return _planned(dataclasses.replace(planned, claim=held), seen=planned)
    except BaseException:
        held.release()
        raise


def _planned(run: Resume, seen: Resume | None = None) -> Resume:
    """`run` (its workdir, rules, settings asked, --allow_change) answered from the workdir;
    `seen`'s answer when the checkpoints and config.json are still as it saw them."""
    rules, workdir, allow = run.rules, run.workdir, run.allow
    new = flatten(run.asked.to_dict())  # the settings asked for, {"a.b": value}
    names = set(new) | ({MISSING_CONFIG} if rules.may_lose_config else set())
    unknown = [k for k in allow if k not in names]
    if unknown:
        raise ConfigError(f"--allow_change names {', '.join(unknown)}, which is not a config key")
    resumes = has_checkpoints(workdir)
    newest = checkpoint_steps.saved_steps(workdir)[-1] if resumes else None
    stored = None
    if resumes or rules.stored_without_checkpoints:
        path = run.config_path
        stored = rules.read_stored(path) if paths.exists(path) else None
        if stored is None:
            rules.without_config(workdir, resumes, allow)
    if seen is not None and (resumes, newest, stored) == (seen.resumes, seen.newest, seen.stored):
        return run
    run = dataclasses.replace(run, config=run.asked, resumes=resumes, newest=newest, stored=stored)
    run.changes, run.said, run.started, run.finished = {}, [], None, None
    if stored is not None:
        kept = rules.keep(flatten(stored), new, run.said.append)
        if kept:
            new.update(kept)
            run.config = run.asked.copy_and_resolve_references()
            with run.config.unlocked():
                for key, value in kept.items():
                    section, field = key.split(".")
                    run.config[section][field] = value
        old = stored_settings(stored, rules.keys)
        run.changes, refused = compare(old, new, rules, allow)
        if refused:
            raise ConfigError(rules.refusal(run, old, new, refused))
    rules.settle(run)
    return run


def stored_settings(stored: dict, keys) -> dict:
    """A stored config.json's settings, flat, as its run had them: a key it lacks at its
    Key.absent (the run predates the key), but for a MODEL key without an absent of its own,
    whose absence leaves the shapes unknown (a damaged file): it stays absent, and differs."""
    model = [k for k in keys if k.resume == schema.MODEL]
    rest = [k for k in keys if k.resume != schema.MODEL]
    return flatten(schema.upgrade(schema.upgrade(stored, rest), model, declared_only=True))


def compare(
    old: dict, new: dict, rules: Rules, allow: tuple[str, ...]
) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """(allowed changes {key: (stored, new)}, refused keys, sorted) between `old`, the stored
    settings (`stored_settings`), and `new`, the asked ones, both flat, over the keys `new` has:
    a key that differs is refused unless it is free (Rules.is_free) or `allow` names it, and a
    MODEL one even then. A key `new` lacks is not the command's any more (removed since, or
    another family's, whose `family` then differs)."""
    differ = sorted(k for k in new if old.get(k) != new[k] and not rules.is_free(k))
    changes = {
        k: (old.get(k), new[k])
        for k in differ
        if k in allow and schema.resume_rule(k, rules.keys) != schema.MODEL
    }
    return changes, [k for k in differ if k not in changes]


def claim_workdir(workdir: str, kind: str, command: str):
    """The workdir, whose claim's checks the plan asked, locked by process 0 for the run
    (workdir.hold); every process agrees before going on."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax
    import numpy as np

    error, held = None, workdir_lib.Claim(workdir, kind)  # the other processes hold no lock
    try:
        if jax.process_index() == 0:
            held = workdir_lib.hold(workdir, kind, command=command)
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


def record_changes(workdir: str, step: int, changes: dict, config: dict) -> None:
    """Appends the allowed `changes` ({key: (from, to)}) at `step` to config_changes.jsonl and
    rewrites config.json with `config`, the settings the run goes on with (process 0 only)."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    if jax.process_index() != 0:
        return
    shown = {k: {"from": a, "to": b} for k, (a, b) in changes.items()}
    append_change(workdir, {"step": step, "changes": shown})
    write_json(paths.join(workdir, filenames.CONFIG_FILE), config)
