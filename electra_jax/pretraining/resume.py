"""What a run continues from, asked once before any work: `plan(config, workdir, allow)`.

The command line plans without the claim, before it imports jax (bad settings and a workdir a
resume refuses are answered in a blink); the runner then claims the workdir (`take`) and asks
again only what another process may have changed before the lock.

A workdir with checkpoints is resumed with the model it was trained with and, but for the settings
a resume may change freely (Key.resume in config/pretrain_keys.py) and those allowed (train's
--allow_change), the settings it was started with; the allowed changes are recorded in
config_changes.jsonl. A workdir with checkpoints whose config.json is gone is refused: its settings
are unknown, and resuming with the command line's would change the run without a word;
`--allow_change=config.json` says to resume with them all the same (the checkpoints' shapes are
still checked at the restore), and the run writes its config.json again. A run started before a
setting existed keeps what it meant then (Key.absent: its checkpoints' layer layout, no held-out
slice). A new run may start from train.init_from's weights. The workdir is claimed (workdir.claim)
for the whole run. The claim, the checkpoints' survey, the stored config.json against the new
settings by a rule table (PRETRAINING) and the record of the allowed changes are rerun.py's,
which fine-tuning's resume shares; this module adds pre-training's own on top.

The prepared data must be the run's too: WORKDIR/data_record.json records what the rows of a
run depend on (shards.key_fields: the corpus's content key, the tokenizer's fingerprint, the
row format, ...) and the corpus's files, written when the run starts. A resume compares them
before anything is prepared: a corpus that changed under the same data.source (a file added to
a text: folder, one edited or removed) or another tokenizer is refused in one line saying what
changed, unless --allow_change names it (data.source; data.tokenizer), which is recorded in
config_changes.jsonl. A run started before the record resumes as it did, and gets one. A corpus
gone since (a text: glob that matches no file) is stood in for by the shards the record proves to
be its rows (`prepared_data`), with one line.

A resume never rewrites the run's past (`Resume.check_step`, before any work and again for the
checkpoint restored): an allowed change that moves a phase switch across the resumed step
(PHASE_SWITCHES) is refused, and so is train.num_steps below it; checkpoints/ entries that orbax
would take for steps but are not the run's (an export put there, a checkpoint renamed by hand)
are refused by checkpoint_steps.survey.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ml_collections

from electra_jax.config import pretrain_keys, schema
from electra_jax.config.schema import flatten
from electra_jax.data import shards, sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import ConfigError, DataError
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.run.rerun import MISSING_CONFIG
from electra_jax.store import checkpoint_steps, filenames, jsonio, paths
from electra_jax.store.jsonio import write_json

if TYPE_CHECKING:
    from electra_jax.store import checkpointing

# jax, orbax and the metrics (which import them) are imported where they are used: `plan`
# without the claim, the refusals of a resume, is asked by the command line before it imports them.

_KEY_NAMES = frozenset(k.name for k in pretrain_keys.KEYS)


def _data_allow(field: str) -> str:
    """The --allow_change key that lets the data record's `field` differ on a resume: the config
    key of its name ('seq_length': data.seq_length, 'seed'), of its stem ('tokenizer_fingerprint':
    data.tokenizer), else data.source (the corpus: its content key, the row format). The config
    keys among them are refused earlier, by check_same_run, unless allowed."""
    stem = field.removesuffix("_fingerprint")
    for name in (f"data.{field}", field, f"data.{stem}"):
        if name in _KEY_NAMES:
            return name
    return "data.source"


@dataclasses.dataclass
class Resume:
    """The answer of `plan`: what the run continues from."""

    workdir: str
    # The config as it runs: the stored run's layer layout and held-out slice kept.
    config: ml_collections.ConfigDict
    changes: dict[str, tuple[Any, Any]]  # allowed changes since config.json: {key: (old, new)}
    init_from: Any  # train.init_from's weights (pretrained.Pretrained) for a new run, else None
    claim: Any  # workdir.Claim: the workdir, locked by process 0 until `release`; None: unclaimed
    resumes: bool = False  # the workdir holds checkpoints
    allow: tuple[str, ...] = ()  # --allow_change
    command: str | None = None  # the command line, for workdir.COMMANDS_FILE (None: the API's)
    # The data record to write at `record` (None: the one there stands), and its allowed
    # changes, {field: (recorded, now)}.
    data: dict | None = None
    data_changes: dict = dataclasses.field(default_factory=dict)
    # The prepared data (prepare.PreparedData) that stands in for a corpus gone since the run
    # started, found by `check_data`; None when the corpus is there.
    recorded: Any = None
    # What `plan` saw, for `take` to ask again only what changed since: the config as asked
    # (completed), config.json (None: absent or not read), the lines of what is kept not yet
    # logged (plan without the claim logs nothing).
    asked: ml_collections.ConfigDict | None = None
    stored: dict | None = None
    said: list[str] = dataclasses.field(default_factory=list)

    def check_data(self, tokenizer) -> None:
        """Before any data is prepared (process 0): ConfigError when a resumed run's corpus or
        tokenizer is not what it started from (data_record.json) and --allow_change does not name
        the change. `tokenizer`: the run's, as shards.ensure_tokenizer gives it."""
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        from electra_jax.pretraining import metrics

        cfg = self.config
        path = os.path.join(self.workdir, workdir_lib.DATA_RECORD)
        stored = _read_data_record(path) if self.resumes else None
        try:
            now = {
                "format": 1,
                "fields": shards.key_fields(cfg.data, tokenizer, cfg.seed),
                "files": sources.from_config(cfg.data).files(),
            }
        except sources.SourceAbsent as e:
            if stored is None:
                raise
            # The corpus is gone: the shards the record names stand in for it, once proven.
            self.recorded = _recorded_shards(cfg, self.workdir, tokenizer, stored, e)
            metrics.log(_standing_in(cfg, self.recorded))
            self.data = None
            return
        self.data = now
        if stored is None:  # a new run, or one started before the record: it gets one
            return
        old = stored["fields"]
        differ = {k: (old.get(k), v) for k, v in now["fields"].items() if old.get(k) != v}
        if not differ:
            self.data = None
            return
        refused = [k for k in differ if _data_allow(k) not in self.allow]
        if refused:
            keys = sorted({_data_allow(k) for k in refused})
            raise ConfigError(
                f"resuming {self.workdir}: {_data_changes(refused, differ, stored, now, cfg)} "
                f"since the run started ({path}), so it would go on training on other rows "
                "without a word: restore them as they were, or pass "
                f"--allow_change={','.join(keys)} to go on with these from the resumed step "
                "(recorded in config_changes.jsonl), or use a new --workdir"
            )
        self.data_changes = differ

    def record(self, resumed_at: int | None) -> None:
        """Once the state is restored (`resumed_at`: its step; None for a new run), writes what
        the run goes on with (process 0): config.json for a new run; for a resumed one, the
        allowed changes (config_changes.jsonl and config.json), or a config.json that was
        missing."""
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        import jax

        from electra_jax.pretraining import metrics

        config_path = os.path.join(self.workdir, filenames.CONFIG_FILE)
        is_main = jax.process_index() == 0
        if resumed_at is None:
            if is_main:
                write_json(config_path, self.config.to_dict())
        elif self.changes:
            if is_main:
                rerun.record_changes(self.workdir, resumed_at, self.changes, self.config.to_dict())
                shown = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in self.changes.items())
                metrics.log(f"resuming at step {resumed_at} with changed settings: {shown}")
        elif is_main and not paths.exists(config_path):
            # Only with --allow_change=config.json (plan refuses a resume without it).
            write_json(config_path, self.config.to_dict())
            row = {
                "step": resumed_at,
                "changes": {},
                filenames.CONFIG_FILE: "missing, written again",
            }
            rerun.append_change(self.workdir, row)
            metrics.log(
                "warning: config.json was missing; wrote this run's settings (allowed by "
                "--allow_change=config.json; the checkpoint's shapes matched them)"
            )
        if is_main:
            self._record_data(resumed_at)
            if self.command:
                row = {"step": resumed_at or 0, "command": self.command}
                paths.append_text(
                    os.path.join(self.workdir, workdir_lib.COMMANDS_FILE), json.dumps(row) + "\n"
                )

    def _record_data(self, resumed_at: int | None) -> None:
        """data_record.json for a new run, a run started before it, or an allowed change (which
        config_changes.jsonl records too)."""
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        from electra_jax.pretraining import metrics

        if self.data is None:
            return
        write_json(os.path.join(self.workdir, workdir_lib.DATA_RECORD), self.data)
        if resumed_at is None or not self.data_changes:
            return
        shown = {k: {"from": a, "to": b} for k, (a, b) in self.data_changes.items()}
        rerun.append_change(self.workdir, {"step": resumed_at, "changes": {}, "data": shown})
        metrics.log(
            f"resuming at step {resumed_at} with changed data ({', '.join(sorted(shown))}), "
            "as --allow_change allows"
        )

    def check_step(self, step: int) -> None:
        """ConfigError when the run, resumed at `step`, would rewrite what it did: a step
        switch moved across it (PHASE_SWITCHES), or train.num_steps below it (nothing could be
        trained). Asked by `plan` of the newest checkpoint and by the restore of the one it
        resumes from."""
        num_steps = self.config.train.num_steps
        if num_steps < step:
            raise ConfigError(
                f"train.num_steps={num_steps} is below step {step}, where the run in "
                f"{self.workdir} is (checkpoint {step}): nothing would be trained, and a run "
                f"is not shortened after the fact; set train.num_steps above {step} to go on, "
                "or use a new --workdir for a shorter run"
            )
        for key, (old, new) in self.changes.items():
            _check_phase_switch(key, old, new, step, self.config)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()


