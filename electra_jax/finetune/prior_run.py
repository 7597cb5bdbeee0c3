"""What a fine-tuning workdir already holds, and whether this run may go on with it: the one
resume plan (run/rerun.py) with fine-tuning's rules (`plan`), without jax.

A fine-tuning workdir holds one run, and a config.json says it does, checkpoints or not (a run
cut short before its first checkpoint, or finished): every setting but the free ones (Key.resume
FREE in config/finetune_keys.py: how often it logs and checkpoints, how many checkpoints it
keeps) and the keys --allow_change names is refused in one line; so is a workdir of another task
or family, one whose task's labels have changed, and one that holds what a run writes once under
way without the records its start wrote. A finished run's results are answered as they are. The
records a run writes when it starts are read here (`read_model`, `read_json`; saved.py writes
them and names them for the rest of fine-tuning).
"""

from __future__ import annotations

from electra_jax.config import finetune_keys
from electra_jax.errors import ConfigError, PretrainedError
from electra_jax.finetune import checks, inputs
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames, jsonio, paths
from electra_jax.store.jsonio import json_kind, one_line

FORMAT, VERSION = "electra_jax.finetuned", 1


def read_json(path: str, what: str) -> dict:
    """A JSON object from `path`; PretrainedError naming the file otherwise."""
    try:
        value = jsonio.loads(paths.read_text(path))
    except FileNotFoundError:
        raise PretrainedError(f"{path} is missing; {what}") from None
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path} cannot be read ({one_line(e, 200)}); {what}") from None
    if not isinstance(value, dict):
        raise PretrainedError(f"{path} holds a JSON {json_kind(value)}, not an object; {what}")
    return value


def read_model(workdir: str) -> dict:
    """WORKDIR/model.json, checked to be ours."""
    path = paths.join(workdir, filenames.MODEL_FILE)
    record = read_json(path, "is this a fine-tuning workdir of this version?")
    if record.get("format") != FORMAT:
        raise PretrainedError(
            f"{path} was not written by electra_jax's fine-tuning (format "
            f"{one_line(repr(record.get('format')), 60)}); give a fine-tuning workdir"
        )
    return record


def _read(read, *args) -> dict:
    """read(*args), its PretrainedError a ConfigError (a workdir's record the run cannot use)."""
    try:
        return read(*args)
    except PretrainedError as e:
        raise ConfigError(str(e)) from None


class Finetuning(rerun.Rules):
    """Fine-tuning's rerun of `family`'s `task` (as checks.check_config gives them): a
    config.json holds a run, checkpoints or not; a config.json gone is not replaced."""

    kind = workdir_lib.FINETUNE
    command = "electra_jax.finetune"
    record = inputs.TASK_FILES
    stored_without_checkpoints = True

    def __init__(self, family: str, task):
        self.family, self.task, self.keys = family, task, finetune_keys.TABLES[family]
        self.described = checks.describe(family, task)  # what model.json records of the task

    def read_stored(self, path: str) -> dict:
        return _read(read_json, path, "restore it or use a new --workdir")

    def without_config(self, workdir: str, resumes: bool, allow: tuple[str, ...]) -> None:
        """ConfigError when WORKDIR, without its config.json, still holds a run: model.json of
        another task, or what a run writes once under way (results, weights, checkpoints). A
        start cut short (model.json of this task and the tokenizer only) is started over."""
        model_path = paths.join(workdir, filenames.MODEL_FILE)
        now = self.described["task"]
        if paths.exists(model_path):
            record = _read(read_model, workdir)
            there = record.get("task")
            if there != now or record.get("family", self.family) != self.family:
                raise ConfigError(
                    f"--workdir {workdir} holds a {record.get('family', '?')} fine-tuning of "
                    f"{there} ({model_path}), not of {now}; a workdir holds one task and one "
                    "run: choose a new --workdir"
                )
        _refuse_a_run_missing(workdir, filenames.CONFIG_FILE)

    def refusal(self, run: rerun.Resume, old: dict, new: dict, refused: list[str]) -> str:
        there = run.stored
        finished = paths.exists(paths.join(run.workdir, filenames.RESULTS_FILE))
        what = there.get("task") or (f"SQuAD {there['version']}" if "version" in there else "?")
        kind = f"a {there['family']} fine-tuning" if "family" in there else "a fine-tuning"
        if "family" not in there:
            kind += " of an earlier version"
        first = refused[0]
        shown = f"{first} is {new.get(first)!r} now, {old.get(first)!r} there"
        more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
        return (
            f"--workdir {run.workdir} holds {'the finished' if finished else 'the unfinished'} "
            f"{kind.removeprefix('a ')} of {what}, and this run differs ({shown}{more}); "
            "a workdir holds one run: choose a new --workdir, or the same settings to resume it"
        )

    def settle(self, run: rerun.Resume) -> None:
        """The run the workdir holds (Resume.started: its model.json; Resume.finished: its
        results when it finished); ConfigError for other labels than the task has now, or a
        run's outputs without its model.json."""
        workdir = run.workdir
        if run.stored is None:
            return
        if not paths.exists(paths.join(workdir, filenames.MODEL_FILE)):
            # Stopped before its start was written: started over, unless it went on (then lost).
            _refuse_a_run_missing(workdir, filenames.MODEL_FILE)
            return
        run.started = _read(read_model, workdir)
        now = self.described
        if run.started.get("labels") != now["labels"]:
            raise ConfigError(
                f"--workdir {workdir}: {now['task']}'s labels are {now['labels']} now but the "
                f"run there trained with {run.started.get('labels')} "
                f"({paths.join(workdir, filenames.MODEL_FILE)}); a resumed run keeps its labels: "
                "choose a new --workdir to fine-tune with the new ones"
            )
        results_path = paths.join(workdir, filenames.RESULTS_FILE)
        if paths.exists(results_path) and paths.exists(paths.join(workdir, filenames.WEIGHTS_FILE)):
            run.finished = _read(read_json, results_path, "rerun in a new --workdir")

    def write(self, run: rerun.Resume, step: int | None) -> None:
        if step is not None:  # a new run's records are written as it starts (loop.py)
            inputs.record_resume(run, step)


