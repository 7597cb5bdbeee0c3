"""The device mesh and how arrays are laid out on it.

Axes: 'data' (pure data parallelism) and 'fsdp' (data parallelism whose devices also hold a
shard of the parameters). The batch is always split over both. With `mesh.fsdp` = 1 parameters
and optimizer state are replicated; with N > 1 every matrix is split over 'fsdp' along its
`embed` axis (the model width, see model.py's logical axis names), and jit's partitioner gathers
each layer's weights just before use and reduce-scatters its gradients: ZeRO-3 / FSDP, with the
parameters, gradients and both Adam moments costing 1/N of their size per device.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")

# Logical parameter axis -> mesh axis. Only the model width is sharded: it divides every matrix
# (vocab does not divide evenly, heads can be fewer than devices), and one axis keeps the
# gathers simple. Everything unnamed here (vocab, mlp, heads, kv, embed_out) stays whole.
FSDP_RULES = (("embed", "fsdp"),)


def make_mesh(mesh_cfg: Any, devices=None) -> Mesh:
    """A ('data', 'fsdp') mesh over all devices; `mesh_cfg.fsdp` N or -1 (all) sizes 'fsdp'."""
    devices = list(jax.devices() if devices is None else devices)
    fsdp = mesh_cfg.fsdp if mesh_cfg.fsdp > 0 else len(devices)
    if len(devices) % fsdp:
        raise ValueError(f"mesh.fsdp={mesh_cfg.fsdp} does not divide {len(devices)} devices")
    grid = np.asarray(devices).reshape(len(devices) // fsdp, fsdp)
    return Mesh(grid, BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over every device."""
    return NamedSharding(mesh, P(BATCH_AXES))


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
    """[K, B, ...] batches of K consecutive steps: the second (batch) dimension split."""
    return NamedSharding(mesh, P(None, BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def param_shardings(logical_axes: Any, abstract_params: Any, mesh: Mesh) -> Any:
    """NamedShardings for the parameters from their logical axis names.

    logical_axes: model.param_logical_axes' tree; abstract_params: the same tree of shapes.
    A dimension the 'fsdp' size does not divide stays whole (that parameter is replicated).
    """
    fsdp = mesh.shape["fsdp"]
    rules = dict(FSDP_RULES) if fsdp > 1 else {}

    def one(names: P, shaped) -> NamedSharding:
        axes = [rules.get(n) if n is not None else None for n in names]
        axes += [None] * (len(shaped.shape) - len(axes))
        for dim, axis in zip(shaped.shape, axes, strict=True):
            if axis is not None and dim % mesh.shape[axis]:
                return NamedSharding(mesh, P())
        return NamedSharding(mesh, P(*axes))

    return jax.tree_util.tree_map(
        one, logical_axes, abstract_params, is_leaf=lambda x: isinstance(x, P)
    )


def state_shardings(abstract_state: Any, params_sharding: Any, mesh: Mesh) -> Any:
    """Shardings for a train state: anything shaped like the parameters inside it (the params,
    Adam's moments) is laid out like them; counters, steps and keys are replicated."""
    params_def = jax.tree_util.tree_structure(params_sharding)

    def like_params(node) -> bool:
        return isinstance(node, dict) and jax.tree_util.tree_structure(node) == params_def

    return jax.tree_util.tree_map(
        lambda node: params_sharding if like_params(node) else replicated(mesh),
        abstract_state,
        is_leaf=like_params,
    )


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows [B_local, L] -> global arrays [B, L] sharded over the batch axes."""
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }


def global_batches(local_batches: list[dict[str, np.ndarray]], mesh: Mesh) -> dict[str, jax.Array]:
    """K consecutive steps' local batches -> global arrays [K, B, L] (stacked_batch_sharding)."""
    sharding = stacked_batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.stack([b[k] for b in local_batches]))
        for k in local_batches[0]
    }
