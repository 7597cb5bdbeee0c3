"""No setting is silently dropped or silently replaced (electra_jax/strict_settings.py): a flag
given twice, a config file's key that no schema declares, a special word in another case, a
trace that would start past the run's end."""

import pytest
from absl import flags

from electra_jax import cli, strict_settings, validate
from electra_jax.config import finetune_keys
from electra_jax.errors import ConfigError
from electra_jax.pretraining import compile_cache
from tests.micro import micro_config


@pytest.fixture
def flag_values():
    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    flags.DEFINE_bool("verbose", False, "", flag_values=values)
    flags.DEFINE_multi_string("set", [], "", flag_values=values)
    return values


@pytest.mark.parametrize(
    "argv, repeated",
    [
        (["--config.train.batch_size=8", "--config.train.batch_size=16"],
         "--config.train.batch_size (as --config.train.batch_size=8 and "
         "--config.train.batch_size=16)"),
        (["--workdir=a", "--workdir", "b"], "--workdir (as --workdir=a and --workdir)"),
        (["--verbose", "--noverbose"], "--verbose (as --verbose and --noverbose)"),
        (["--set=a=1", "--set=b=2", "--workdir=a"], None),  # a multi flag takes repeats
        (["--config.train.batch_size=8", "--config.train.num_steps=8", "--", "--workdir=x"], None),
    ],
)  # fmt: skip
def test_a_flag_given_twice_is_found_in_either_form(flag_values, argv, repeated):
    assert strict_settings.repeated_flag(["prog", *argv], flag_values) == repeated


def _unknown(config, finetuning: bool) -> list[str]:
    declared, keys = strict_settings.file_keys(config, finetuning)
    return cli.unknown_keys(declared, [f"--config.{k}=" for k in keys])


def test_a_config_files_key_is_checked_as_an_override_is():
    config = micro_config()
    assert _unknown(config, False) == []
    with config.unlocked():
        config.train.num_step = 3
        config.model.zzz_width = 1
        config.extra = {"a": 1}
    assert _unknown(config, False) == [
        "extra",
        "model.zzz_width",
        "train.num_step (did you mean train.num_steps?)",
    ]
    glue = finetune_keys.defaults("glue")
    with glue.unlocked():
        glue.learning_rat = 1e-4
    assert _unknown(glue, True) == ["learning_rat (did you mean learning_rate?)"]


@pytest.mark.parametrize("word", ["off", "OFF", "Off", " off "])
def test_the_caches_special_word_in_any_case(tmp_path, word):
    assert compile_cache.folder(word, str(tmp_path)) is None


def test_a_trace_past_the_runs_end_is_refused():
    config = micro_config()
    config.log.profile_steps = config.train.num_steps
    validate.check_config(config)  # the last step may be traced
    config.log.profile_steps = config.train.num_steps + 1
    with pytest.raises(ConfigError, match=r"log.profile_steps=\d+ is past the run's end"):
        validate.check_config(config)
