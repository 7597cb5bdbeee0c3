"""Layer-wise learning-rate decay: the exact multipliers, and the optimizer applying them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.finetune import glue_heads
from electra_jax.model import layer_stack
from electra_jax.model.networks import ElectraSpec, EncoderSpec
from electra_jax.model.optim import layerwise_lr_multipliers, make_finetune_optimizer


def _spec(num_layers=2, embedding_size=16, scan_layers=True):
    enc = EncoderSpec(hidden_size=32, num_layers=num_layers, num_heads=2, intermediate_size=64)
    return ElectraSpec(
        vocab_size=50,
        embedding_size=embedding_size,
        max_position_embeddings=16,
        type_vocab_size=2,
        discriminator=enc,
        generator=enc,
        scan_layers=scan_layers,
    )


# Hand-computed multipliers, top layer first: ours give the top layer `decay` and the embeddings
# decay^(N+1); the original code's (depth 0 embeddings, i + 1 layer i, N + 2 head, each scaled
# by decay^(N + 2 - depth)) one factor more below the head.
@pytest.mark.parametrize(
    "num_layers,decay,exponents,layers_top_down,embeddings",
    [
        (2, 0.8, "electra_jax", [0.8, 0.64], 0.512),
        (2, 0.8, "original", [0.64, 0.512], 0.4096),
        (3, 0.5, "electra_jax", [0.5, 0.25, 0.125], 0.0625),
        (3, 0.5, "original", [0.25, 0.125, 0.0625], 0.03125),
    ],
)
@pytest.mark.parametrize("scan_layers", [True, False])
def test_multipliers(num_layers, decay, exponents, layers_top_down, embeddings, scan_layers):
    model = glue_heads.Classifier(_spec(num_layers, scan_layers=scan_layers), 3)
    params = jax.eval_shape(functools.partial(glue_heads.init_params, model), jax.random.PRNGKey(0))
    m = layerwise_lr_multipliers(params, num_layers, decay, exponents)
    if scan_layers:
        # One factor per layer on the leading axis, broadcast over the rest of the leaf.
        stacked = jax.tree_util.tree_leaves(m["discriminator"]["layers"])
        assert {np.shape(v)[0] for v in stacked} == {num_layers}
        assert all(np.size(v) == num_layers for v in stacked)
        m = {**m, "discriminator": layer_stack.unstack(m["discriminator"])}
    flat = {
        jax.tree_util.keystr(p): float(np.squeeze(v))
        for p, v in jax.tree_util.tree_leaves_with_path(m)
    }

    def values(prefix):
        found = [v for k, v in flat.items() if k.startswith(prefix)]
        assert found, prefix
        return found

    assert values("['classifier']") == [1.0, 1.0]  # the task head learns at the full rate
    for i, expected in enumerate(reversed(layers_top_down)):
        assert values(f"['discriminator']['layer_{i}']") == pytest.approx([expected] * 12)
    assert values("['embeddings']") == pytest.approx([embeddings] * 5)
    # E != H: the projection to the hidden width belongs with the embeddings.
    assert values("['discriminator']['embeddings_project']") == pytest.approx([embeddings] * 2)
    assert len(flat) == 2 + 12 * num_layers + 5 + 2


def test_unknown_exponents_are_refused():
    with pytest.raises(ValueError, match=r"exponents='bert'; use 'electra_jax' or 'original'"):
        layerwise_lr_multipliers({"classifier": {"bias": 0.0}}, 2, 0.8, "bert")


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