# Settings that name the step at which a run passes, once, from one phase to the next, with the
# objective that has them and its phases. The update of step s (s updates done) is in the second
# phase when s >= the switch, so a run resumed at step R has passed the switch when it is below
# R. --allow_change may move a switch that is still ahead, or one already behind (nothing
# changes then); moved across R, it would send the run back into a phase it has left (two_stage
# training the generator alone again, then copying it over the trained discriminator again), or
# past a switch it never made (two_stage never copying the generator at all).
PHASE_SWITCHES = {
    "objective.two_stage_steps": (
        "two_stage",
        "the generator alone, then the discriminator started from the generator's weights",
    ),
    "objective.mle_warmup_steps": (
        "adversarial",
        "the generator's maximum-likelihood warm start, then the policy gradient",
    ),
}


def _check_phase_switch(key: str, old, new, step: int, config) -> None:
    """ConfigError when an allowed change of a PHASE_SWITCHES key moves the switch across
    `step`, where the run resumes."""
    if key not in PHASE_SWITCHES or config.objective.name != PHASE_SWITCHES[key][0]:
        return
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (old, new)):
        return  # validate.check_config has refused a switch that is not a step
    if (old < step) == (new < step):
        return
    phases = PHASE_SWITCHES[key][1]
    if old < step:
        what = (
            f"the run, at step {step}, passed its switch at step {old}; at {new} it would go "
            "back into the first phase and make the switch again"
        )
        way = f"keep it below {step} (the switch stays behind the run)"
    else:
        what = (
            f"the run, at step {step}, has not reached its switch at step {old}; at {new} the "
            "switch would lie behind the run without having been made"
        )
        way = f"set it to {step} to switch at the next step, or later"
    raise ConfigError(
        f"--allow_change={key}: {key}={new} would rewrite the run's phases ({phases}): {what}; "
        f"{way}, or use a new --workdir"
    )


