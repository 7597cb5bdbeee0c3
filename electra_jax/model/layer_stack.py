"""The two layouts of an encoder's layers, and the conversion between them.

Stacked (`model.ElectraSpec.scan_layers`, the default): an encoder's parameters hold one subtree
`layers` whose every leaf has a leading [num_layers] axis, the layout `nn.scan` builds and
compiles once. Unrolled: subtrees `layer_0` ... `layer_{N-1}`, one per layer, the layout of
checkpoints written before layers were scanned and of every per-layer file format (Hugging
Face's `encoder.layer.{i}`, Google's `encoder/layer_{i}`).

The functions work on any pytree whose encoders are plain dicts (parameters, optimizer moments,
per-parameter multipliers, ShapeDtypeStructs), so a tree in either layout can be read in the
other. Pure functions; no jax arrays are created beyond the slices and stacks asked for.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from electra_jax.model.networks import LAYERS

_LAYER = re.compile(r"layer_(\d+)")


def layer_key(index: int) -> str:
    """The unrolled layout's name of layer `index` (0-based)."""
    return f"layer_{index}"


def _is_stacked_encoder(node: Any) -> bool:
    return isinstance(node, dict) and LAYERS in node


def _is_unrolled_encoder(node: Any) -> bool:
    return isinstance(node, dict) and layer_key(0) in node


def _stack_leaves(*leaves):
    if isinstance(leaves[0], jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(leaves), *leaves[0].shape), leaves[0].dtype)
    if isinstance(leaves[0], np.ndarray | np.generic | float | int):
        return np.stack([np.asarray(x) for x in leaves])
    return jax.numpy.stack(leaves)


def _slice_leaf(leaf, index: int):
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    return leaf[index]


def num_stacked(encoder: dict) -> int:
    """The leading axis of a stacked encoder's `layers` leaves: its number of layers."""
    return int(jax.tree_util.tree_leaves(encoder[LAYERS])[0].shape[0])


def unstack(tree: Any) -> Any:
    """`tree` with every stacked encoder's `layers` [N, ...] split into `layer_0` ... [...];
    an unrolled tree comes back unchanged."""

    def convert(node):
        if not _is_stacked_encoder(node):
            return node
        out = {k: v for k, v in node.items() if k != LAYERS}
        for i in range(num_stacked(node)):
            out[layer_key(i)] = jax.tree_util.tree_map(
                lambda x, i=i: _slice_leaf(x, i), node[LAYERS]
            )
        return out

    return jax.tree_util.tree_map(convert, tree, is_leaf=_is_stacked_encoder)


def stack(tree: Any) -> Any:
    """`tree` with every unrolled encoder's `layer_0` ... `layer_{N-1}` stacked into `layers`
    [N, ...]; a stacked tree comes back unchanged. The layers must run 0..N-1 without a gap."""

    def convert(node):
        if not _is_unrolled_encoder(node):
            return node
        indices = sorted(int(m.group(1)) for k in node if (m := _LAYER.fullmatch(k)))
        if indices != list(range(len(indices))):
            raise ValueError(f"layers {indices} do not run from 0 without a gap")
        out = {k: v for k, v in node.items() if not _LAYER.fullmatch(k)}
        layers = [node[layer_key(i)] for i in indices]
        out[LAYERS] = jax.tree_util.tree_map(_stack_leaves, *layers)
        return out

    return jax.tree_util.tree_map(convert, tree, is_leaf=_is_unrolled_encoder)


def to_layout(tree: Any, scan_layers: bool) -> Any:
    """`tree` in the layout `scan_layers` names (stacked if True, unrolled if False)."""
    return stack(tree) if scan_layers else unstack(tree)
