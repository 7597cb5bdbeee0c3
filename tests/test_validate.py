"""validate: config checks that run before any work, each one line naming the key and the fix."""

import json

import pytest

from electra_jax import validate
from tests.conftest import micro_config


def _stored(config):
    return json.loads(json.dumps(config.to_dict()))  # what config.json holds


def test_same_model_passes_and_ignores_non_model_keys():
    stored = _stored(micro_config())
    config = micro_config()
    config.train.batch_size, config.train.num_steps = 16, 1000  # a longer run, other batch: fine
    config.model.dtype = "bfloat16"  # compute type only; the parameters stay float32
    validate.check_same_model(stored, config, "w/config.json")


def test_different_model_names_the_keys_and_the_fix():
    stored = _stored(micro_config())
    config = micro_config()
    config.model.hidden_size = 128
    config.data.vocab_size = 400
    with pytest.raises(validate.ConfigError) as e:
        validate.check_same_model(stored, config, "w/config.json")
    message = str(e.value)
    assert message.startswith("w/config.json describes a different model")
    assert "data.vocab_size=300 there vs 400 now" in message
    assert "model.hidden_size=64 there vs 128 now" in message
    assert "use a new --workdir" in message and "\n" not in message


def test_missing_key_in_stored_config_counts_as_different():
    stored = _stored(micro_config())
    del stored["generator"]["layers_fraction"]
    with pytest.raises(validate.ConfigError, match="generator.layers_fraction=None there"):
        validate.check_same_model(stored, micro_config(), "config.json")


def test_nan_policy_must_be_stop_or_skip():
    config = micro_config()
    validate.check_config(config)
    config.train.nan_policy = "ignore"
    with pytest.raises(validate.ConfigError, match="train.nan_policy='ignore'.*'stop' or 'skip'"):
        validate.check_config(config)


def test_batch_must_split_over_devices_and_processes():
    validate.check_batch(16, 8, 2)
    with pytest.raises(validate.ConfigError, match="batch_size=12 is not divisible by the 8"):
        validate.check_batch(12, 8, 1)
    with pytest.raises(validate.ConfigError, match="3 processes"):
        validate.check_batch(8, 1, 3)


def test_objective_and_embedding_sharing_are_checked_in_one_line():
    config = micro_config()
    config.objective.name = "bert"
    with pytest.raises(validate.ConfigError, match="objective.name='bert' is not an objective"):
        validate.check_config(config)
    config = micro_config()
    config.model.embedding_sharing = "tied"
    with pytest.raises(validate.ConfigError, match="model.embedding_sharing='tied' is not a mode"):
        validate.check_config(config)
    for name in ("electra", "mlm", "electra_15", "replaced_mlm", "all_tokens_mlm"):
        config = micro_config()
        config.objective.name = name
        validate.check_config(config)