def plan(
    config: ml_collections.ConfigDict,
    workdir: str,
    allow: tuple[str, ...] = (),
    command: str | None = None,
    claim: bool = True,
) -> Resume:
    """Claims the workdir and answers what the run continues from: the config (completed and
    checked by the caller: schema.complete, validate.check_config) as it will run, the allowed
    changes (config keys in `allow`), train.init_from's weights. `command`, the command line, is
    recorded with the step it starts at (`Resume.record`).

    With `claim` False, the same answer without jax, the lock, a log line or init_from's weights
    (Resume.claim None): what the command line asks before it imports jax; the runner then
    claims it (`take`), asking again only what another process may have changed meanwhile. With
    `claim`, the two at once.

    Raises ConfigError (the workdir is another run's, or in use; a setting the resume may not
    change; init_from unusable) or CheckpointError (only damaged checkpoints), the workdir
    released again.
    """
    new = flatten(config.to_dict())  # the settings asked for, {"a.b": value}, read once
    allow = tuple(allow)
    opened = rerun.open_run(workdir, PRETRAINING, allow, new, claim=False)
    planned = _settled(config, new, opened, allow, command, log=None)
    return take(planned) if claim else planned


def take(planned: Resume) -> Resume:
    """The Resume `plan` answered without the claim, its workdir now claimed for the run.

    Only what another process may have changed before the lock is asked again: the checkpoints
    (surveyed again) and config.json; when they are as `planned` saw them, its answer stands
    (the newest checkpoint's step checked again), else the plan is settled anew. Then the lines
    of what is kept are logged and init_from's weights loaded. Raises as `plan` does, the
    workdir released again.
    """
    new = flatten(planned.asked.to_dict())
    opened = rerun.open_run(planned.workdir, PRETRAINING, planned.allow, new)
    try:
        if (opened.resumes, opened.stored) != (planned.resumes, planned.stored):
            run = _settled(planned.asked, new, opened, planned.allow, planned.command, _log)
        else:
            run = dataclasses.replace(planned, claim=opened.claim, said=[])
            for line in planned.said:
                _log(line)
            _check_newest(run)
        _load_init_from(run)
    except BaseException:
        opened.release()
        raise
    return run


