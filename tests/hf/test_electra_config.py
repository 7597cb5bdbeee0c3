"""hf/config.py: transformers' ElectraConfig from a spec, and a spec from one (checked)."""

import dataclasses

import pytest

from electra_jax.errors import PretrainedError
from electra_jax.hf import electra_config as hf_config_lib
from electra_jax.hf.names import DISCRIMINATOR, GENERATOR
from electra_jax.model.networks import generator_spec, spec_from_config
from tests.conftest import micro_config

WHERE = {DISCRIMINATOR: "d", GENERATOR: "g"}  # the folders


def _spec():
    cfg = micro_config()
    return spec_from_config(cfg.model, cfg.generator, cfg.data.vocab_size)


def test_a_spec_goes_to_transformers_and_comes_back():
    transformers = pytest.importorskip("transformers")
    spec = _spec()
    disc, gen = (hf_config_lib.hf_config(spec, n, pad_id=0) for n in (DISCRIMINATOR, GENERATOR))
    # transformers reads them as they are, and keeps every size.
    loaded = transformers.ElectraConfig(**gen)
    assert (loaded.hidden_size, loaded.num_attention_heads) == (
        spec.generator.hidden_size,
        spec.generator.num_heads,
    )
    assert loaded.embedding_size == spec.embedding_size and loaded.hidden_act == "gelu"
    back = hf_config_lib.spec_from_hf(disc, gen, WHERE)
    fields = ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size")
    assert all(getattr(back, f) == getattr(spec, f) for f in fields)
    assert back.discriminator == spec.discriminator and back.generator == spec.generator
    assert (back.dropout_rate, back.layer_norm_eps) == (spec.dropout_rate, spec.layer_norm_eps)


def test_without_a_generator_config_the_generator_is_the_papers_small_one():
    spec = _spec()
    disc = hf_config_lib.hf_config(spec, DISCRIMINATOR, pad_id=0)
    back = hf_config_lib.spec_from_hf(disc, None, WHERE)
    assert back.generator == generator_spec(
        spec.discriminator, hf_config_lib.DEFAULT_GENERATOR_FRACTION
    )


@pytest.mark.parametrize(
    "network,field,value,match",
    [
        (DISCRIMINATOR, "hidden_size", 0, "d/config.json: hidden_size is 0; it must be a whole"),
        (DISCRIMINATOR, "num_hidden_layers", "2", "num_hidden_layers is '2'"),
        (DISCRIMINATOR, "hidden_dropout_prob", 1.5, "hidden_dropout_prob"),
        (GENERATOR, "vocab_size", 301, "g: vocab_size=301 but the discriminator's"),
    ],
)
def test_a_bad_field_is_one_line_naming_the_file(network, field, value, match):
    spec = _spec()
    configs = {n: hf_config_lib.hf_config(spec, n, pad_id=0) for n in (DISCRIMINATOR, GENERATOR)}
    configs[network] = dict(configs[network], **{field: value})
    with pytest.raises(PretrainedError, match=match):
        hf_config_lib.spec_from_hf(configs[DISCRIMINATOR], configs[GENERATOR], WHERE)


def test_the_written_config_follows_the_spec_not_a_default():
    spec = dataclasses.replace(_spec(), layer_norm_eps=1e-6, dropout_rate=0.0)
    disc = hf_config_lib.hf_config(spec, DISCRIMINATOR, pad_id=7)
    assert disc["layer_norm_eps"] == 1e-6 and disc["hidden_dropout_prob"] == 0.0
    assert disc["pad_token_id"] == 7 and disc["architectures"] == ["ElectraForPreTraining"]
