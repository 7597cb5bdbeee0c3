"""The pre-training keys: one declaration each, that configs/small.py gives and every shipped
config passes, with the resume rules and absent meanings resume.py used to list."""

import pytest

from electra_jax.config import pretrain_keys, schema
from tests.conftest import load_config

RULES = (schema.FREE, schema.ALLOW, schema.MODEL)


def test_every_key_has_a_doc_and_a_pre_training_resume_rule():
    for key in pretrain_keys.KEYS:
        assert key.doc and "\n" not in key.doc, key.name
        assert key.resume in RULES, key.name
        assert key.kind in (bool, int, float, str), key.name


def test_small_is_the_defaults_and_every_shipped_config_passes_its_keys_rules():
    assert load_config("small").to_dict() == schema.defaults(pretrain_keys.KEYS).to_dict()
    for name in ("tiny", "small", "base", "large", "gpu_quality"):
        config = load_config(name)
        assert sorted(schema.flatten(config.to_dict())) == sorted(
            k.name for k in pretrain_keys.KEYS
        ), name
        schema.check_values(config, pretrain_keys.KEYS)


@pytest.mark.parametrize(
    "name,rule",
    [
        ("model.hidden_size", schema.MODEL),
        ("generator.layers_fraction", schema.MODEL),
        ("data.vocab_size", schema.MODEL),
        ("objective.name", schema.MODEL),
        ("model.dtype", schema.ALLOW),  # the compute type only
        ("train.learning_rate", schema.ALLOW),
        ("data.source", schema.ALLOW),
        ("train.num_steps", schema.FREE),
        ("train.steps_per_call", schema.FREE),
        ("data.tokenizer", schema.FREE),
        ("log.wandb_project", schema.FREE),
        ("eval.batch_size", schema.FREE),
    ],
)
def test_what_a_resume_may_do_with_a_key(name, rule):
    assert schema.resume_rule(name, pretrain_keys.KEYS) == rule


def test_a_config_json_from_before_a_key_means_what_the_run_had():
    filled = schema.upgrade({"model": {"hidden_size": 64}}, pretrain_keys.KEYS)
    assert filled["model"]["scan_layers"] is False  # unrolled layers
    assert filled["data"]["heldout_examples"] == 0  # trained on every row
    assert filled["train"]["steps_per_call"] == 1 and filled["eval"]["every_steps"] == 0
    assert filled["model"]["hidden_size"] == 64 and filled["model"]["num_heads"] == 4
