"""hf/names.py: every parameter's transformers name and layout, against transformers itself."""

import jax
import numpy as np
import pytest

from electra_jax.errors import PretrainedError
from electra_jax.hf import names
from electra_jax.hf.electra_config import hf_config
from electra_jax.model.networks import Electra, init_params, spec_from_config
from tests.conftest import micro_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_CLASSES = {
    names.DISCRIMINATOR: transformers.ElectraForPreTraining,
    names.GENERATOR: transformers.ElectraForMaskedLM,
}


def _spec(scan_layers=False):
    cfg = micro_config()
    cfg.model.scan_layers = scan_layers
    return spec_from_config(cfg.model, cfg.generator, cfg.data.vocab_size)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_our_tensors_are_transformers_state_dicts_and_come_back_unchanged(scan_layers):
    """params_to_hf gives, per network, exactly the keys and shapes transformers' own model of
    that config has (its tied output weight aside); params_from_hf returns our tree bit for
    bit, in either layer layout."""
    spec = _spec(scan_layers)
    params = jax.device_get(init_params(Electra(spec), jax.random.PRNGKey(0)))
    tensors = names.params_to_hf(params, spec)
    for network, cls in HF_CLASSES.items():
        config = transformers.ElectraConfig(**hf_config(spec, network, pad_id=0))
        theirs = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
        ours = {k: v.shape for k, v in tensors[network].items()}
        tied = {"generator_lm_head.weight"}  # the word embeddings, tied in transformers
        assert {k: v for k, v in theirs.items() if k not in tied} == ours, network
    back = names.params_from_hf(tensors, spec, {n: n for n in names.NETWORKS})
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(x, y)
    assert jax.tree.structure(params) == jax.tree.structure(back)


def test_transformers_loads_our_tensors_without_missing_or_unexpected_keys():
    spec = _spec()
    params = jax.device_get(init_params(Electra(spec), jax.random.PRNGKey(1)))
    state = names.params_to_hf(params, spec)[names.DISCRIMINATOR]
    config = transformers.ElectraConfig(**hf_config(spec, names.DISCRIMINATOR, pad_id=0))
    model = transformers.ElectraForPreTraining(config)
    torch_state = {k: torch.from_numpy(v.copy()) for k, v in state.items()}
    result = model.load_state_dict(torch_state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    loaded = model.state_dict()["electra.embeddings.word_embeddings.weight"].numpy()
    np.testing.assert_array_equal(loaded, params["embeddings"]["word_embeddings"]["embedding"])


def test_a_missing_or_misshapen_tensor_is_one_line():
    spec = _spec()
    params = jax.device_get(init_params(Electra(spec), jax.random.PRNGKey(0)))
    tensors = names.params_to_hf(params, spec)
    where = {n: f"folder/{n}" for n in names.NETWORKS}
    key = "electra.encoder.layer.1.output.dense.weight"
    gone = {**tensors, names.DISCRIMINATOR: dict(tensors[names.DISCRIMINATOR])}
    del gone[names.DISCRIMINATOR][key]
    with pytest.raises(PretrainedError, match=f"folder/discriminator has no tensor {key}"):
        names.params_from_hf(gone, spec, where)
    gone[names.DISCRIMINATOR][key] = tensors[names.DISCRIMINATOR][key]
    # A tensor that cannot take its place (a dense one's shape is checked by read_hf's
    # check_params, once the tree is whole).
    query = "electra.encoder.layer.0.attention.self.query.weight"
    gone[names.DISCRIMINATOR][query] = np.zeros((3, 3), np.float32)
    with pytest.raises(PretrainedError, match=r"query.weight has shape \(3, 3\), which its"):
        names.params_from_hf(gone, spec, where)
