"""validate: config checks that run before any work, each one line naming the key and the fix."""

import pytest

from electra_jax import validate
from electra_jax.errors import ConfigError
from tests.conftest import micro_config


def test_nan_policy_must_be_stop_or_skip():
    config = micro_config()
    validate.check_config(config)
    config.train.nan_policy = "ignore"
    with pytest.raises(ConfigError, match="train.nan_policy='ignore'.*'stop' or 'skip'"):
        validate.check_config(config)


def test_batch_must_split_over_devices_and_processes():
    validate.check_batch(16, 8, 2)
    with pytest.raises(ConfigError, match="batch_size=12 is not divisible by the 8"):
        validate.check_batch(12, 8, 1)
    with pytest.raises(ConfigError, match="3 processes"):
        validate.check_batch(8, 1, 3)


def test_objective_and_embedding_sharing_are_checked_in_one_line():
    config = micro_config()
    config.objective.name = "bert"
    with pytest.raises(ConfigError, match="objective.name='bert' is not an objective"):
        validate.check_config(config)
    config = micro_config()
    config.model.embedding_sharing = "tied"
    with pytest.raises(ConfigError, match="model.embedding_sharing='tied' is not a choice"):
        validate.check_config(config)
    for name in (
        "electra",
        "mlm",
        "electra_15",
        "replaced_mlm",
        "all_tokens_mlm",
    ):  # two_stage: below
        config = micro_config()
        config.objective.name = name
        validate.check_config(config)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("data.single_segment_prob", 2.0, "data.single_segment_prob=2.0 must be in [0, 1]"),
        ("data.short_seq_prob", -1.0, "data.short_seq_prob=-1.0 must be in [0, 1]"),
        ("generator.layers_fraction", 0.0, "generator.layers_fraction=0.0 must be in (0, 1]"),
        ("model.type_vocab_size", 0, "model.type_vocab_size=0 must be >= 2"),
        ("model.intermediate_size", 0, "model.intermediate_size=0 must be >= 1"),
        ("model.dropout_rate", 1.0, "model.dropout_rate=1.0 must be in [0, 1)"),
        ("train.adam_b2", 1.0, "train.adam_b2=1.0 must be in [0, 1)"),
        ("train.adam_eps", 0.0, "train.adam_eps=0.0 must be > 0"),
        ("train.weight_decay", float("nan"), "train.weight_decay=nan must be a finite number"),
        ("objective.disc_weight", float("inf"), "objective.disc_weight=inf must be a finite"),
        ("data.examples_per_shard", 0, "data.examples_per_shard=0 must be >= 1"),
        ("mesh.fsdp", 0, "mesh.fsdp=0 must be >= 1, or -1"),
        ("log.profile_steps", -1, "log.profile_steps=-1 must be >= 0"),
        ("log.profile_num_steps", 0, "log.profile_num_steps=0 must be >= 1"),
        ("compile.cache_dir", "s3://b/c", "compile.cache_dir=s3://b/c is a s3:// URI"),
        ("seed", -1, "seed=-1 must be in [0, 2**32)"),
        ("train.remat", "some", "train.remat='some' is not a choice"),
        ("model.attention", "flash", "model.attention='flash' is not a choice"),
        ("objective.sampler", "top_k", "objective.sampler='top_k' is not a choice"),
        ("model.attention", "xla", "model.attention='xla' has no dropout on the attention"),
        ("data.source", "wikipedia", "data.source 'wikipedia' is not a known source"),
        ("data.source", "text:", "data.source 'text:' is not a known source"),
        ("data.source", "parquet::text", "data.source 'parquet::text' is not a known source"),
        ("data.source", "jsonl:", "data.source 'jsonl:' is not a known source"),
        ("data.mixture", "builtin:1", "data.mixture: 'builtin:1' names 1 source(s)"),
        ("data.mixture", "builtin:1;jsonl::2", "data.mixture: data.source 'jsonl:' is not a"),
        ("objective.temperature", 1e-30, "objective.temperature=1e-30 must be in [0.001, 1000"),
        ("objective.temperature_start", 2.0, "needs objective.temperature_steps > 0"),
        ("objective.temperature_steps", 3, "objective.temperature_start=0.0, which must be in"),
        ("objective.temperature_steps", -1, "objective.temperature_steps=-1 must be >= 0"),
        ("objective.disc_mlm_weight", -1.0, "objective.disc_mlm_weight=-1.0 must be >= 0"),
        ("objective.disc_mlm_steps", 99, "objective.disc_mlm_steps=99 must not exceed"),
        ("objective.unigram_share", 1.5, "objective.unigram_share=1.5 must be in [0, 1]"),
        ("objective.unigram_share_steps", 3, "fades objective.unigram_share, which is 0"),
        ("objective.unigram_share_steps", -1, "objective.unigram_share_steps=-1 must be >= 0"),
        ("data.heldout_examples", -8, "data.heldout_examples=-8 must be >= 0: 0 trains"),
        ("eval.every_steps", -1, "eval.every_steps=-1 must be >= 0"),
        ("checkpoint.keep_every_steps", -2, "checkpoint.keep_every_steps=-2 must be >= 0"),
        ("checkpoint.every_minutes", -1.0, "checkpoint.every_minutes=-1.0 must be >= 0"),
        ("export.license", "Apache 2.0", "export.license='Apache 2.0' is not a Hugging Face"),
        ("export.license", "-mit", "export.license='-mit' is not a Hugging Face Hub license"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(key, value, expected):
    config = micro_config()
    *section, field = key.split(".")
    (config[section[0]] if section else config)[field] = value
    with pytest.raises(ConfigError) as e:
        validate.check_config(config)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_every_kind_of_source_is_accepted_by_form():
    # Its files are not looked for here: that is prepare's, once the run reads them.
    for source in (
        "builtin",
        "text:corpus/**/*.txt",
        "parquet:gs://bucket/c4/*.parquet",
        "parquet:corpus/*.parquet:content",
        "jsonl:corpus/*.jsonl.gz",
        "tfds:wikipedia/20230601.en",
    ):
        config = micro_config()
        config.data.source = source
        validate.check_config(config)


def test_a_mixture_is_checked_by_form_and_refused_beside_a_data_source():
    config = micro_config()
    config.data.mixture = "builtin:0.7;books=text:corpus/**/*.txt:0.3"
    validate.check_config(config)
    config.data.source = "text:corpus/**/*.txt"
    with pytest.raises(ConfigError, match=r"data.mixture=.* and data.source=.* both name the corp"):
        validate.check_config(config)


def test_cudnn_attention_needs_a_gpu_and_fused_attention_no_attention_dropout():
    import jax

    config = micro_config()
    config.model.attention, config.model.attention_dropout_rate = "xla", 0.0
    validate.check_config(config)
    config.model.attention = "cudnn"
    with pytest.raises(ConfigError, match="computes in 16 bits and model.dtype='float32'"):
        validate.check_config(config)
    config.model.dtype = "bfloat16"
    if jax.default_backend() == "gpu":
        validate.check_config(config)
    else:
        with pytest.raises(ConfigError, match="model.attention='cudnn' needs an NVIDIA"):
            validate.check_config(config)


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    config = micro_config()
    config.data.cache_dir = str(tmp_path / "f")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="data.cache_dir=.* is a file, not a folder"):
        validate.check_config(config)