def plan(
    config,
    workdir: str,
    family: str,
    task,
    allow: tuple[str, ...] = (),
    command: str | None = None,
    claim: bool = True,
) -> rerun.Resume:
    """What the run of `config` (completed; `family` and `task` as checks.check_config gives
    them) goes on from in WORKDIR (rerun.plan with fine-tuning's rules): Resume.started and
    Resume.finished say what it holds. Claimed for the run (rerun.take) unless `claim` is False:
    the command line's plan, before it imports jax; the runner claims it.

    Raises ConfigError when the workdir holds another run: another family or task, other
    settings (but the free ones and the keys `allow` names), other labels than the task has
    now, or a run's outputs without its config.json or model.json; CheckpointError when it
    holds only checkpoints set aside as damaged. The workdir is released again.
    """
    planned = rerun.plan(Finetuning(family, task), config, workdir, allow, command)
    return rerun.take(planned) if claim else planned


def check_steps(run: rerun.Resume, num_steps: int, how: str) -> None:
    """ConfigError when a resumed run that holds checkpoints would take another number of steps
    (`num_steps`, which `how` explains) than it started with (model.json): the checkpoints hold
    every step's loss of that many, and step s reads batch s of an order drawn for them, so the
    run could not go on as one (its task files changed under --allow_change=data_dir). Asked
    before anything is compiled."""
    started = (run.started or {}).get("num_steps")
    if not run.resumes or started is None or started == num_steps:
        return
    raise ConfigError(
        f"--workdir {run.workdir}: the run started with {started} steps "
        f"({filenames.MODEL_FILE}) and its checkpoints hold them, but {how} give {num_steps} now; "
        "a resume goes on with the steps it started with: restore the task files it started "
        "from, or use a new --workdir"
    )


# What a run writes once it is under way (after config.json): a workdir holding one of these
# holds a run, whatever else is missing.
_RUN_OUTPUTS = (
    filenames.RESULTS_FILE,
    filenames.WEIGHTS_FILE,
    filenames.GLUE_PREDICTIONS_FILE,
    filenames.SQUAD_PREDICTIONS_FILE,
    filenames.NULL_SCORES_FILE,
)


def _refuse_a_run_missing(workdir: str, missing: str) -> None:
    """ConfigError when WORKDIR holds what a run writes once under way (results, weights,
    checkpoints) but not `missing`, one of the records written when it starts: what it ran is
    then unknown, and starting over would write over it (or die on its checkpoints)."""
    found = [n for n in _RUN_OUTPUTS if paths.exists(paths.join(workdir, n))]
    if checkpoint_steps.has_checkpoints(workdir):
        found.append("checkpoints/")
    if found:
        raise ConfigError(
            f"--workdir {workdir} holds a fine-tuning run ({', '.join(found)}) whose {missing} "
            f"is missing, so what it ran is unknown and it is not replaced: put {missing} back "
            "(from a copy), or choose a new --workdir"
        )
