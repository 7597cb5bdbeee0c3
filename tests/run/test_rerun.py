"""rerun.py: the resume plan pre-training and fine-tuning share (its rule table and Key.absent,
the claim, the checkpoints' survey, a config.json gone, the record of inputs, the record of
allowed changes)."""

import json
import pathlib

import ml_collections
import pytest

from electra_jax.config import schema
from electra_jax.errors import ConfigError
from electra_jax.run import rerun, workdir
from electra_jax.store import checkpointing

_KEYS = schema.table(
    schema.Key("train.num_steps", 1, "", resume=schema.FREE),
    schema.Key("log.every_steps", 1, "", resume=schema.FREE),
    schema.Key("train.lr", 1.0, ""),
    schema.Key("data.seed", 0, ""),
    schema.Key("data.rows", 8, "", absent=0),  # added since: a run without it had none
    schema.Key("model.width", 4, "", resume=schema.MODEL),
)


class _Inputs(rerun.InputsRecord):
    def read(self, run):
        return run.stored.get("inputs") if run.stored else None

    def allow_key(self, field):
        return "data.seed"

    def refusal(self, run, recorded, now, refused):
        return f"other {', '.join(refused)}"


class _Rules(rerun.Rules):
    kind, command, keys, record = workdir.PRETRAIN, "electra_jax.train", _KEYS, _Inputs()

    def __init__(self, may_lose_config=False):
        self.may_lose_config, self.asked = may_lose_config, []

    def read_stored(self, path):
        return json.loads(pathlib.Path(path).read_text())

    def without_config(self, workdir, resumes, allow):
        self.asked.append((resumes, allow))

    def refusal(self, run, old, new, refused):
        return f"refused {', '.join(refused)}"


def _config(**values) -> ml_collections.ConfigDict:
    config = schema.defaults(_KEYS)
    for key, value in values.items():
        section, field = key.split("__")
        config[section][field] = value
    return config


def test_the_rule_table_frees_keys_and_refuses_the_rest_unless_allowed_and_the_model_always():
    rules = _Rules()
    assert rules.is_free("train.num_steps") and rules.is_free("log.every_steps")
    assert rules.is_free("log.other") and not rules.is_free("train.other")  # by their section
    old = {"train.num_steps": 10, "log.every_steps": 1, "train.lr": 1.0, "data.seed": 1}
    old |= {"data.rows": 8, "model.width": 4, "gone.key": 1}
    new = {"train.num_steps": 20, "log.every_steps": 5, "train.lr": 2.0, "data.seed": 2}
    new |= {"data.rows": 8, "model.width": 8}
    changes, refused = rerun.compare(old, new, rules, ("train.lr", "model.width"))
    assert changes == {"train.lr": (1.0, 2.0)} and refused == ["data.seed", "model.width"]


def test_a_key_the_stored_run_lacks_means_its_key_absent_but_a_model_key_differs():
    """One meaning for both commands: what the run had before the key existed (its declared
    absent, else the default); a model key without its own absent leaves the shapes unknown."""
    old = rerun.stored_settings({"train": {"lr": 2.0}, "model": {}}, _KEYS)
    assert old == {
        "train.lr": 2.0,
        "train.num_steps": 1,
        "log.every_steps": 1,
        "data.seed": 0,
        "data.rows": 0,
    }
    assert old["data.rows"] == 0 and "model.width" not in old
    new = {"train.lr": 2.0, "data.seed": 0, "data.rows": 8, "model.width": 4}
    changes, refused = rerun.compare(old, new, _Rules(), ("data.rows",))
    assert changes == {"data.rows": (0, 8)} and refused == ["model.width"]
    old = rerun.stored_settings({"data": {"rows": 8}}, _KEYS)
    assert old["data.rows"] == 8 and old["train.lr"] == 1.0


