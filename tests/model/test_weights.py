"""weights: the size, spec and parameter checks every reader of a pre-trained model applies."""

import dataclasses

import jax
import pytest

from electra_jax.model import weights
from electra_jax.model.networks import Electra, init_params, spec_from_config
from tests.conftest import micro_config


def _spec():
    cfg = micro_config()
    return spec_from_config(cfg.model, cfg.generator, cfg.data.vocab_size)


def test_a_size_is_a_whole_number_within_its_limit():
    assert weights.check_size(64, "model.hidden_size", "hidden_size", "w/config.json") == 64
    top = weights.SIZE_LIMITS["num_layers"]
    assert weights.check_size(top, "num_layers", "num_layers", "f") == top
    for bad in (0, -1, top + 1, 2.0, True, "64", None):
        with pytest.raises(weights.PretrainedError) as e:
            weights.check_size(bad, "num_layers", "num_layers", "w/config.json")
        message = str(e.value)
        assert message.startswith(f"w/config.json: num_layers is {bad!r}; it must be a whole")
        assert f"from 1 to {top}" in message and "\n" not in message


def test_a_spec_is_checked_before_anything_is_allocated():
    spec = _spec()
    weights.check_spec(spec, "w")
    heads = dataclasses.replace(spec.discriminator, num_heads=3)
    with pytest.raises(weights.PretrainedError, match="hidden size 64 is not a multiple of its 3"):
        weights.check_spec(dataclasses.replace(spec, discriminator=heads), "w")
    huge = dataclasses.replace(spec, vocab_size=weights.SIZE_LIMITS["vocab_size"] + 1)
    with pytest.raises(weights.PretrainedError, match="the tokenizer's vocab size is"):
        weights.check_spec(huge, "w")
    for field, value in (("dropout_rate", 1.0), ("layer_norm_eps", 0.0), ("layer_norm_eps", 1e400)):
        with pytest.raises(weights.PretrainedError, match=f"model.{field} is .*not a usable"):
            weights.check_spec(dataclasses.replace(spec, **{field: value}), "w")


def test_the_parameters_must_have_the_specs_tree_and_shapes():
    spec = _spec()
    params = jax.device_get(init_params(Electra(spec), jax.random.PRNGKey(0)))
    abstract = weights.abstract_params(spec)
    shapes = jax.tree.map(lambda x: tuple(x.shape), abstract)
    assert shapes == jax.tree.map(lambda x: tuple(x.shape), params)
    weights.check_params(params, spec, "w")
    bias = params["discriminator_predictions_dense"]
    del params["discriminator_predictions_dense"]
    missing = r"w has no parameter \['discriminator_predictions_dense'\]"
    with pytest.raises(weights.PretrainedError, match=missing):
        weights.check_params(params, spec, "w")
    params["discriminator_predictions_dense"] = jax.tree.map(lambda x: x[..., :1], bias)
    with pytest.raises(weights.PretrainedError, match="has shape .* the model's config implies"):
        weights.check_params(params, spec, "w")
