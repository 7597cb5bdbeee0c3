"""The schema's functions over a key table: defaults, complete, check_values, upgrade, the
resume rule; and the config package's place at the bottom of the import graph (above the
errors only)."""

import ast
import pathlib

import ml_collections
import pytest

from electra_jax.config import schema
from electra_jax.config.schema import Key
from electra_jax.errors import ConfigError

KEYS = schema.table(
    Key("seed", 0, "the seed", rule="[0, 2**32)"),
    Key("train.steps", 10, "updates", rule=">= 1", resume=schema.FREE),
    Key(
        "train.rate",
        0.1,
        "the peak",
        rule="> 0",
        float32=(1e-9, 10.0),
        why="float32 rounds it away",
    ),
    Key("train.mode", "a", "how", rule=("a", "b", "c")),
    Key("train.flag", False, "a switch"),
    Key("model.width", 8, "units", rule=">= 1", resume=schema.MODEL, absent=4),
)


def test_defaults_hold_every_key_at_its_default():
    config = schema.defaults(KEYS)
    assert sorted(schema.flatten(config.to_dict())) == sorted(k.name for k in KEYS)
    assert config.train.steps == 10 and config.model.width == 8


def test_complete_fills_only_what_is_missing_and_leaves_the_callers_config_alone():
    config = ml_collections.ConfigDict({"train": {"steps": 3}})
    done = schema.complete(config, KEYS)
    assert done.train.steps == 3 and done.train.rate == 0.1 and done.model.width == 8
    assert "rate" not in config.train and "model" not in config  # a copy was completed
    assert schema.complete(done, KEYS) is done  # nothing missing: the config itself


@pytest.mark.parametrize(
    "name,value,expected",
    [
        ("train.steps", 0, "train.steps=0 must be >= 1"),
        ("train.rate", float("nan"), "train.rate=nan must be a finite number"),
        ("train.rate", 0.0, "train.rate=0.0 must be > 0: float32 rounds it away"),
        ("train.rate", 1e-12, "train.rate=1e-12 must be in [1e-09, 10]: float32 rounds it away"),
        ("train.mode", "d", "train.mode='d' is not a choice; use one of 'a', 'b', 'c'"),
        ("train.flag", "yes", "train.flag='yes' is not a choice; use True or False"),
        ("train.steps", 2.5, "train.steps=2.5 must be a whole number"),
        ("seed", 2**32, "seed=4294967296 must be in [0, 2**32)"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(name, value, expected):
    tree = schema.defaults(KEYS).to_dict()  # a dict: a ConfigDict refuses another type
    section, _, field = name.rpartition(".")
    (tree[section] if section else tree)[field] = value
    config = ml_collections.ConfigDict(tree)
    with pytest.raises(ConfigError) as e:
        schema.check_values(config, KEYS)
    assert str(e.value) == expected


def test_both_commands_word_a_bad_value_alike_fine_tuning_naming_config():
    config = schema.defaults(KEYS)
    config.train.steps = 0
    with pytest.raises(ConfigError, match=r"^config.train.steps=0 must be >= 1$"):
        schema.check_values(config, KEYS, prefix="config.")
    config.train.steps, config.train.rate = 1, float("inf")
    with pytest.raises(ConfigError, match=r"^config.train.rate=inf must be a finite number$"):
        schema.check_values(config, KEYS, prefix="config.")


def test_defaults_pass_and_missing_keys_are_not_checked():
    schema.check_values(schema.defaults(KEYS), KEYS)
    schema.check_values(ml_collections.ConfigDict({"train": {"steps": 2}}), KEYS)


def test_a_typo_in_a_rule_fails_when_the_table_is_built():
    with pytest.raises(ValueError):
        Key("x", 1, "doc", rule="=> 1")
    with pytest.raises(ValueError, match="declared twice"):
        schema.table(Key("x", 1, "a"), Key("x", 2, "b"))


def test_upgrade_fills_what_an_older_config_json_meant():
    stored = {"train": {"steps": 5}}
    filled = schema.upgrade(stored, KEYS)
    assert filled["model"]["width"] == 4  # its declared absent meaning, not the default 8
    assert filled["train"] == {"steps": 5, "rate": 0.1, "mode": "a", "flag": False}
    assert stored == {"train": {"steps": 5}}  # a new dict
    declared = schema.upgrade(stored, KEYS, declared_only=True)
    assert declared == {"train": {"steps": 5}, "model": {"width": 4}}


def test_the_resume_rule_of_a_key_and_of_an_undeclared_key_of_its_section():
    assert schema.resume_rule("train.steps", KEYS) == schema.FREE
    assert schema.resume_rule("model.width", KEYS) == schema.MODEL
    assert schema.resume_rule("model.depth", KEYS) == schema.MODEL  # model's keys: all MODEL
    assert schema.resume_rule("train.other", KEYS) == schema.ALLOW  # train's keys differ
    with pytest.raises(ValueError, match="resume"):
        Key("x", 1, "doc", resume="sometimes")


def test_the_config_package_imports_nothing_of_electra_jax_but_itself_its_errors_and_no_jax():
    folder = pathlib.Path(schema.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert not name.startswith(("jax", "flax", "optax", "orbax")), (path, name)
                if name.startswith("electra_jax"):
                    assert name.startswith(("electra_jax.config", "electra_jax.errors")), name
