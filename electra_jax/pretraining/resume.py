"""What a pre-training run continues from: the one resume plan (run/rerun.py) with pre-training's
rules (PRETRAINING), asked once before any work: `plan(config, workdir, allow)`.

The command line plans without the claim, before it imports jax (bad settings and a workdir a
resume refuses are answered in a blink); the runner then claims the workdir (rerun.take) and
asks again only what another process may have changed before the lock.

A workdir with checkpoints is resumed with the model it was trained with and, but for the settings
a resume may change freely (Key.resume in config/pretrain_keys.py) and those allowed (train's
--allow_change), the settings it was started with; the allowed changes are recorded in
config_changes.jsonl. A workdir with checkpoints whose config.json is gone is refused: its settings
are unknown, and resuming with the command line's would change the run without a word;
`--allow_change=config.json` says to resume with them all the same (the checkpoints' shapes are
still checked at the restore), and the run writes its config.json again. A run started before a
setting existed keeps what it meant then (Key.absent: its checkpoints' layer layout, no held-out
slice). A new run may start from train.init_from's weights (`start_from`, loaded by the runner).

The prepared data must be the run's too (CORPUS, the run's record of its inputs):
WORKDIR/data_record.json records what the rows of a run depend on (shards.key_fields: the corpus's
content key, the tokenizer's fingerprint, the row format, ...) and the corpus's files, written
when the run starts. A resume compares them before anything is prepared (`check_corpus`): a corpus
that changed under the same data.source (a file added to a text: folder, one edited or removed) or
another tokenizer is refused in one line saying what changed, unless --allow_change names it
(data.source; data.tokenizer), which is recorded in config_changes.jsonl. A run started before the
record resumes as it did, and gets one. A corpus gone since (a text: glob that matches no file) is
stood in for by the shards the record proves to be its rows (`prepared_data`), with one line.

A resume never rewrites the run's past (`check_step`, before any work and again for the
checkpoint restored): an allowed change that moves a phase switch across the resumed step
(PHASE_SWITCHES) is refused, and so is train.num_steps below it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_collections

from electra_jax.config import pretrain_keys, schema
from electra_jax.data import mixture, shards, sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import ConfigError, DataError
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.run.rerun import MISSING_CONFIG
from electra_jax.store import checkpoint_steps, filenames, jsonio, paths
from electra_jax.store.jsonio import write_json

if TYPE_CHECKING:
    from electra_jax.store import checkpointing

# jax, orbax and the metrics (which import them) are imported where they are used: the plan, the
# refusals of a resume, is asked by the command line before it imports them.

_KEY_NAMES = frozenset(k.name for k in pretrain_keys.KEYS)


def _data_allow(field: str) -> str:
    """The --allow_change key that lets the data record's `field` differ on a resume: the config
    key of its name ('seq_length': data.seq_length, 'seed'), of its stem ('tokenizer_fingerprint':
    data.tokenizer), else data.source (the corpus: its content key, the row format). The config
    keys among them are refused earlier, by the plan, unless allowed."""
    stem = field.removesuffix("_fingerprint")
    for name in (f"data.{field}", field, f"data.{stem}"):
        if name in _KEY_NAMES:
            return name
    return "data.source"


class CorpusRecord(rerun.InputsRecord):
    """Pre-training's record of its inputs, WORKDIR/data_record.json: {"format": 1, "fields":
    shards.key_fields (what the rows depend on: held to), "files": the corpus's files (to say
    what changed)}."""

    def read(self, run: rerun.Resume) -> dict | None:
        path = os.path.join(run.workdir, workdir_lib.DATA_RECORD)
        return _read_data_record(path) if run.resumes else None

    def fields(self, record: dict) -> dict:
        return record["fields"]

    def allow_key(self, field: str) -> str:
        return _data_allow(field)

    def refusal(self, run: rerun.Resume, recorded: dict, now: dict, refused: list[str]) -> str:
        keys = sorted({_data_allow(k) for k in refused})
        path = os.path.join(run.workdir, workdir_lib.DATA_RECORD)
        return (
            f"resuming {run.workdir}: {_data_changes(refused, recorded, now, run.config)} "
            f"since the run started ({path}), so it would go on training on other rows "
            "without a word: restore them as they were, or pass "
            f"--allow_change={','.join(keys)} to go on with these from the resumed step "
            "(recorded in config_changes.jsonl), or use a new --workdir"
        )


CORPUS = CorpusRecord()


def check_corpus(run: rerun.Resume, tokenizer):
    """Before any data is prepared (process 0): ConfigError when a resumed run's corpus or
    tokenizer is not what it started from (data_record.json) and --allow_change does not name
    the change (Resume.hold_inputs). `tokenizer`: the run's, as shards.ensure_tokenizer gives it.
    Returns the prepared data that stands in for a corpus gone since the run started (the
    shards the record proves, with one line), else None."""
    cfg = run.config
    try:
        now = {
            "format": 1,
            "fields": shards.key_fields(cfg.data, tokenizer, cfg.seed),
            "files": mixture.corpus_files(cfg.data),
            **shards.mixture_record(cfg.data, tokenizer, cfg.seed),
        }
    except sources.SourceAbsent as e:
        stored = CORPUS.read(run)
        if stored is None:
            raise
        # The corpus is gone: the shards the record names stand in for it, once proven.
        recorded = _recorded_shards(cfg, run.workdir, tokenizer, stored, e)
        _log(_standing_in(cfg, recorded))
        return recorded
    run.hold_inputs(now)
    return None


def _log(line: str) -> None:
    """metrics.log: the run's log line."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.pretraining import metrics

    metrics.log(line)


