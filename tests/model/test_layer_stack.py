"""The two layer layouts: conversion both ways, and the same function computed by both."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.hf import names
from electra_jax.model import layer_stack
from electra_jax.model.networks import Electra, init_params, spec_from_config
from tests.conftest import micro_config


def _models(num_layers=3):
    cfg = micro_config()
    cfg.model.num_layers = num_layers
    cfg.model.dropout_rate = cfg.model.attention_dropout_rate = 0.0
    spec = spec_from_config(cfg.model, cfg.generator, 300)
    assert spec.scan_layers  # the configs' default
    unrolled = dataclasses.replace(spec, scan_layers=False)
    return spec, Electra(spec), Electra(unrolled)


def _equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_stacked_params_have_a_leading_layer_axis_and_convert_both_ways():
    spec, scanned, unrolled = _models()
    stacked = init_params(scanned, jax.random.PRNGKey(0))
    for network in ("discriminator", "generator"):
        assert set(stacked[network]) == {"layers", "embeddings_project"}
        for leaf in jax.tree_util.tree_leaves(stacked[network]["layers"]):
            assert leaf.shape[0] == 3
    flat = layer_stack.unstack(stacked)
    assert set(flat["discriminator"]) == {"layer_0", "layer_1", "layer_2", "embeddings_project"}
    # Exactly the tree the unrolled model builds, with layer i's slice of each stacked leaf.
    assert jax.tree_util.tree_structure(flat) == jax.tree_util.tree_structure(
        init_params(unrolled, jax.random.PRNGKey(0))
    )
    np.testing.assert_array_equal(
        flat["discriminator"]["layer_2"]["intermediate"]["kernel"],
        stacked["discriminator"]["layers"]["intermediate"]["kernel"][2],
    )
    _equal(layer_stack.stack(flat), stacked)
    # Each function leaves a tree already in its layout alone.
    _equal(layer_stack.unstack(flat), flat)
    _equal(layer_stack.stack(stacked), stacked)
    # Shapes alone (what orbax and jit take) convert the same way.
    shapes = jax.eval_shape(lambda: stacked)
    assert layer_stack.unstack(shapes)["generator"]["layer_1"]["output"]["kernel"].shape == (
        flat["generator"]["layer_1"]["output"]["kernel"].shape
    )


def test_a_gap_in_the_layers_is_refused():
    tree = {"encoder": {"layer_0": {"w": np.zeros(2)}, "layer_2": {"w": np.zeros(2)}}}
    with pytest.raises(ValueError, match=r"layers \[0, 2\] do not run from 0 without a gap"):
        layer_stack.stack(tree)


def test_both_layouts_compute_the_same_logits_and_gradients():
    _, scanned, unrolled = _models()
    stacked = init_params(scanned, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 300, (2, 16)), jnp.int32)
    seg, mask = jnp.zeros_like(ids), jnp.ones_like(ids).at[1, 10:].set(0)
    positions = jnp.array([[1, 2], [3, 4]])

    def loss(model, params):
        disc = model.apply({"params": params}, ids, seg, mask, method=Electra.discriminator_logits)
        gen = model.apply(
            {"params": params}, ids, seg, mask, positions, method=Electra.generator_logits
        )
        return jnp.sum(disc**2) + jnp.sum(jax.nn.log_softmax(gen)[..., 7])

    a, grads_a = jax.jit(jax.value_and_grad(lambda p: loss(scanned, p)))(stacked)
    b, grads_b = jax.jit(jax.value_and_grad(lambda p: loss(unrolled, p)))(
        layer_stack.unstack(stacked)
    )
    np.testing.assert_allclose(a, b, rtol=1e-6)
    for x, y in zip(
        jax.tree_util.tree_leaves(layer_stack.unstack(grads_a)),
        jax.tree_util.tree_leaves(grads_b),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_the_hugging_face_names_are_the_same_from_either_layout():
    spec, scanned, _ = _models()
    stacked = init_params(scanned, jax.random.PRNGKey(0))
    flat = layer_stack.unstack(stacked)
    unrolled_spec = dataclasses.replace(spec, scan_layers=False)
    a, b = names.params_to_hf(stacked, spec), names.params_to_hf(flat, unrolled_spec)
    assert "electra.encoder.layer.2.output.dense.weight" in a["discriminator"]
    _equal(a, b)
    # Reading them back gives each layout its own tree.
    where = {"discriminator": "d", "generator": "g"}
    _equal(names.params_from_hf(a, spec, where), stacked)
    _equal(names.params_from_hf(a, unrolled_spec, where), flat)