def _log(line: str) -> None:
    """metrics.log: the run's log line."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.pretraining import metrics

    metrics.log(line)


def _load_init_from(run: Resume) -> None:
    """train.init_from's weights for a new run (a resumed one goes on from its own)."""
    if not run.resumes and run.config.train.init_from:
        run.init_from = load_init_from(run.config, run.workdir)


def _settled(config, new: dict, opened: rerun.Rerun, allow, command, log) -> Resume:
    """The Resume of an opened workdir (`config`: as asked, completed; `new`: it flat): the
    stored run's layout kept, its settings held to the new ones, the newest checkpoint's step
    checked. `log`: gets the lines of what is kept (None: they wait in Resume.said)."""
    asked, said = config, []
    changes = {}
    if opened.stored is not None:
        old = flatten(opened.stored)
        kept = _checkpoint_layout(old, new, log or said.append)
        if kept:
            new.update(kept)
            config = config.copy_and_resolve_references()
            with config.unlocked():
                for key, value in kept.items():
                    section, field = key.split(".")
                    config[section][field] = value
        check_same_model(old, new, opened.config_path)
        changes = check_same_run(old, new, opened.config_path, allow)
    workdir, resumes = opened.workdir, opened.resumes
    run = Resume(workdir, config, changes, None, opened.claim, resumes, allow, command)
    run.asked, run.stored, run.said = asked, opened.stored, said
    _check_newest(run)
    return run


def _check_newest(run: Resume) -> None:
    """Resume.check_step of the newest checkpoint (the restore checks the one it resumes from
    again)."""
    if run.resumes:
        run.check_step(checkpoint_steps.saved_steps(run.workdir)[-1])


def cache_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
    """Where a run's prepared data is: data.cache_dir, by default WORKDIR/data."""
    return config.data.cache_dir or paths.join(workdir, filenames.DATA_DIR)


