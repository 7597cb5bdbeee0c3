"""The device mesh and how arrays are laid out on it.

Axes: 'data' (pure data parallelism) and 'fsdp' (data parallelism whose devices may also hold a
shard of the parameters). The batch is always split over both. Parameters are replicated for
now (`mesh.fsdp` = 1).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


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


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows [B_local, L] -> global arrays [B, L] sharded over the batch axes."""
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }
