"""The classifier network: pre-trained subtrees drop in, the losses are the textbook ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.finetune import glue_heads
from electra_jax.model.networks import Electra, ElectraSpec, EncoderSpec, init_params


def _spec(hidden=32):
    enc = EncoderSpec(hidden_size=hidden, num_layers=2, num_heads=2, intermediate_size=64)
    gen = EncoderSpec(hidden_size=8, num_layers=2, num_heads=1, intermediate_size=32)
    return ElectraSpec(
        vocab_size=50,
        embedding_size=16,
        max_position_embeddings=16,
        type_vocab_size=2,
        discriminator=enc,
        generator=gen,
    )


def test_pretrained_subtrees_drop_in_and_shapes_are_checked():
    spec = _spec()
    # Jitted: one compilation instead of one per operation (seconds on 2 cores).
    pretrained = jax.jit(functools.partial(init_params, Electra(spec)))(jax.random.PRNGKey(1))
    model = glue_heads.Classifier(spec, 3)
    abstract = jax.eval_shape(
        functools.partial(glue_heads.init_params, model), jax.random.PRNGKey(0)
    )
    params = glue_heads.with_pretrained(abstract, pretrained)
    assert set(params) == {"embeddings", "discriminator", "classifier"}
    same = jax.tree_util.tree_map(
        np.array_equal, params["discriminator"], pretrained["discriminator"]
    )
    assert all(jax.tree_util.tree_leaves(same))
    c = {"kernel": jnp.linspace(-1, 1, 32 * 3).reshape(32, 3), "bias": jnp.array([0.1, 0.2, 0.3])}
    params["classifier"] = c
    ids = jnp.ones((2, 8), jnp.int32)
    out = jax.jit(model.apply)({"params": params}, ids, ids * 0, ids)
    assert out.shape == (2, 3) and out.dtype == jnp.float32
    # The head reads the pre-trained discriminator's [CLS] state, unchanged.
    hidden = jax.jit(functools.partial(Electra(spec).apply, method=Electra.discriminator_hidden))(
        {"params": pretrained}, ids, ids * 0, ids
    )
    np.testing.assert_allclose(out, hidden[:, 0] @ c["kernel"] + c["bias"], rtol=1e-5, atol=1e-6)
    wider_model = glue_heads.Classifier(_spec(hidden=64), 3)
    wider = jax.eval_shape(
        functools.partial(glue_heads.init_params, wider_model), jax.random.PRNGKey(0)
    )
    with pytest.raises(ValueError, match=r"pre-trained discriminator\[.*\] has shape \(32,\)"):
        glue_heads.with_pretrained(wider, pretrained)


def test_task_losses():
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0]])
    total, count = glue_heads.task_loss(logits, jnp.array([0, 0]), regression=False)
    expected = -np.log(np.exp(2) / (np.exp(2) + 1)) - np.log(1 / (1 + np.e))
    assert float(total) == pytest.approx(expected, rel=1e-6) and float(count) == 2
    total, _ = glue_heads.task_loss(
        jnp.array([[1.0], [3.0]]), jnp.array([1.5, 1.0]), regression=True
    )
    assert float(total) == pytest.approx(0.25 + 4.0)
    assert glue_heads.predictions(logits, False).tolist() == [0, 1]