def prepared_data(
    config: ml_collections.ConfigDict,
    workdir: str,
    tokenizer,
    num_workers: int | None = None,
    log=None,
):
    """The run's prepared data (shards.PreparedData): shards.prepare's (made, or reused by its
    content key), or, when data.source matches no files any more (sources.SourceAbsent), the
    shards that WORKDIR's data record proves complete and unchanged, with one line to `log`
    (when given); ConfigError when it does not. For every process of a run (process 0 says so
    in `Resume.check_data`) and for `evaluate`, which reads the held-out rows of a run's
    shards."""
    directory = cache_dir(config, workdir)
    try:
        return shards.prepare(
            config.data, tokenizer, directory, config.seed, num_workers=num_workers
        )
    except sources.SourceAbsent as e:
        stored = _read_data_record(os.path.join(workdir, workdir_lib.DATA_RECORD))
        if stored is None:
            raise
        prepared = _recorded_shards(config, workdir, tokenizer, stored, e)
        if log is not None:
            log(_standing_in(config, prepared))
        return prepared


def _standing_in(config, prepared) -> str:
    """The line that says the recorded shards stand in for an absent corpus."""
    return (
        f"data.source '{config.data.source}' matches no files now; reading the shards prepared "
        f"from it ({prepared.directory}, {prepared.num_examples:,} rows), which "
        f"{workdir_lib.DATA_RECORD} proves complete and unchanged"
    )


def _recorded_shards(config, workdir: str, tokenizer, stored: dict, absent: Exception):
    """The prepared data of the rows `stored` (the data record) describes
    (shards.recorded); ConfigError naming the record and what fails when it is not proven."""
    try:
        return shards.recorded(
            config.data, tokenizer, cache_dir(config, workdir), config.seed, stored["fields"]
        )
    except DataError as e:
        raise ConfigError(
            f"data.source '{config.data.source}' matches no files, and the prepared shards "
            f"that {os.path.join(workdir, workdir_lib.DATA_RECORD)} records cannot stand in for "
            f"it ({e}); "
            "put the corpus back where data.source says, or point data.source at where it is "
            "now with --allow_change=data.source"
        ) from absent


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


def _read_data_record(path: str) -> dict | None:
    """data_record.json as written (a dict with a fields object); None when missing; ConfigError
    when unreadable."""
    if not paths.exists(path):
        return None
    try:
        record = jsonio.loads(paths.read_bytes(path))
    except (OSError, ValueError) as e:
        record = " ".join(str(e).split())
    if not isinstance(record, dict) or not isinstance(record.get("fields"), dict):
        raise ConfigError(
            f"{path} cannot be read ({record if isinstance(record, str) else 'no fields'}); "
            "restore it from a copy, or delete it to resume without checking that the corpus "
            "is the one the run started from (a new record is written)"
        )
    return record


def _few(names: list[str]) -> str:
    shown = ", ".join(os.path.basename(n) for n in names[:3])
    return shown + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")


def _data_changes(keys: list[str], differ: dict, stored: dict, now: dict, cfg) -> str:
    """What changed in the data record's `keys`, in words."""
    parts = []
    for key in keys:
        old, new = differ[key]
        if key == "source_fingerprint":
            parts.append(_corpus_change(stored.get("files"), now.get("files"), cfg.data.source))
        elif key == "tokenizer_fingerprint":
            parts.append("the tokenizer is another than the one the run started with")
        elif key == "format":
            parts.append(f"the prepared rows' format is {new!r} in this version, {old!r} there")
        else:
            parts.append(f"{key} is {new!r} now, {old!r} there")
    return "; ".join(parts)


def _corpus_change(old: list | None, new: list | None, source: str) -> str:
    """The files added, removed or resized under data.source, or what is known."""
    where = f"the corpus under data.source '{source}' changed"
    if old is None or new is None:
        return f"{where} (its content key is not the one recorded)"
    before, after = dict(map(tuple, old)), dict(map(tuple, new))
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    resized = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    said = [
        f"{what} {_few(names)}"
        for what, names in (("files added:", added), ("removed:", removed), ("resized:", resized))
        if names
    ]
    if not said:
        said = ["its files' modification times changed (same names and sizes: edited, or copied"]
        said[0] += " without their times)"
    return f"{where}: {', '.join(said)}"