def test_plan_surveys_and_asks_about_a_config_gone_and_take_claims(tmp_path):
    rules, path = _Rules(), str(tmp_path / "w")
    # A new workdir: nothing stored, the hook not asked (no run there), nothing written.
    run = rerun.plan(rules, _config(), path)
    assert (run.resumes, run.stored, run.claim, rules.asked) == (False, None, None, [])
    assert not (tmp_path / "w").exists()
    workdir.claim(path, workdir.PRETRAIN, command="test").release()  # a run's workdir
    # Checkpoints without config.json: the command's hook decides, told what is there.
    (tmp_path / "w" / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "w" / "checkpoints" / "3" / "_CHECKPOINT_METADATA").write_text("{}")
    rerun.plan(rules, _config(), path, ("train.num_steps",))
    assert rules.asked == [(True, ("train.num_steps",))]
    stored = _config().to_dict()
    (tmp_path / "w" / "config.json").write_text(json.dumps(stored))
    planned = rerun.plan(rules, _config(train__num_steps=9), path)
    assert planned.resumes and planned.newest == 3 and planned.stored == stored
    run = rerun.take(planned)
    try:
        assert run.claim is not None and run.config is planned.config
        with pytest.raises(ConfigError, match="is in use by"):
            rerun.take(planned)
    finally:
        run.release()
    # Another setting stored since the plan: planned anew at the claim, and refused.
    (tmp_path / "w" / "config.json").write_text(json.dumps(_config(train__lr=3.0).to_dict()))
    with pytest.raises(ConfigError, match="refused train.lr"):
        rerun.take(planned)
    workdir.claim(path, workdir.PRETRAIN, command="test").release()  # released


def test_take_refuses_a_workdir_another_kind_of_run_took_since_the_plan(tmp_path):
    """The plan asks the claim's checks once; between it and the lock, a fine-tuning made the
    new folder its own: the lock's marker refuses it rather than writing over its marker."""
    path = str(tmp_path / "w")
    planned = rerun.plan(_Rules(), _config(), path)
    workdir.claim(path, workdir.FINETUNE, command="test").release()
    with pytest.raises(ConfigError, match="is a fine-tuning workdir; a pre-training run would"):
        rerun.take(planned)
    assert json.loads((tmp_path / "w" / workdir.MARKER).read_text())["kind"] == workdir.FINETUNE
    workdir.claim(path, workdir.FINETUNE, command="test").release()  # the lock was released


def test_plan_refuses_before_any_work(tmp_path):
    path = str(tmp_path / "w")
    with pytest.raises(ConfigError, match="--allow_change names data.sed, which is not a config"):
        rerun.plan(_Rules(), _config(), path, ("data.sed",))
    # config.json is an --allow_change name only where the rules let a run lose it.
    with pytest.raises(ConfigError, match="names config.json"):
        rerun.plan(_Rules(), _config(), path, ("config.json",))
    rerun.plan(_Rules(may_lose_config=True), _config(), path, ("config.json",))
    workdir.claim(path, workdir.PRETRAIN, command="test").release()  # a run's workdir
    (tmp_path / "w" / "checkpoints").mkdir(parents=True)
    (tmp_path / "w" / "checkpoints" / f"3{checkpointing.CORRUPT_SUFFIX}").mkdir()
    with pytest.raises(checkpointing.CheckpointError, match="only checkpoints set aside"):
        rerun.plan(_Rules(), _config(), path)


def test_inputs_are_held_to_their_record_and_an_allowed_change_kept_to_write(tmp_path):
    stored = {"inputs": {"corpus": "a", "files": 2}}
    run = rerun.Resume(str(tmp_path), _config(), _Rules(), stored=stored)
    run.hold_inputs({"corpus": "a", "files": 2})
    assert run.inputs is None and run.inputs_changes == {}  # the record stands
    with pytest.raises(ConfigError, match="other files"):
        run.hold_inputs({"corpus": "a", "files": 3})
    run.allow = ("data.seed",)
    run.hold_inputs({"corpus": "a", "files": 3, "gone": None})
    assert run.inputs == {"corpus": "a", "files": 3} and run.inputs_changes == {"files": (2, 3)}
    # A run without a record gets one.
    fresh = rerun.Resume(str(tmp_path), _config(), _Rules())
    fresh.hold_inputs({"corpus": "b"})
    assert fresh.inputs == {"corpus": "b"} and fresh.inputs_changes == {}


def test_record_changes_appends_a_row_and_rewrites_config_json(tmp_path):
    rerun.record_changes(str(tmp_path), 7, {"a.b": (1, 2)}, {"a": {"b": 2}})
    rerun.record_changes(str(tmp_path), 9, {"c": ("x", "y")}, {"a": {"b": 2}, "c": "y"})
    rows = [json.loads(x) for x in (tmp_path / workdir.CHANGES_FILE).read_text().splitlines()]
    assert rows == [
        {"step": 7, "changes": {"a.b": {"from": 1, "to": 2}}},
        {"step": 9, "changes": {"c": {"from": "x", "to": "y"}}},
    ]
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": {"b": 2}, "c": "y"}
