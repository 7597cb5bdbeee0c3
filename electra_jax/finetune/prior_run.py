"""What a fine-tuning workdir already holds, and whether this run may go on with it: `plan`.

Fine-tuning resumes through the plan pre-training's does (rerun.open_run): the workdir claimed,
its checkpoints surveyed, the stored config.json held to the new settings by a rule table
(FINETUNING, its free keys FREE_ON_RESUME) and the allowed changes recorded in
config_changes.jsonl. A fine-tuning workdir holds one run, and a config.json says it does,
checkpoints or not (a run cut short before its first checkpoint, or finished): every setting but
those of FREE_ON_RESUME and the keys --allow_change names is refused in one line; so is a
workdir of another task or family, one whose task's labels have changed, and one that holds what
a run writes once under way without the records its start wrote. A finished run's results are
answered as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from electra_jax.config import finetune_keys
from electra_jax.config.schema import flatten
from electra_jax.errors import ConfigError, PretrainedError
from electra_jax.finetune import saved
from electra_jax.finetune.family import Family
from electra_jax.finetune.glue import GLUE
from electra_jax.finetune.squad import SQUAD
from electra_jax.run import rerun
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames, paths

# The settings a fine-tuning's rerun may change without --allow_change (Key.resume FREE in
# config/finetune_keys.py): they change no number of the run, only how often it logs and
# checkpoints and how many checkpoints it keeps.
FREE_ON_RESUME = finetune_keys.free_on_resume()


@dataclasses.dataclass
class PriorRun:
    """The answer of `plan`: what a fine-tuning goes on from, its workdir claimed."""

    opened: rerun.Rerun  # the claimed workdir and its stored config.json
    record: dict | None  # model.json of the run it resumes; None: a new start
    finished: dict | None  # eval_results.json of a finished run, answered as it is
    changes: dict[str, tuple[Any, Any]]  # allowed changes of settings, {key: (stored, now)}
    allow: tuple[str, ...]  # --allow_change

    def release(self) -> None:
        self.opened.release()


def plan(config, workdir: str, family: Family, task, allow: tuple[str, ...] = ()) -> PriorRun:
    """Claims WORKDIR and answers what the run goes on from (see PriorRun).

    Raises ConfigError when the workdir holds another run: another family or task, other
    settings (but those of FREE_ON_RESUME and the keys `allow` names), other labels than the
    task has now, or a run's outputs without its config.json or model.json; CheckpointError
    when it holds only checkpoints set aside as damaged. The workdir is released again.
    """
    rules = dataclasses.replace(
        FINETUNING, without_config=lambda w, resumes, allow: _check_started_run(w, family, task)
    )
    opened = rerun.open_run(workdir, rules, tuple(allow), flatten(config.to_dict()))
    try:
        record, finished, changes = _previous_run(config, opened, family, task, tuple(allow))
    except BaseException:
        opened.release()
        raise
    return PriorRun(opened, record, finished, changes, tuple(allow))


def check_steps(prior: PriorRun, num_steps: int, how: str) -> None:
    """ConfigError when a resumed run that holds checkpoints would take another number of steps
    (`num_steps`, which `how` explains) than it started with (model.json): the checkpoints hold
    every step's loss of that many, and step s reads batch s of an order drawn for them, so the
    run could not go on as one (its task files changed under --allow_change=data_dir). Asked
    before anything is compiled."""
    started = (prior.record or {}).get("num_steps")
    if not prior.opened.resumes or started is None or started == num_steps:
        return
    raise ConfigError(
        f"--workdir {prior.opened.workdir}: the run started with {started} steps "
        f"({saved.MODEL_FILE}) and its checkpoints hold them, but {how} give {num_steps} now; "
        "a resume goes on with the steps it started with: restore the task files it started "
        "from, or use a new --workdir"
    )


def _read_stored(path: str) -> dict:
    try:
        return saved.read_json(path, "restore it or use a new --workdir")
    except PretrainedError as e:
        raise ConfigError(str(e)) from None


# Fine-tuning's rerun: a config.json holds a run, checkpoints or not; a key on one side only
# differs (a config of an earlier version is another run); a config.json gone is not replaced.
# `without_config` is bound to the family and task by `plan`.
FINETUNING = rerun.Rules(
    kind=workdir_lib.FINETUNE,
    command="electra_jax.finetune",
    free=FREE_ON_RESUME,
    read_stored=_read_stored,
    without_config=lambda workdir, resumes, allow: None,
    stored_without_checkpoints=True,
    absent_differs=True,
)


# What a run writes once it is under way (after config.json): a workdir holding one of these
# holds a run, whatever else is missing.
_RUN_OUTPUTS = (
    saved.RESULTS_FILE,
    saved.WEIGHTS_FILE,
    GLUE.predictions_file,
    SQUAD.predictions_file,
    filenames.NULL_SCORES_FILE,
)


def _check_started_run(workdir: str, family: Family, task) -> None:
    """ConfigError when WORKDIR, without its config.json, still holds a run: model.json of
    another task, or what a run writes once under way (results, weights, checkpoints). A start
    cut short (model.json of this task and the tokenizer only) is started over."""
    model_path = paths.join(workdir, saved.MODEL_FILE)
    now = family.describe(task)["task"]
    if paths.exists(model_path):
        try:
            record = saved.read_model(workdir)
        except PretrainedError as e:
            raise ConfigError(str(e)) from None
        there = record.get("task")
        if there != now or record.get("family", family.name) != family.name:
            raise ConfigError(
                f"--workdir {workdir} holds a {record.get('family', '?')} fine-tuning of {there} "
                f"({model_path}), not of {now}; a workdir holds one task and one run: choose a "
                "new --workdir"
            )
    _refuse_a_run_missing(workdir, saved.CONFIG_FILE)


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


def _previous_run(config, opened: rerun.Rerun, family: Family, task, allow: tuple[str, ...]):
    """(model.json, eval_results.json, allowed changes) of the run the workdir holds, (None, None,
    {}) when it holds none; ConfigError as `plan` says."""
    workdir, there = opened.workdir, opened.stored
    if there is None:
        return None, None, {}
    model_path = paths.join(workdir, saved.MODEL_FILE)
    results_path = paths.join(workdir, saved.RESULTS_FILE)
    finished = paths.exists(results_path)
    old, new = flatten(there), flatten(config.to_dict())
    changes, refused = rerun.compare(old, new, opened.rules, allow)
    if refused:
        what = there.get("task") or (f"SQuAD {there['version']}" if "version" in there else "?")
        kind = f"a {there['family']} fine-tuning" if "family" in there else "a fine-tuning"
        if "family" not in there:
            kind += " of an earlier version"
        first = refused[0]
        shown = f"{first} is {new.get(first, rerun.ABSENT)!r} now, "
        shown += f"{old.get(first, rerun.ABSENT)!r} there"
        more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
        raise ConfigError(
            f"--workdir {workdir} holds {'the finished' if finished else 'the unfinished'} "
            f"{kind.removeprefix('a ')} of {what}, and this run differs ({shown}{more}); "
            "a workdir holds one run: choose a new --workdir, or the same settings to resume it"
        )
    if not paths.exists(model_path):  # stopped before its start was written: start over
        _refuse_a_run_missing(workdir, saved.MODEL_FILE)  # unless it went on (then: lost)
        return None, None, {}
    try:
        record = saved.read_model(workdir)
    except PretrainedError as e:
        raise ConfigError(str(e)) from None
    now = family.describe(task)
    if record.get("labels") != now["labels"]:
        raise ConfigError(
            f"--workdir {workdir}: {now['task']}'s labels are {now['labels']} now but the run "
            f"there trained with {record.get('labels')} ({model_path}); a resumed run keeps its "
            "labels: choose a new --workdir to fine-tune with the new ones"
        )
    results = None
    if finished and paths.exists(paths.join(workdir, saved.WEIGHTS_FILE)):
        try:
            results = saved.read_json(results_path, "rerun in a new --workdir")
        except PretrainedError as e:
            raise ConfigError(str(e)) from None
    return record, results, changes