class Pretraining(rerun.Rules):
    """Pre-training's rerun: only checkpoints say the workdir holds a run (a config.json without
    them is a start that is written over); a config.json gone may be named by --allow_change."""

    kind = workdir_lib.PRETRAIN
    command = "electra_jax.train"
    keys = pretrain_keys.KEYS
    record = CORPUS
    may_lose_config = True

    def read_stored(self, path: str) -> dict:
        """WORKDIR/config.json as a dict; ConfigError when unreadable or not a run's."""
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
                f"{path} is not the config of an electra_jax run (no model and generator "
                "sections); restore it from a copy, or delete it to resume with the current "
                "settings"
            )
        return stored

    def without_config(self, workdir: str, resumes: bool, allow: tuple[str, ...]) -> None:
        """ConfigError when the workdir holds checkpoints but no config.json, unless
        --allow_change names it (MISSING_CONFIG)."""
        if resumes and MISSING_CONFIG not in allow:
            raise ConfigError(
                f"{os.path.join(workdir, filenames.CONFIG_FILE)} is missing, but "
                f"{checkpoint_steps.checkpoint_dir(workdir)} holds the run's checkpoints: the "
                "settings it was started with are unknown, so it is not resumed with this "
                "command's without a word; put config.json back (from a copy), or pass "
                f"--allow_change={MISSING_CONFIG} to resume with this command's settings (the "
                "checkpoints' shapes are still checked), or use a new --workdir"
            )

    def keep(self, old: dict, new: dict, say: Callable[[str], None]) -> dict:
        """The stored checkpoints' layer layout (a run started before model.scan_layers existed
        holds them unrolled), and for a run started before the held-out slice, training on every
        row. The layout is how the parameters are stored, not what they compute, so a resume
        keeps the checkpoints' own rather than refusing or rewriting them."""
        kept = {}
        layout = stored_scan_layers(old)
        if bool(new.get("model.scan_layers", False)) != layout:
            kept["model.scan_layers"] = layout
            held = "stacked (scanned)" if layout else "unrolled"
            say(
                f"this run's checkpoints hold their layers {held}; resuming with "
                f"model.scan_layers={layout}"
            )
        if "data.heldout_examples" not in old and new.get("data.heldout_examples"):
            # Holding rows out now would change the rows it trains on: it keeps training on all.
            kept["data.heldout_examples"] = 0
            say(
                "this run started before the held-out slice existed and trains on every row; "
                "resuming with data.heldout_examples=0 (no held-out evaluation; "
                "python -m electra_jax.evaluate reads its checkpoints on rows it has seen)"
            )
        return kept

    def refusal(self, run: rerun.Resume, old: dict, new: dict, refused: list[str]) -> str:
        # The model first: its settings cannot change (a new --workdir), whatever is allowed.
        model = [k for k in refused if schema.resume_rule(k, self.keys) == schema.MODEL]
        if model:
            return (
                f"{run.config_path} describes a different model than the one asked for: "
                f"{_shown(model, old, new)}; "
                "to resume, run with the same settings; to train this model, use a new --workdir"
            )
        return (
            f"resuming with other settings than {run.config_path}: {_shown(refused, old, new)}; "
            "run with the stored settings to continue exactly, or pass --allow_change="
            f"{','.join(refused)} to change them from this step on (recorded in "
            "config_changes.jsonl), or use a new --workdir"
        )

    def settle(self, run: rerun.Resume) -> None:
        if run.resumes:  # the newest checkpoint; the restore checks the one it resumes from
            check_step(run, run.newest)

    def write(self, run: rerun.Resume, step: int | None) -> None:
        """For a new run (`step` None) config.json; for a resumed one the allowed changes
        (config_changes.jsonl and config.json), or a config.json that was missing; then the data
        record and the command line (process 0)."""
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        import jax

        if jax.process_index() != 0:
            return
        config_path = run.config_path
        if step is None:
            write_json(config_path, run.config.to_dict())
        elif run.changes:
            rerun.record_changes(run.workdir, step, run.changes, run.config.to_dict())
            shown = ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in run.changes.items())
            _log(f"resuming at step {step} with changed settings: {shown}")
        elif not paths.exists(config_path):
            # Only with --allow_change=config.json (the plan refuses a resume without it).
            write_json(config_path, run.config.to_dict())
            row = {"step": step, "changes": {}, filenames.CONFIG_FILE: "missing, written again"}
            rerun.append_change(run.workdir, row)
            _log(
                "warning: config.json was missing; wrote this run's settings (allowed by "
                "--allow_change=config.json; the checkpoint's shapes matched them)"
            )
        if run.inputs is not None:  # a new run, one started before the record, a change
            write_json(os.path.join(run.workdir, workdir_lib.DATA_RECORD), run.inputs)
            if step is not None and run.inputs_changes:
                shown = {k: {"from": a, "to": b} for k, (a, b) in run.inputs_changes.items()}
                rerun.append_change(run.workdir, {"step": step, "changes": {}, "data": shown})
                _log(
                    f"resuming at step {step} with changed data ({', '.join(sorted(shown))}), "
                    "as --allow_change allows"
                )
        if run.command:
            row = {"step": step or 0, "command": run.command}
            paths.append_text(
                os.path.join(run.workdir, workdir_lib.COMMANDS_FILE), json.dumps(row) + "\n"
            )


