"""finetune/prior_run.py: fine-tuning resumes through rerun's plan, held to its free keys."""

import json

import pytest

from electra_jax.config import finetune_keys
from electra_jax.errors import ConfigError
from electra_jax.finetune import loop, prior_run, saved
from electra_jax.run import workdir
from electra_jax.store import checkpointing
from tests.finetune.test_inputs import _glue
from tests.finetune.test_loop import _config


def _plan(config, path, allow=()):
    family, task = loop.check_config(config)
    return prior_run.plan(config, str(path), family.name, task, allow)


def _stored(path, config, **changed):
    """A workdir whose config.json is `config`'s with `changed` keys, as a start wrote it."""
    workdir.claim(str(path), workdir.FINETUNE, command="test").release()
    stored = config.to_dict()
    stored.update(changed)
    (path / saved.CONFIG_FILE).write_text(json.dumps(stored))


def test_only_the_free_keys_and_the_allowed_ones_may_change(tmp_path):
    config = _config(tmp_path / "data")
    free = {key: config[key] + 1 for key in finetune_keys.free_on_resume() if "." not in key}
    _stored(tmp_path / "w", config, **free)
    prior = _plan(config, tmp_path / "w")  # config.json without model.json: a start, over
    prior.release()
    assert (prior.started, prior.finished, prior.changes) == (None, None, {})
    _stored(tmp_path / "w", config, learning_rate=0.5, data_dir="elsewhere")
    with pytest.raises(ConfigError) as e:
        _plan(config, tmp_path / "w", ("data_dir",))
    assert str(e.value) == (
        f"--workdir {tmp_path / 'w'} holds the unfinished glue fine-tuning of SST-2, and this run "
        f"differs (learning_rate is {config.learning_rate!r} now, 0.5 there); a workdir holds one "
        "run: choose a new --workdir, or the same settings to resume it"
    )
    # With model.json, a resume: the allowed change is answered for the record.
    _stored(tmp_path / "w", config, data_dir="elsewhere")
    family, task = loop.check_config(config)
    record = {"format": saved.FORMAT, "family": family.name, **family.describe(task)}
    (tmp_path / "w" / saved.MODEL_FILE).write_text(json.dumps(record))
    prior = _plan(config, tmp_path / "w", ("data_dir",))
    prior.release()
    assert prior.started == record and prior.finished is None
    assert prior.changes == {"data_dir": ("elsewhere", config.data_dir)}


def test_checkpoints_that_are_not_the_runs_or_only_damaged_ones_are_refused(tmp_path):
    """As pre-training's: an export put into checkpoints/ is refused before any work, nothing
    moved; a run whose checkpoints were all set aside is not started over."""
    config = _config(tmp_path / "data")
    _stored(tmp_path / "w", config)
    checkpoints = tmp_path / "w" / "checkpoints"
    (checkpoints / "7").mkdir(parents=True)
    (checkpoints / "7" / "export.json").write_text("{}")
    with pytest.raises(checkpointing.ForeignFolderError, match="7 holds export.json, not a"):
        _plan(config, tmp_path / "w")
    (checkpoints / "7").rename(checkpoints / f"7{checkpointing.CORRUPT_SUFFIX}")
    with pytest.raises(checkpointing.CheckpointError, match="only checkpoints set aside"):
        _plan(config, tmp_path / "w")
    # Refused, the workdir was released each time.
    workdir.claim(str(tmp_path / "w"), workdir.FINETUNE, command="test").release()


def _files(workdir) -> dict:
    """The run's files (not the lock, which each claim writes), by name: their bytes."""
    return {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file() and p.name[0] != "."}


def test_a_resume_that_would_take_other_steps_is_refused_before_any_work(tmp_path):
    """Task files changed under --allow_change=data_dir to fewer rows: the checkpoints hold the
    12 steps the run started with, so it is refused in one line (not a history shape mismatch
    at the restore), and nothing is written."""
    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    assert loop.finetune(config, str(workdir), stop_after=5)["stopped_at"] == 5
    train = tmp_path / "SST-2" / "train.tsv"
    train.write_text("\n".join(train.read_text().splitlines()[:31]) + "\n")  # 30 rows
    before = _files(workdir)
    with pytest.raises(ConfigError) as e:
        loop.finetune(config, str(workdir), allow_changes=("data_dir",))
    assert str(e.value) == (
        f"--workdir {workdir}: the run started with 12 steps (model.json) and its checkpoints "
        "hold them, but 30 examples x 3 epochs / batch 16 give 5 now; a resume goes on with "
        "the steps it started with: restore the task files it started from, or use a new "
        "--workdir"
    )
    assert _files(workdir) == before and "config_changes.jsonl" not in before