def _checkpoint_layout(old: dict, new: dict, log: Callable[[str], None] | None) -> dict:
    """The settings a resume keeps from the stored run (`old`, flat) over the asked ones (`new`,
    flat): the stored checkpoints' layer layout (a run started before model.scan_layers existed
    holds them unrolled), and for a run started before the held-out slice, training on every
    row. {key: value}, {} when nothing is kept.

    The layout is how the parameters are stored, not what they compute, so a resume keeps the
    checkpoints' own rather than refusing or rewriting them. `log` (when given) gets a line for
    each.
    """
    log = log or (lambda line: None)
    kept = {}
    layout = stored_scan_layers(old)
    if bool(new.get("model.scan_layers", False)) != layout:
        kept["model.scan_layers"] = layout
        held = "stacked (scanned)" if layout else "unrolled"
        log(
            f"this run's checkpoints hold their layers {held}; resuming with "
            f"model.scan_layers={layout}"
        )
    if "data.heldout_examples" not in old and new.get("data.heldout_examples"):
        # Holding rows out now would change the rows it trains on: it keeps training on all.
        kept["data.heldout_examples"] = 0
        log(
            "this run started before the held-out slice existed and trains on every row; "
            "resuming with data.heldout_examples=0 (no held-out evaluation; "
            "python -m electra_jax.evaluate reads its checkpoints on rows it has seen)"
        )
    return kept


def load_init_from(config: ml_collections.ConfigDict, workdir: str):
    """train.init_from's weights (a `pretrained.Pretrained`), its tokenizer put in the workdir.

    For a run without checkpoints (a resumed run continues from its own state), and for
    `prepare` of such a run, so that the data is tokenized with the tokenizer of the weights.
    Weights and their tokenizer come from one source: a workdir whose tokenizer/ already holds
    another tokenizer (one `prepare` trained, or an earlier start's) is refused, naming both;
    the same tokenizer is left as it is.

    Raises:
      ConfigError: init_from unusable; data.tokenizer given beside it; another tokenizer in the
        workdir. Nothing in the workdir is changed.
    """
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
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
    _place_tokenizer(loaded.tokenizer, f"train.init_from={path}", workdir)
    return loaded


def _place_tokenizer(tok, source: str, workdir: str) -> None:
    """Puts `tok` (the tokenizer of the weights `source` names) in WORKDIR/tokenizer, unless that
    very tokenizer is there; ConfigError when another one is."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    folder = os.path.join(workdir, filenames.TOKENIZER_DIR)
    if tokenizer_lib.has_saved(folder):
        try:
            there = tokenizer_lib.load_saved(folder)
        except DataError as e:
            raise ConfigError(str(e)) from None
        if there.fingerprint != tok.fingerprint:
            raise ConfigError(
                f"{folder} holds a tokenizer ({tokenizer_lib.describe(there)}) other than the one "
                f"{source} was trained with ({tokenizer_lib.describe(tok)}), and its weights work "
                f"only with their own: use a new --workdir, or delete {folder} (and the data "
                "prepared with it) so that the run takes init_from's (prepare given the same "
                "train.init_from places it), or unset train.init_from"
            )
        return
    if jax.process_index() == 0:
        tok.save(folder)


def mismatch_message(e: checkpointing.CheckpointMismatch, workdir: str) -> str:
    """One line for a checkpoint of another model or optimizer, naming the settings involved."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.store import checkpointing

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
        f"checkpoint {e.step} in {checkpoint_steps.checkpoint_dir(workdir)} holds another state "
        f"than this config describes, in {settings}: {checkpointing.shown(e.differences)}; "
        "nothing was moved aside: resume with the settings the run was started with, or use a "
        "new --workdir"
    )


def stored_scan_layers(old: dict) -> bool:
    """The layer layout of a stored run's settings (config.json, flat): model.scan_layers, or
    what its absence means (schema.Key.absent: unrolled)."""
    key = schema.by_name(pretrain_keys.KEYS)["model.scan_layers"]
    return bool(old.get(key.name, key.when_absent))


def _shown(keys: list[str], old: dict, new: dict) -> str:
    """The first four differing settings, stored value against new, and how many more."""
    shown = ", ".join(f"{k}={old.get(k)!r} there vs {new.get(k)!r} now" for k in keys[:4])
    return shown + (f" (and {len(keys) - 4} more)" if len(keys) > 4 else "")