PRETRAINING = Pretraining()


def plan(
    config: ml_collections.ConfigDict,
    workdir: str,
    allow: tuple[str, ...] = (),
    command: str | None = None,
    claim: bool = True,
) -> rerun.Resume:
    """What the run of `config` (completed and checked by the caller: schema.complete,
    validate.check_config) continues from in `workdir` (rerun.plan with PRETRAINING): the config
    as it will run, the allowed changes (config keys in `allow`). `command`, the command line, is
    recorded with the step it starts at (Resume.record). Claimed for the run (rerun.take) unless
    `claim` is False: the command line's plan, before it imports jax; the runner claims it.

    Raises ConfigError (the workdir is another run's, or in use; a setting the resume may not
    change) or CheckpointError (only damaged checkpoints), the workdir released again.
    """
    planned = rerun.plan(PRETRAINING, config, workdir, allow, command)
    return rerun.take(planned) if claim else planned


def check_step(run: rerun.Resume, step: int) -> None:
    """ConfigError when the run, resumed at `step`, would rewrite what it did: a step switch
    moved across it (PHASE_SWITCHES), or train.num_steps below it (nothing could be trained).
    Asked by the plan of the newest checkpoint and by the restore of the one it resumes from."""
    num_steps = run.config.train.num_steps
    if num_steps < step:
        raise ConfigError(
            f"train.num_steps={num_steps} is below step {step}, where the run in "
            f"{run.workdir} is (checkpoint {step}): nothing would be trained, and a run "
            f"is not shortened after the fact; set train.num_steps above {step} to go on, "
            "or use a new --workdir for a shorter run"
        )
    for key, (old, new) in run.changes.items():
        _check_phase_switch(key, old, new, step, run.config)


def start_from(run: rerun.Resume):
    """train.init_from's weights (a `pretrained.Pretrained`) for a new run, its tokenizer put in
    the workdir (load_init_from); None for a resumed run, which goes on from its own state, or
    without init_from."""
    if run.resumes or not run.config.train.init_from:
        return None
    return load_init_from(run.config, run.workdir)


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
    in `check_corpus`) and for `evaluate`, which reads the held-out rows of a run's
    shards."""
    directory = cache_dir(config, workdir)
    if config.data.mixture:  # each part's shards; a part gone has no stand-in
        return shards.prepare_mixture(
            config.data, tokenizer, directory, config.seed, num_workers=num_workers
        )
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


def _data_changes(keys: list[str], stored: dict, now: dict, cfg) -> str:
    """What changed in the data records' `keys` (fields), in words."""
    parts = []
    for key in keys:
        old, new = stored["fields"].get(key), now["fields"][key]
        if key == "source_fingerprint":
            parts.append(_corpus_change(stored.get("files"), now.get("files"), cfg.data.source))
        elif key == "mixture_fingerprint":
            files = stored.get("files"), now.get("files")
            parts.append(_corpus_change(*files, cfg.data.mixture, key="data.mixture"))
        elif key == "tokenizer_fingerprint":
            parts.append("the tokenizer is another than the one the run started with")
        elif key == "format":
            parts.append(f"the prepared rows' format is {new!r} in this version, {old!r} there")
        else:
            parts.append(f"{key} is {new!r} now, {old!r} there")
    return "; ".join(parts)


def _corpus_change(
    old: list | None, new: list | None, source: str, key: str = "data.source"
) -> str:
    """The files added, removed or resized under data.source (`key`), or what is known."""
    where = f"the corpus under {key} '{source}' changed"
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