def test_a_warmup_longer_than_half_the_run_is_named_with_the_peak_it_allows():
    config = micro_config()
    config.train.num_steps, config.train.warmup_steps = 3500, 10_000  # small.py's, cut short
    warning = validate.warmup_warning(config.train)
    assert "train.warmup_steps=10000" in warning and "peaks at 9% of" in warning
    config.train.num_steps, config.train.warmup_steps = 1000, 100
    assert validate.warmup_warning(config.train) is None


def test_two_stage_needs_a_switch_inside_the_run_and_a_generator_of_the_discriminators_size():
    config = micro_config()
    config.objective.name = "two_stage"
    with pytest.raises(ConfigError, match="two_stage_steps=0 must be .* from 1 to"):
        validate.check_config(config)
    config.objective.two_stage_steps = 3
    with pytest.raises(ConfigError, match="must be the same size: set generator"):
        validate.check_config(config)  # the micro generator is 1/4 of the width
    config.generator.hidden_fraction = 1.0
    config.model.num_heads, config.model.intermediate_size = 1, 256  # the generator's, at 64
    validate.check_config(config)
    config.objective.two_stage_steps = config.train.num_steps
    with pytest.raises(ConfigError, match="two_stage_steps=6 must be"):
        validate.check_config(config)
    config.objective.two_stage_steps = 3
    config.model.embedding_sharing = "gdes"
    with pytest.raises(ConfigError, match="needs model.embedding_sharing='electra'"):
        validate.check_config(config)


def test_adversarial_warm_start_is_checked():
    config = micro_config()
    config.objective.name = "adversarial"
    validate.check_config(config)  # no warm start: the paper's
    config.objective.mle_warmup_steps = config.train.num_steps
    with pytest.raises(ConfigError, match=r"mle_warmup_steps=6 .*num_steps - 1 = 5"):
        validate.check_config(config)
    config.objective.mle_warmup_steps = 2
    validate.check_config(config)


