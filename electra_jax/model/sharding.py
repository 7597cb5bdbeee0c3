"""The device mesh and how arrays are laid out on it.

Axes: 'data' (pure data parallelism) and 'fsdp' (data parallelism whose devices also hold a
shard of the parameters). The batch is always split over both. With `mesh.fsdp` = 1 parameters
and optimizer state are replicated; with N > 1 every matrix is split over 'fsdp' along its
`embed` axis (the model width, see networks.py's logical axis names), and jit's partitioner gathers
each layer's weights just before use and reduce-scatters its gradients: ZeRO-3 / FSDP, with the
parameters, gradients and both Adam moments costing 1/N of their size per device.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from electra_jax.data import progress

BATCH_AXES = ("data", "fsdp")


def log(message: str) -> None:
    """A progress line from process 0, which speaks for the run's processes (both wings')."""
    if jax.process_index() == 0:
        progress.print_line(message)


# Logical parameter axis -> mesh axis. Only the model width is sharded: it divides every matrix
# (vocab does not divide evenly, heads can be fewer than devices), and one axis keeps the
# gathers simple. Everything unnamed here (vocab, mlp, heads, kv, embed_out) stays whole.
FSDP_RULES = (("embed", "fsdp"),)


def num_slices(devices) -> int:
    """How many slices (TPU pods joined over the data-center network) the devices span; 1 for
    devices without a slice index (CPUs, GPUs, a single TPU slice)."""
    return len({getattr(d, "slice_index", 0) or 0 for d in devices})


def make_mesh(mesh_cfg: Any, devices=None) -> Mesh:
    """A ('data', 'fsdp') mesh over all devices; `mesh_cfg.fsdp` N or -1 (all of a slice's)
    sizes 'fsdp'.

    Laid out by jax's mesh helpers, which follow the TPU's physical torus (neighbours in a row
    are neighbours on the chip grid). Across slices (`create_hybrid_device_mesh`) 'data' spans
    the slices and every 'fsdp' row stays inside one slice, so that FSDP's gathers ride the
    slice's fast interconnect and only the gradients' all-reduce crosses the slower network
    between slices. On CPUs and GPUs the order is jax.devices()'s.
    """
    devices = list(jax.devices() if devices is None else devices)
    slices = num_slices(devices)
    per_slice = len(devices) // slices
    fsdp = mesh_cfg.fsdp if mesh_cfg.fsdp > 0 else per_slice
    if len(devices) % fsdp:
        raise ValueError(f"mesh.fsdp={mesh_cfg.fsdp} does not divide {len(devices)} devices")
    if per_slice % fsdp:
        raise ValueError(
            f"mesh.fsdp={mesh_cfg.fsdp} does not divide the {per_slice} devices of each of the "
            f"{slices} slices (an fsdp group stays within one slice)"
        )
    if slices == 1:
        grid = mesh_utils.create_device_mesh(
            (len(devices) // fsdp, fsdp), devices, allow_split_physical_axes=True
        )
    else:
        grid = mesh_utils.create_hybrid_device_mesh(
            (per_slice // fsdp, fsdp), (slices, 1), devices, allow_split_physical_axes=True
        )
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

    logical_axes and abstract_params: networks.abstract_params' trees of names and of shapes.
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
