"""rerun.py: the resume plan pre-training and fine-tuning share (its rule table, the claim,
the checkpoints' survey, a config.json gone, the record of allowed changes)."""

import json
import pathlib

import pytest

from electra_jax.errors import ConfigError
from electra_jax.run import rerun, workdir
from electra_jax.store import checkpointing


def _rules(**overrides) -> rerun.Rules:
    asked = []
    fields = dict(
        kind=workdir.PRETRAIN,
        command="electra_jax.train",
        free=("train.num_steps", "log."),
        read_stored=lambda path: json.loads(pathlib.Path(path).read_text()),
        without_config=lambda w, resumes, allow: asked.append((resumes, allow)),
    )
    fields.update(overrides)
    rules = rerun.Rules(**fields)
    return rules, asked


def test_the_rule_table_frees_keys_and_sections_and_refuses_the_rest_unless_allowed():
    rules, _ = _rules()
    assert rules.is_free("train.num_steps") and rules.is_free("log.every_steps")
    assert not rules.is_free("train.num_steps_x") and not rules.is_free("logx.a")
    old = {"train.num_steps": 10, "log.every_steps": 1, "train.lr": 1.0, "data.seed": 1, "a": 1}
    new = {"train.num_steps": 20, "log.every_steps": 5, "train.lr": 2.0, "data.seed": 2, "b": 1}
    changes, refused = rerun.compare(old, new, rules, ("train.lr",))
    assert changes == {"train.lr": (1.0, 2.0)} and refused == ["data.seed"]
    # Where a key on one side only differs, the other side holds ABSENT.
    strict, _ = _rules(absent_differs=True)
    changes, refused = rerun.compare(old, new, strict, ("b",))
    assert changes == {"b": (rerun.ABSENT, 1)} and refused == ["a", "data.seed", "train.lr"]


def test_open_run_claims_surveys_and_asks_about_a_config_gone(tmp_path):
    rules, asked = _rules()
    new = {"train.num_steps": 1}
    # A new workdir: nothing stored, the hook not asked (no run there).
    run = rerun.open_run(str(tmp_path / "w"), rules, (), new)
    run.release()
    assert (run.resumes, run.stored, asked) == (False, None, [])
    # Checkpoints without config.json: the command's hook decides, told what is there.
    (tmp_path / "w" / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "w" / "checkpoints" / "3" / "_CHECKPOINT_METADATA").write_text("{}")
    rerun.open_run(str(tmp_path / "w"), rules, ("train.num_steps",), new).release()
    assert asked == [(True, ("train.num_steps",))]
    (tmp_path / "w" / "config.json").write_text('{"train": {"num_steps": 1}}')
    run = rerun.open_run(str(tmp_path / "w"), rules, (), new)
    run.release()
    assert run.resumes and run.stored == {"train": {"num_steps": 1}}


def test_open_run_refuses_before_any_work_and_releases_the_workdir(tmp_path):
    path = str(tmp_path / "w")
    rules, _ = _rules()
    with pytest.raises(ConfigError, match="--allow_change names data.sed, which is not a config"):
        rerun.open_run(path, rules, ("data.sed",), {"data.seed": 1})
    # config.json is an --allow_change name only where the rules let a run lose it.
    with pytest.raises(ConfigError, match="names config.json"):
        rerun.open_run(path, rules, ("config.json",), {})
    lenient, _ = _rules(may_lose_config=True)
    rerun.open_run(path, lenient, ("config.json",), {}).release()
    (tmp_path / "w" / "checkpoints").mkdir()
    (tmp_path / "w" / "checkpoints" / f"3{checkpointing.CORRUPT_SUFFIX}").mkdir()
    with pytest.raises(checkpointing.CheckpointError, match="only checkpoints set aside"):
        rerun.open_run(path, rules, (), {})
    # Each refusal released the claim: the workdir can be claimed again.
    workdir.claim(path, workdir.PRETRAIN, command="test").release()


def test_record_changes_appends_a_row_and_rewrites_config_json(tmp_path):
    rerun.record_changes(str(tmp_path), 7, {"a.b": (1, 2)}, {"a": {"b": 2}})
    rerun.record_changes(str(tmp_path), 9, {"c": ("x", "y")}, {"a": {"b": 2}, "c": "y"})
    rows = [json.loads(x) for x in (tmp_path / workdir.CHANGES_FILE).read_text().splitlines()]
    assert rows == [
        {"step": 7, "changes": {"a.b": {"from": 1, "to": 2}}},
        {"step": 9, "changes": {"c": {"from": "x", "to": "y"}}},
    ]
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": {"b": 2}, "c": "y"}