def test_the_discriminator_mlm_term_is_electras_and_evaluation_needs_whole_heldout_batches():
    config = micro_config()
    config.objective.name, config.objective.disc_mlm_weight = "mlm", 1.0
    with pytest.raises(
        ConfigError, match="to 'electra' and 'electra_mlm' only, and objective.name='mlm'"
    ):
        validate.check_config(config)
    config.objective.disc_mlm_weight, config.objective.unigram_share = 0.0, 0.5
    with pytest.raises(ConfigError, match="of 'electra' only, and objective.name='mlm'"):
        validate.check_config(config)
    config.objective.name = "electra"
    validate.check_config(config)
    config.objective.name, config.objective.unigram_share = "electra_mlm", 0.0
    with pytest.raises(ConfigError, match="'electra_mlm' weights its MLM pass by .*0; set"):
        validate.check_config(config)
    config.objective.disc_mlm_weight = 1.0
    validate.check_config(config)
    config = micro_config()
    config.eval.every_steps = 3
    config.log.every_steps = 2  # no multiple needed: an evaluation writes a row of its own
    validate.check_config(config)
    config.data.heldout_examples = 12  # batch 8
    with pytest.raises(ConfigError, match="not a positive multiple of the evaluation"):
        validate.check_config(config)
    config.eval.batch_size = 4
    validate.check_config(config)
    config.data.heldout_examples = 0
    with pytest.raises(ConfigError, match="data.heldout_examples=0 is not a positive"):
        validate.check_config(config)
    config.eval.every_steps = 0  # no evaluation: no held-out rows needed
    validate.check_config(config)


def test_keep_every_steps_must_be_a_multiple_of_the_save_interval():
    config = micro_config()
    config.checkpoint.every_steps = 10
    config.checkpoint.keep_every_steps = 25
    with pytest.raises(ConfigError, match="not a multiple of checkpoint.every_steps=10"):
        validate.check_config(config)
    config.checkpoint.keep_every_steps = 30
    validate.check_config(config)


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("train.learning_rate", 1e-30, "train.learning_rate=1e-30 must be in [1e-09, 10]: an Adam"),
        ("train.learning_rate", 1e30, "train.learning_rate=1e+30 must be in [1e-09, 10]"),
        ("train.adam_eps", 1e-45, "train.adam_eps=1e-45 must be in [1e-30, 1]: it divides"),
        ("model.layer_norm_eps", 1e-40, "model.layer_norm_eps=1e-40 must be in [1e-30, 1]"),
        ("model.initializer_range", 1e-40, "model.initializer_range=1e-40 must be in [1e-30"),
        ("train.clip_norm", 1e-40, "train.clip_norm=1e-40 must be in [1e-30, 1e+30]"),
        ("model.dropout_rate", 1 - 1e-12, "model.dropout_rate=0.999999999999 must be in [0, 0.99"),
        ("model.attention_dropout_rate", 1 - 1e-12, "model.attention_dropout_rate=0.99999"),
        ("objective.disc_weight", 1e30, "objective.disc_weight=1e+30 must be in [0, 1e+06]"),
        ("objective.gen_weight", 1e7, "objective.gen_weight=10000000.0 must be in [0, 1e+06]"),
        ("train.num_steps", 2**31, "train.num_steps=2147483648 must be in [1, 2147483647]"),
        ("train.warmup_steps", 2**40, "train.warmup_steps=1099511627776 must be in [0, 21474"),
        ("train.adam_b2", 1 - 1e-9, "train.adam_b2=0.999999999 rounds to 1.0 in float32"),
        ("train.adam_b1", 1 - 1e-8, "train.adam_b1=0.99999999 rounds to 1.0 in float32"),
        ("train.generator_lr_scale", 1e-20, "train.generator_lr_scale=1e-20 gives the generator"),
        ("train.weight_decay", 1e4, "train.weight_decay=10000.0 x train.learning_rate="),
    ],
)
def test_settings_meaningless_in_float32_are_refused_with_their_range(key, value, expected):
    """Finite for Python, but 0, 1 or inf (or everything drowned) in the device's float32."""
    config = micro_config()
    section, name = key.split(".")
    with config.unlocked():
        config[section][name] = value
    with pytest.raises(ConfigError) as e:
        validate.check_config(config)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


def test_the_edges_of_the_float32_ranges_are_accepted():
    config = micro_config()
    with config.unlocked():
        config.train.learning_rate = 1e-9
        config.train.adam_eps = 1e-30
        config.train.adam_b2 = 0.9999999
        config.model.dropout_rate = 0.999999999
        config.objective.disc_weight = 1e6
    validate.check_config(config)


@pytest.mark.parametrize("name", ["tiny", "small", "base", "large"])
def test_the_shipped_configs_are_within_every_range(name):
    from tests.conftest import load_config

    validate.check_config(load_config(name))


def test_a_float32_range_through_the_command_is_one_line():
    from tests.conftest import error_line, run_command

    out = run_command(
        "electra_jax.train",
        "--config=configs/tiny.py",
        "--config.model.layer_norm_eps=1e-300",
        "--dry_run",
        "--nocompile",
    )
    assert error_line(out, only=True).startswith(
        "error: model.layer_norm_eps=1e-300 must be in [1e-30, 1]: it is added to the variance"
    )
