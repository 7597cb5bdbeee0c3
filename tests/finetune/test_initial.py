"""finetune/initial.py: the network a fine-tuning starts from."""

import functools

import jax
import numpy as np

from electra_jax.finetune import initial
from electra_jax.model.networks import Electra, ElectraSpec, EncoderSpec, init_params
from tests.finetune.test_loop import _config


def test_a_gdes_run_is_fine_tuned_from_its_discriminators_own_embeddings(tmp_path, monkeypatch):
    enc = EncoderSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    spec = ElectraSpec(40, 16, 32, 2, enc, EncoderSpec(8, 1, 1, 32), embedding_sharing="gdes")
    shapes = jax.eval_shape(functools.partial(init_params, Electra(spec)), jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(
        lambda x: rng.normal(0, 0.02, x.shape).astype(np.float32), shapes
    )
    fake = type("Pretrained", (), dict(spec=spec, params=params, tokenizer=None, source="fake"))
    monkeypatch.setattr(initial, "_load_pretrained", lambda path: fake)
    config = _config(tmp_path, init_from="fake")
    start = initial.initial_model(config, [], str(tmp_path))
    base, delta = params["embeddings"], params["embeddings_delta"]
    got = start.encoder_params["embeddings"]
    np.testing.assert_array_equal(
        got["word_embeddings"]["embedding"],
        base["word_embeddings"]["embedding"] + delta["word_embeddings"]["embedding"],
    )
    np.testing.assert_array_equal(got["LayerNorm"]["scale"], delta["LayerNorm"]["scale"])
    assert start.spec.embedding_sharing == "electra" and not start.spec.mlm_head