def check_same_model(old: dict, new: dict, config_path: str) -> None:
    """Raises ConfigError when a workdir's stored settings describe another model than the new.

    old: the workdir's config.json, new: the settings asked for, both flat ({"a.b": value},
    schema.flatten). Compares the keys that fix the parameters (Key.resume MODEL: model.* but
    model.dtype, the compute type only; generator.*; data.vocab_size, data.seq_length,
    objective.name), so that a resume with other sizes fails here in one line instead of as a
    shape error deep inside the restore.
    """
    # Keys added since a run was stored mean there what their Key.absent declares; another key
    # missing there counts as different (None there), as a damaged config.json may lack it.
    old = flatten(schema.upgrade(_nested(old), pretrain_keys.KEYS, declared_only=True))

    def is_model_key(key: str) -> bool:
        return schema.resume_rule(key, pretrain_keys.KEYS) == schema.MODEL

    keys = sorted(k for k in set(old) | set(new) if is_model_key(k))
    differ = [k for k in keys if old.get(k) != new.get(k)]
    if differ:
        raise ConfigError(
            f"{config_path} describes a different model than the one asked for: "
            f"{_shown(differ, old, new)}; "
            "to resume, run with the same settings; to train this model, use a new --workdir"
        )


def _nested(flat: dict) -> dict:
    """{"a": {"b": value}} for {"a.b": value}."""
    out: dict = {}
    for key, value in flat.items():
        section, _, field = key.rpartition(".")
        (out.setdefault(section, {}) if section else out)[field] = value
    return out


def _without_config(workdir: str, resumes: bool, allow: tuple[str, ...]) -> None:
    """ConfigError when the workdir holds checkpoints but no config.json, unless --allow_change
    names it (MISSING_CONFIG)."""
    if resumes and MISSING_CONFIG not in allow:
        raise ConfigError(
            f"{os.path.join(workdir, filenames.CONFIG_FILE)} is missing, but "
            f"{checkpoint_steps.checkpoint_dir(workdir)} holds the run's checkpoints: the settings "
            "it was started with are unknown, so it is not resumed with this command's without "
            f"a word; put config.json back (from a copy), or pass --allow_change={MISSING_CONFIG} "
            "to resume with this command's settings (the checkpoints' shapes are still checked), "
            "or use a new --workdir"
        )


# Settings a resumed run may change without saying so (Key.resume FREE): how long it runs, how
# the same numbers are computed and laid out, where files go and how often they are written.
# Every other setting shapes what the run learns: a resume changing one needs --allow_change.
FREE_ON_RESUME = schema.free_on_resume(pretrain_keys.KEYS)

# Pre-training's rerun: only checkpoints say the workdir holds a run (a config.json without them
# is a start that is written over); keys added to the framework since are not compared.
PRETRAINING = rerun.Rules(
    kind=workdir_lib.PRETRAIN,
    command="electra_jax.train",
    free=FREE_ON_RESUME,
    read_stored=_read_stored_config,
    without_config=_without_config,
    may_lose_config=True,
)


def check_same_run(
    old: dict, new: dict, config_path: str, allowed: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """Raises ConfigError when the new settings change one of the stored run's that a resume
    must keep (all but Key.resume FREE ones), unless the key is in `allowed`.

    old: the workdir's config.json, new: the settings asked for, both flat. Keys the stored
    config lacks (added to the framework since) are not compared. Returns the allowed
    changes, {key: (stored value, new value)}, for the caller to record.
    """
    changes, refused = rerun.compare(old, new, PRETRAINING, allowed)
    if refused:
        raise ConfigError(
            f"resuming with other settings than {config_path}: {_shown(refused, old, new)}; "
            "run with the "
            "stored settings to continue exactly, or pass --allow_change="
            f"{','.join(refused)} to change them from this step on (recorded in "
            "config_changes.jsonl), or use a new --workdir"
        )
    return changes
