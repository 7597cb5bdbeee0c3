"""Layer-wise learning-rate decay: the exact multipliers, and the optimizer applying them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.finetune import heads
from electra_jax.model import ElectraSpec, EncoderSpec
from electra_jax.optim import layerwise_lr_multipliers, make_finetune_optimizer


def _spec(embedding_size=16):
    enc = EncoderSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return ElectraSpec(
        vocab_size=50,
        embedding_size=embedding_size,
        max_position_embeddings=16,
        type_vocab_size=2,
        discriminator=enc,
        generator=enc,
    )


def test_multipliers_for_two_layers():
    model = heads.Classifier(_spec(), 3)
    params = jax.eval_shape(functools.partial(heads.init_params, model), jax.random.PRNGKey(0))
    m = layerwise_lr_multipliers(params, num_layers=2, decay=0.8)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(m)}

    def values(prefix):
        found = [v for k, v in flat.items() if k.startswith(prefix)]
        assert found, prefix
        return found

    assert values("['classifier']") == [1.0, 1.0]
    assert values("['discriminator']['layer_1']") == pytest.approx([0.8] * 12)
    assert values("['discriminator']['layer_0']") == pytest.approx([0.8**2] * 12)
    assert values("['embeddings']") == pytest.approx([0.8**3] * 5)
    # E != H: the projection to the hidden width belongs with the embeddings.
    assert values("['discriminator']['embeddings_project']") == pytest.approx([0.8**3] * 2)
    assert len(flat) == 2 + 24 + 5 + 2


def test_update_is_scaled_per_parameter():
    params = {"classifier": {"kernel": jnp.ones((2, 2))}, "embeddings": {"w": jnp.ones((2,))}}
    grads = {"classifier": {"kernel": jnp.full((2, 2), 0.3)}, "embeddings": {"w": jnp.full(2, 0.3)}}
    mults = {"classifier": {"kernel": 1.0}, "embeddings": {"w": 0.25}}
    ones = jax.tree_util.tree_map(lambda _: 1.0, mults)
    updates = []
    for m in (mults, ones):
        tx, schedule = make_finetune_optimizer(1e-2, 10, 2, m, weight_decay=0.0)
        updates.append(tx.update(grads, tx.init(params), params)[0])
        assert schedule(1) == pytest.approx(1e-2 * 0.5 * 0.9)  # warm-up x linear decay
    np.testing.assert_allclose(updates[0]["embeddings"]["w"], 0.25 * updates[1]["embeddings"]["w"])
    np.testing.assert_allclose(
        updates[0]["classifier"]["kernel"], updates[1]["classifier"]["kernel"]
    )
