"""Orbax checkpoints in WORKDIR/checkpoints/<step>/: the train state and the input iterator.

What is saved: params, optimizer state, step and the run's base RNG key (all in `state`), and the
Grain iterator's position (`data`, one small JSON per process). Restoring both puts the run
exactly where it stopped: the next batch and the next step's random stream are the ones the
uninterrupted run would have used.

Saves are asynchronous; orbax writes each step into a temporary folder and renames it when
complete, so a crash mid-save never leaves a checkpoint that looks finished (the temporary folders
of a killed save are removed when the next run opens the manager). A finished checkpoint that
still cannot be restored (a truncated or deleted file) is renamed `<step>.corrupt`, which orbax
does not take for a step, and the previous one is used: nothing unreadable is ever deleted.

Preemption: `PreemptionWatcher` turns SIGTERM / SIGINT into a request that the loop honours after
the current step (save, then exit 0); on multi-host runs every process stops at the same step.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

CORRUPT_SUFFIX = ".corrupt"


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used."""


class Preempted(BaseException):
    """A termination signal arrived before training started: there is nothing new to save.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way (e.g. the
    restore's, which would take it for a damaged checkpoint) swallows it.
    """


def make_manager(workdir: str, checkpoint_cfg: Any) -> ocp.CheckpointManager:
    """A manager that keeps the newest `checkpoint.keep` steps."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint_cfg.keep,
        enable_async_checkpointing=True,
        create=True,
        # A save killed half-way leaves `<step>.orbax-checkpoint-tmp-*`; never a step, but clutter.
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(
        checkpoint_dir(workdir),
        options=options,
        item_names=("state", "data"),
    )


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), "checkpoints")


def has_checkpoints(workdir: str) -> bool:
    """Whether WORKDIR/checkpoints holds any finished step (without opening a manager)."""
    directory = checkpoint_dir(workdir)
    return os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory))


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


def _move_aside(manager: ocp.CheckpointManager, step: int) -> str:
    """Renames checkpoints/<step> to <step>.corrupt (or .corrupt.1, ...); returns the new path."""
    src = os.path.join(str(manager.directory), str(step))
    dst = src + CORRUPT_SUFFIX
    n = 0
    while os.path.exists(dst):
        n += 1
        dst = f"{src}{CORRUPT_SUFFIX}.{n}"
    if jax.process_index() == 0:
        os.rename(src, dst)
    if jax.process_count() > 1:
        # Every process must see the rename before any of them lists the steps again.
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"electra_jax_move_aside_{step}")
    manager.reload()
    return dst


def restore_latest(
    manager: ocp.CheckpointManager, abstract_state: Any, data_iter: Any, log=print
) -> Any:
    """Restores the newest readable checkpoint into (state, iterator); None when there is none.

    A checkpoint that fails to restore is moved aside to `<step>.corrupt` with a warning (`log`
    gets one line naming the step) and the next older one is tried. Raises CheckpointError when
    checkpoints exist but none can be restored; they are all kept, renamed, for inspection.
    """
    failed: list[str] = []
    while (step := manager.latest_step()) is not None:
        try:
            restored = manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=grain.checkpoint.CheckpointRestore(data_iter),
                ),
            )
            return restored["state"]
        except Exception as e:  # orbax and tensorstore raise many types for damaged files
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            moved = _move_aside(manager, step)
            failed.append(moved)
            log(
                f"warning: checkpoint {step} cannot be restored ({reason}); moved it to {moved} "
                "and trying the previous one"
            )
    if failed:
        raise CheckpointError(
            f"no checkpoint in {manager.directory} can be restored (moved aside: "
            f"{', '.join(failed)}); inspect them, or use a new --workdir to start over"
        )
    return None


class PreemptionWatcher:
    """SIGTERM / SIGINT -> "save after this step and exit", agreed by every process.

    Before `arm()` (data preparation, compilation) a signal raises `Preempted` at once: there is
    no new work to save and startup can take minutes. After `arm()` the first signal only sets a
    flag that `requested(step)` reports after the step in flight; a second one interrupts at once
    (KeyboardInterrupt) for users who really mean it. Multi-host runs ask jax's preemption sync
    point instead, which the coordination service triggers on SIGTERM and which returns True on
    every process at the same step; Python handlers are then left out, as they would replace the
    service's own SIGTERM handler.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self._flag = False
        self._armed = False
        self._previous: dict[int, Any] = {}
        self.multihost = jax.process_count() > 1
        if self.multihost or threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works in the main thread (e.g. not in a notebook worker)
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if not self._armed:
            raise Preempted(f"{signal.Signals(signum).name} before training started")
        if self._flag:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
        self._flag = True

    def arm(self) -> None:
        """From now on a signal is honoured after the current step rather than at once."""
        self._armed = True

    def requested(self, step: int) -> bool:
        """Whether to stop after `step`; on multi-host runs the same answer on every process."""
        if self.multihost:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return self._flag

    def close(self) -> None:
        """Puts the previous signal handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
