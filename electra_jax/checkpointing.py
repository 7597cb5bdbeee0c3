"""Orbax checkpoints in WORKDIR/checkpoints/<step>/: the train state and the input iterator.

What is saved: params, optimizer state, step and the run's base RNG key (all in `state`), and the
Grain iterator's position (`data`, one small JSON per process). Restoring both puts the run
exactly where it stopped: the next batch and the next step's random stream are the ones the
uninterrupted run would have used. Saves are asynchronous; orbax writes each step into a
temporary folder and renames it when complete, so a crash mid-save never leaves a checkpoint
that looks finished.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used."""


def make_manager(workdir: str, checkpoint_cfg: Any) -> ocp.CheckpointManager:
    """A manager that keeps the newest `checkpoint.keep` steps."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint_cfg.keep,
        enable_async_checkpointing=True,
        create=True,
    )
    return ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), "checkpoints"),
        options=options,
        item_names=("state", "data"),
    )


def save(manager: ocp.CheckpointManager, step: int, state: Any, data_iter: Any) -> bool:
    """Starts an asynchronous save of `state` and the iterator's position at `step`."""
    return manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iter),
        ),
        force=True,
    )


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs that tell orbax where each restored array goes."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
    )


def restore_latest(manager: ocp.CheckpointManager, abstract_state: Any, data_iter: Any):
    """Restores the newest checkpoint into (state, iterator); returns None when there is none."""
    step = manager.latest_step()
    if step is None:
        return None
    try:
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=grain.checkpoint.CheckpointRestore(data_iter),
            ),
        )
    except Exception as e:  # orbax raises many types; name the folder and keep it intact
        path = os.path.join(str(manager.directory), str(step))
        raise CheckpointError(
            f"checkpoint {path} could not be restored ({type(e).__name__}: {e}); "
            f"it was left untouched: move it aside to resume from an earlier step"
        ) from e
    return restored["state"]
