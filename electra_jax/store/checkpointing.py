"""Orbax checkpoints in WORKDIR/checkpoints/<step>/: the train state and the input iterator.

What is saved: params, optimizer state, step and the run's base RNG key (all in `state`), and the
input iterator's position with the layout that wrote it (`position`: one small JSON, written by
process 0). Restoring both puts the run exactly where it stopped: the next batch and the next
step's random stream are the ones the uninterrupted run would have used.

Elastic resume: the position is a step counter whose meaning does not depend on the number of
processes (data/pipeline.py: the global batch of step s is the same rows for any process count),
and orbax reads the state into whatever mesh the run has now, so a checkpoint of N processes x D
devices resumes on M x E. Checkpoints written before the `position` item hold the iterator's
state as Grain's per-process files (`data/process_<i>-of-<N>.json`); they resume on N processes
as they were written, and on another count when all N files agree (they do: each holds the step
counter); otherwise the restore refuses in one line naming both layouts (CheckpointLayoutError).
A checkpoint of another layout is never taken for a damaged one.

Saves are asynchronous; orbax writes each step into a temporary folder and renames it when
complete, so a crash mid-save never leaves a checkpoint that looks finished (the temporary folders
of a killed save are removed when the next run opens the manager). A finished checkpoint that
still cannot be restored (a truncated or deleted file) is renamed `<step>.corrupt`, which orbax
does not take for a step, and the previous one is used: nothing unreadable is ever deleted.

What else is in checkpoints/ is left alone (`survey`, before orbax lists the steps): a name orbax
does not take for a step is never touched by it, and the run says in one line that it is there;
one that orbax does take for a step but that is not the run's checkpoint of that step (another
program's folder, a checkpoint renamed or copied by hand) is refused (ForeignFolderError) rather
than restored, set aside as damaged, deleted with the old checkpoints or collided with.

Preemption: `PreemptionWatcher` turns SIGTERM / SIGINT into a request that the loop honours after
the call in flight (save, then exit 0); on multi-host runs every process stops at the same step.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from electra_jax.errors import CheckpointError, Preempted
from electra_jax.store import paths
from electra_jax.store.checkpoint_steps import (  # noqa: F401  (ForeignFolderError: callers' too)
    CORRUPT_SUFFIX,
    POSITION,
    POSITION_FILE,
    ForeignFolderError,
    checkpoint_dir,
    read_position_file,
    renamed,
    saved_steps,
    set_aside,
    survey,
)
from electra_jax.store.jsonio import write_advice

# The item of Grain's per-process iterator files in checkpoints written before POSITION.
_LEGACY_DATA = "data"
_LEGACY_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def preservation_policy(checkpoint_cfg: Any):
    """Which finished checkpoints survive a save: the newest `checkpoint.keep`, and with
    `checkpoint.keep_every_steps` = K > 0 also every step that is a multiple of K (for
    evaluating downstream along a run); orbax deletes the others."""
    newest = policies.LatestN(n=checkpoint_cfg.keep)
    # Pre-training's section has keep_every_steps; fine-tuning's (configs/glue.py) has none.
    every = int(checkpoint_cfg.keep_every_steps) if "keep_every_steps" in checkpoint_cfg else 0
    if every <= 0:
        return newest
    return policies.AnyPreservationPolicy([newest, policies.EveryNSteps(interval_steps=every)])


def make_manager(workdir: str, checkpoint_cfg: Any) -> ocp.CheckpointManager:
    """A manager that keeps what `preservation_policy` says."""
    # Imported here: 0.6 s that the commands which read a checkpoint without a manager (export,
    # load) or refuse before opening one need not pay.
    import grain

    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy(checkpoint_cfg),
        enable_async_checkpointing=True,
        create=True,
        # A save killed half-way leaves `<step>.orbax-checkpoint-tmp-*`; never a step, but clutter.
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(
        checkpoint_dir(workdir),
        options=options,
        # Handlers named up front, so that a step's metadata can be read before any restore.
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            POSITION: ocp.JsonCheckpointHandler(filename=POSITION_FILE),
            # The per-process files of checkpoints written before POSITION (read by hand).
            _LEGACY_DATA: grain.checkpoint.CheckpointHandler(),
        },
    )


def _listed(names: list[str], limit: int = 5) -> str:
    """'a, b and c', or the first `limit` and how many more."""
    if len(names) > limit:
        return f"{', '.join(names[:limit])} and {len(names) - limit} more"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def current_layout() -> dict:
    """This run's layout: {"processes": P, "devices": D} (D over all processes)."""
    return {"processes": jax.process_count(), "devices": jax.device_count()}


def layout_text(layout: dict) -> str:
    """'2 processes x 4 devices' for {"processes": 2, "devices": 8}; a layout whose device
    count is unknown (a checkpoint from before POSITION) is '2 processes'."""
    n = int(layout["processes"])
    text = f"{n} process{'es' if n != 1 else ''}"
    if layout.get("devices") is None:
        return text
    each = int(layout["devices"]) // n
    return f"{text} x {each} device{'s' if each != 1 else ''}"


class CheckpointLayoutError(CheckpointError):
    """A readable checkpoint that this layout (processes x devices) cannot continue exactly:
    not damage, so nothing is moved aside. The message names both layouts."""


class _Damage(Exception):
    """Internal: what makes a checkpoint unreadable, found before orbax reads it."""


def saved_layout(workdir: str) -> tuple[int, dict] | None:
    """(step, layout) of WORKDIR's newest checkpoint, read from its position file without
    opening a manager; the layout of a checkpoint from before POSITION has only "processes"
    (from its per-process files' names). None when there is no checkpoint or its layout cannot
    be read (the restore then decides whether it is damaged)."""
    steps = saved_steps(workdir)
    if not steps:
        return None
    folder = paths.join(checkpoint_dir(workdir), str(steps[-1]))
    try:
        position = read_position_file(folder)
        layout = _legacy_layout(folder) if position is None else dict(position["layout"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if layout is None else (steps[-1], layout)


def saved_goodput(workdir: str, step: int) -> dict | None:
    """The goodput totals checkpoint `step` of WORKDIR kept (timing.Totals.saved); None for a
    checkpoint written before them, or without a readable position (the restore has read it)."""
    try:
        position = read_position_file(paths.join(checkpoint_dir(workdir), str(step)))
    except (OSError, ValueError):
        return None
    saved = (position or {}).get("goodput")
    return saved if isinstance(saved, dict) else None


def _legacy_files(folder: str) -> list[re.Match]:
    """The per-process iterator files of a checkpoint from before POSITION (name matches)."""
    directory = paths.join(folder, _LEGACY_DATA)
    if not paths.isdir(directory):
        return []
    return [m for m in map(_LEGACY_FILE.fullmatch, paths.listdir(directory)) if m]


def _legacy_layout(folder: str) -> dict | None:
    """{"processes": N} of a checkpoint from before POSITION (its files' names), or None."""
    counts = {int(m.group(2)) for m in _legacy_files(folder)}
    return {"processes": counts.pop()} if len(counts) == 1 else None


def _legacy_position(folder: str, step: int) -> dict:
    """The iterator state of this process from a checkpoint written before POSITION, whose
    `data/` holds one Grain file per process (`process_<i>-of-<N>.json`).

    On N processes each takes its own file, as Grain's handler did. On another count every
    process takes the state all N files agree on (the step counter of data/pipeline.py).
    Raises _Damage when a file of the checkpoint's own layout is missing or unreadable, and
    CheckpointLayoutError (naming both layouts) when the files differ and the count changed.
    """
    found = {}
    for match in _legacy_files(folder):
        found.setdefault(int(match.group(2)), {})[int(match.group(1))] = match.group(0)
    if len(found) != 1:
        what = "no input position" if not found else "iterator files of several process counts"
        raise _Damage(f"checkpoint {step} holds {what} (data/process_<i>-of-<N>.json)")
    count, files = found.popitem()
    missing = [f"process_{i}-of-{count}.json" for i in range(count) if i not in files]
    if missing:
        raise _Damage(f"checkpoint {step} lacks its input position file(s) {', '.join(missing)}")
    states = []
    for i in range(count):
        path = paths.join(folder, _LEGACY_DATA, files[i])
        try:
            states.append(json.loads(paths.read_bytes(path)))
        except ValueError as e:  # truncated or garbage JSON; OSErrors go to the caller
            raise _Damage(f"{path} is not a JSON iterator state ({e})") from e
    if count == jax.process_count():
        return states[jax.process_index()]
    if any(state != states[0] for state in states):
        raise CheckpointLayoutError(
            f"checkpoint {step} was written by {layout_text({'processes': count})} whose input "
            f"positions differ, and this run has {layout_text(current_layout())}: it resumes "
            f"exactly only on {count} processes; nothing was moved aside"
        )
    return states[0]


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    data_iter: Any = None,
    goodput: dict | None = None,
) -> bool:
    """Starts an asynchronous save of `state` and the iterator's position at `step` (a run
    without an input iterator, such as fine-tuning, whose batches follow from the step, passes
    None and saves the state alone), with the run's goodput totals (timing.Totals.saved) beside
    the position.

    A full disk, a lost permission or an I/O error (here, or from the previous save still being
    written, which orbax reports now) is a CheckpointError of one line. The checkpoint being
    written stays a temporary folder, which the next run removes, so the previous ones are
    untouched.
    """
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
        # Process 0 writes it: the position is the same step counter on every process.
        position = {"data": data_iter.get_state(), "layout": current_layout()}
        if goodput is not None:
            position["goodput"] = goodput
        items[POSITION] = ocp.args.JsonSave(position)
    try:
        return manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:
        if _is_environment_error(e):
            raise CheckpointError(_write_message(manager, e)) from e
        raise


def wait(manager: ocp.CheckpointManager) -> None:
    """Waits for the asynchronous save in flight; its failure as in `save`."""
    try:
        manager.wait_until_finished()
    except Exception as e:
        if _is_environment_error(e):
            raise CheckpointError(_write_message(manager, e)) from e
        raise


def _write_message(manager: ocp.CheckpointManager, e: BaseException) -> str:
    """The one line of a save that failed for the machine's reason (and, from now on, orbax's
    reports of it are dropped where quiet_write_failures is on)."""
    _WRITE_FAILED.set()
    code = _environment_errno(e)
    # The system's words for the errno: orbax's own text runs to hundreds of characters.
    reason = os.strerror(code) if code else " ".join(f"{type(e).__name__}: {e}".split())[:200]
    done = manager.all_steps()
    kept = f"checkpoint {max(done)} is intact" if done else "no earlier checkpoint was made"
    advice = write_advice(OSError(code, ""))
    return (
        f"a checkpoint could not be written to {manager.directory} ({reason}); {kept}: "
        f"{advice}, then run the same command to resume"
    )


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs that tell orbax where each restored array goes."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
    )


def _move_aside(manager: ocp.CheckpointManager, step: int) -> str:
    """Renames checkpoints/<step> to <step>.corrupt (or .corrupt.1, ...); returns the new path."""
    src = paths.join(os.fspath(manager.directory), str(step))
    dst = src + CORRUPT_SUFFIX
    n = 0
    while paths.exists(dst):
        n += 1
        dst = f"{src}{CORRUPT_SUFFIX}.{n}"
    if jax.process_index() == 0:
        paths.move_dir(src, dst)  # in a bucket: copied, then deleted
    if jax.process_count() > 1:
        # Every process must see the rename before any of them lists the steps again.
        multihost_utils.sync_global_devices(f"electra_jax_move_aside_{step}")
    manager.reload()
    return dst


class CheckpointMismatch(CheckpointError):
    """A readable checkpoint whose tree differs from the state the config describes: another
    model or optimizer, not damage. Nothing is moved aside.

    step: the checkpoint's step. differences: a few lines such as
    "params.generator...kernel: (32, 32) saved, (64, 64) now" or "opt_state.0.mu: saved only".
    """

    def __init__(self, step: int, differences: list[str]):
        self.step, self.differences = step, differences
        super().__init__(f"checkpoint {step} differs from the config: {shown(differences)}")


def shown(differences: list[str], limit: int = 3) -> str:
    """The first `limit` differences and how many more, on one line."""
    more = len(differences) - limit
    return "; ".join(differences[:limit] + ([f"{more} more"] if more > 0 else []))


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _leaf_shapes(tree: Any) -> dict[str, tuple]:
    """{dotted path: shape} of a tree's array leaves, named as orbax names saved arrays."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def _saved_shapes(manager: ocp.CheckpointManager, step: int) -> dict[str, tuple]:
    """{name: shape} of the arrays saved in `step`'s state, from its metadata (no array is
    read). Raises whatever orbax raises when the metadata is missing or unreadable."""
    metadata = manager.item_metadata(step)["state"]
    if metadata is None:
        raise FileNotFoundError(f"checkpoint {step} has no state metadata")
    tree = getattr(metadata, "tree", metadata)
    return {
        str(leaf.name): tuple(leaf.shape)
        for leaf in jax.tree_util.tree_leaves(tree)
        if hasattr(leaf, "shape") and hasattr(leaf, "name")
    }


def tree_differences(saved: dict[str, tuple], expected: dict[str, tuple]) -> list[str]:
    """What differs between two {name: shape} maps, one line per array: parameters first (they
    name the setting best), shape differences before missing arrays."""
    out = [
        (0, k, f"{k}: {saved[k]} saved, {expected[k]} now")
        for k in set(saved) & set(expected)
        if tuple(saved[k]) != tuple(expected[k])
    ]
    out += [(1, k, f"{k}: in the checkpoint only") for k in set(saved) - set(expected)]
    out += [(1, k, f"{k}: in the config's state only") for k in set(expected) - set(saved)]
    out.sort(key=lambda x: (not x[1].startswith("params"), x[0], x[1]))
    return [line for _, _, line in out]


# Errors of the machine, not of the files: a checkpoint that fails with one of these is left
# where it is, and the run stops with one line.
_ENVIRONMENT_ERRNOS = (
    errno.EACCES,
    errno.EPERM,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EROFS,
    errno.ENOMEM,
    errno.EIO,
)
# How tensorstore and Python write an errno into a message ("[os_error_code='28']", "[Errno 28]").
_ERRNO_IN_TEXT = re.compile(r"os_error_code='(\d+)'|\[Errno (\d+)\]")
_ENVIRONMENT_WORDS = (
    ("PERMISSION_DENIED", errno.EACCES),
    ("Permission denied", errno.EACCES),
    ("RESOURCE_EXHAUSTED", errno.ENOSPC),
    ("No space", errno.ENOSPC),
    ("File too large", errno.EFBIG),
    ("Disk quota exceeded", errno.EDQUOT),
    ("Read-only file system", errno.EROFS),
)


def _errno_of_text(text: str) -> int | None:
    """The environment errno a message of orbax or tensorstore names, or None."""
    for match in _ERRNO_IN_TEXT.finditer(text):
        code = int(match.group(1) or match.group(2))
        if code in _ENVIRONMENT_ERRNOS:
            return code
    for words, code in _ENVIRONMENT_WORDS:
        if words in text:
            return code
    return None


def _environment_errno(e: BaseException | None) -> int | None:
    """The errno of the machine's error (full disk, permission, memory, I/O) behind `e`, or
    None when `e` is no such error."""
    while e is not None:
        if isinstance(e, MemoryError):
            return errno.ENOMEM
        if isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS:
            return e.errno
        code = _errno_of_text(str(e))
        if code is not None:
            return code
        e = e.__cause__ or e.__context__
    return None


def _is_environment_error(e: BaseException) -> bool:
    return _environment_errno(e) is not None


# Set once a save failed for the machine's reason: from then on, the reports of that failure
# that orbax's threads and pending coroutines still make are dropped (quiet_write_failures).
_WRITE_FAILED = threading.Event()


def _from_orbax(tb) -> bool:
    return any("orbax" in frame.filename for frame in traceback.extract_tb(tb))


def quiet_write_failures() -> None:
    """Drops orbax's own reports of a checkpoint write that failed for the machine's reason (a
    full disk, a file size limit, a permission), which CheckpointError already says in one line:
    orbax logs the error with a traceback from each of its threads (an absl ERROR record apiece),
    asyncio logs each of its write tasks whose error nobody read, and at exit its pending write
    coroutines each print an unraisable traceback: hundreds of lines around that one. Other
    records and errors are untouched. For the commands, without --verbose (library callers see
    everything); idempotent."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    if any(isinstance(f, _OrbaxWriteFailureFilter) for f in loggers[0].filters):
        return
    for logger in loggers:  # orbax's own records; asyncio's "Task exception was never retrieved"
        logger.addFilter(_OrbaxWriteFailureFilter())
    previous_unraisable = sys.unraisablehook

    def unraisable_hook(unraisable) -> None:
        if _WRITE_FAILED.is_set() and _from_orbax(unraisable.exc_traceback):
            return
        previous_unraisable(unraisable)

    sys.unraisablehook = unraisable_hook
    previous_thread_hook = threading.excepthook

    def thread_hook(args) -> None:
        if _is_environment_error(args.exc_value) and _from_orbax(args.exc_traceback):
            return
        previous_thread_hook(args)

    threading.excepthook = thread_hook


class _OrbaxWriteFailureFilter(logging.Filter):
    """Drops orbax's ERROR records of an environment failure (see quiet_write_failures), and
    its record of a wait cut short by a second Ctrl-C (the KeyboardInterrupt the command then
    ends in one line, cli.end_interrupted)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        interrupted = record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt)
        if interrupted and "orbax" in record.pathname:
            return False
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]}"
        if "orbax" not in record.pathname and "orbax" not in text:
            return True
        return _errno_of_text(text) is None


def _step_of(state: Any) -> Any:
    """The step a restored state holds (its `step` field or key), or None when it has none."""
    if isinstance(state, dict):
        return state.get("step")
    return getattr(state, "step", None)


def restore_latest(
    manager: ocp.CheckpointManager,
    abstract_state: Any,
    data_iter: Any,
    log=print,
    step_of: Callable[[Any], Any] = _step_of,
) -> Any:
    """Restores the newest readable checkpoint into (state, iterator); None when there is none.
    With `data_iter` None only the state is read (the checkpoints of `save(..., None)`).

    First the folders of checkpoints/ are surveyed (`survey`): an entry orbax would take for a
    step that is not the run's checkpoint of that step is refused (ForeignFolderError), and
    the names that are not the run's are left alone, with one line to `log`. A restored state
    whose step (`step_of(state)`, None: not checked) is not its folder's is refused the same
    way: a checkpoint renamed by hand, not damage.

    Damage and mismatch are told apart. First the checkpoint's metadata is read (no arrays):
    - unreadable or missing metadata is damage;
    - a tree of other names or shapes than `abstract_state` is a mismatch (another model or
      optimizer): CheckpointMismatch, and nothing is moved.
    Then the arrays and the iterator position are read; a failure there is damage too, unless it
    is the machine's (permission, full disk, out of memory, I/O error): CheckpointError, nothing
    moved. A damaged checkpoint is moved aside to `<step>.corrupt` with a warning (`log` gets one
    line naming the step) and the next older one is tried.

    A checkpoint written by another layout (processes x devices) is restored into this one's
    shardings, its position being process-count-free (`log` gets one line naming both
    layouts); one from before POSITION whose per-process positions differ is refused on another
    process count: CheckpointLayoutError, nothing moved.

    Raises CheckpointError when checkpoints exist (or were set aside, now or by an earlier run)
    but none can be restored: a run never starts over silently where checkpoints were.
    """
    directory = os.fspath(manager.directory)
    others = survey(directory)
    if others:
        log(
            f"{directory} also holds {_listed(others)}, which {'is' if len(others) == 1 else 'are'}"
            " not this run's checkpoints: left as they are"
        )
    failed: list[str] = []
    expected = _leaf_shapes(abstract_state)
    _quiet_late_callbacks()
    while (step := manager.latest_step()) is not None:
        # In _DAMAGED from before its first read: the collector may report a failed read of it
        # while orbax is still raising, before the damage is known here.
        folder = os.path.join(os.fspath(manager.directory), str(step)) + os.sep
        _DAMAGED.add(folder)
        try:
            saved = _saved_shapes(manager, step)
            damage = None
        except Exception as e:  # orbax raises many types for missing or damaged metadata
            if _is_environment_error(e):
                raise CheckpointError(_environment_message(manager, step, e)) from e
            saved, damage = None, e
        if saved is not None:
            differences = tree_differences(saved, expected)
            if differences:
                raise CheckpointMismatch(step, differences)
            try:
                state = _restore_step(manager, step, abstract_state, data_iter, log)
            except CheckpointLayoutError:
                raise  # readable, written for another layout: not damage
            except Exception as e:  # orbax and tensorstore raise many types for damaged files
                if _is_environment_error(e):
                    raise CheckpointError(_environment_message(manager, step, e)) from e
                damage = e
            else:
                _DAMAGED.discard(folder)  # restored: none of its reads failed
                held = step_of(state)
                if held is not None and int(jax.device_get(held)) != step:
                    renamed(directory, step, int(jax.device_get(held)), "its train state")
                return state
        reason = " ".join(f"{type(damage).__name__}: {damage}".split())[:300]
        moved = _move_aside(manager, step)
        failed.append(moved)
        log(
            f"warning: checkpoint {step} cannot be restored ({reason}); moved it to {moved} "
            "and trying the previous one"
        )
    aside = failed or [
        paths.join(os.fspath(manager.directory), n)
        for n in set_aside(os.fspath(manager.directory.parent))
    ]
    if aside:
        raise CheckpointError(
            f"no checkpoint in {manager.directory} can be restored (set aside as damaged: "
            f"{', '.join(aside)}); inspect them, or use a new --workdir to start over"
        )
    return None


def _restore_step(manager: ocp.CheckpointManager, step: int, abstract_state, data_iter, log):
    """`step`'s state, and its input position put into `data_iter` (when given). The position
    of a checkpoint from before POSITION is read first (_legacy_position: it may refuse the
    layout before any array is read). Raises what orbax raises for unreadable files, _Damage,
    or CheckpointLayoutError."""
    folder = paths.join(os.fspath(manager.directory), str(step))
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    legacy = None
    if data_iter is not None:
        if paths.isdir(paths.join(folder, POSITION)):
            items[POSITION] = ocp.args.JsonRestore()
        else:
            legacy = {"data": _legacy_position(folder, step), "layout": _legacy_layout(folder)}
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    if data_iter is not None:
        position = restored[POSITION] if legacy is None else legacy
        data_iter.set_state(position["data"])
        saved, now = position.get("layout"), current_layout()
        if saved is not None and {**now, **saved} != now:  # an old layout lacks "devices"
            log(
                f"checkpoint {step} was written by {layout_text(saved)}; resuming it on "
                f"{layout_text(now)} (the same global batches and random stream)"
            )
    return restored["state"]


# The folders (with a trailing separator) of the checkpoints that failed to restore in this
# process, or are being restored: asyncio's late reports of their reads are dropped
# (_DamagedReadFilter).
_DAMAGED: set[str] = set()


class _DamagedReadFilter(logging.Filter):
    """Drops asyncio's "Task/Future exception was never retrieved" records of reads from a
    checkpoint that failed to restore: orbax gives up on the first failed read, and the other
    reads' tasks and futures, failing the same way, are reported when the garbage collector finds
    them, some time later or never (a report that comes and goes with the machine's load). The
    warning that moved the checkpoint aside already says it; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # asyncio names the class: "Task exception ..." for a read coroutine, "Future exception
        # ..." for a future that tensorstore failed from its own thread (no traceback then).
        if "exception was never retrieved" not in text:
            return True
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]}"
        return not any(folder in text for folder in _DAMAGED)


def _quiet_late_callbacks() -> None:
    """If a restore fails, tensorstore still completes the reads that were in flight and calls
    their asyncio callbacks on the loop orbax has closed: each raises "Event loop is closed" as
    an unraisable exception, a traceback apiece (hundreds for a real train state) around the one
    line the user should see; the reads' own tasks fail too, and asyncio logs each it collects
    (_DamagedReadFilter). Those, and only those, are dropped from then on."""
    previous = sys.unraisablehook
    if getattr(previous, "_electra_jax_quiet", False):
        return
    logging.getLogger("asyncio").addFilter(_DamagedReadFilter())

    def hook(unraisable) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    hook._electra_jax_quiet = True
    sys.unraisablehook = hook


def _environment_message(manager: ocp.CheckpointManager, step: int, e: BaseException) -> str:
    code = _environment_errno(e)
    reason = os.strerror(code) if code else " ".join(f"{type(e).__name__}: {e}".split())[:200]
    if code in (errno.EACCES, errno.EPERM):
        advice = "make its files readable (their permissions)"
    else:  # memory, I/O, or the space orbax's restore writes to
        advice = write_advice(OSError(code, ""))
    return (
        f"checkpoint {step} in {manager.directory} cannot be read on this machine ({reason}); "
        f"nothing was moved: {advice}, then run again"
    )


class PreemptionWatcher:
    """SIGTERM / SIGINT -> "save after this step and exit", agreed by every process.

    Before `arm()` (data preparation, compilation) a signal raises `Preempted` at once: there is
    no new work to save and startup can take minutes. ("At once" is as soon as the main thread
    runs Python again: a handler cannot run inside a C++ call such as XLA's compiler; and inside
    a `deferred()` block, at its end.) After `arm()` the first signal only sets a flag that
    `requested(step)` reports after the call in flight; a second one interrupts at once
    (KeyboardInterrupt) for users who really mean it. Multi-host runs ask jax's preemption sync
    point instead, which the coordination service triggers on SIGTERM and which returns True on
    every process at the same step; Python handlers are then left out, as they would replace the
    service's own SIGTERM handler.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self._flag = False
        self._armed = False
        self._deferring = False
        self._pending: int | None = None  # a signal held by `deferred()`
        self._previous: dict[int, Any] = {}
        self.multihost = jax.process_count() > 1
        if self.multihost or threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works in the main thread (e.g. not in a notebook worker)
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not self._armed:
            if self._deferring and self._pending is None:
                self._pending = signum
                return
            if self._pending is not None:
                raise KeyboardInterrupt(f"second {name}")
            raise Preempted(f"{name} before training started")
        if self._flag:
            raise KeyboardInterrupt(f"second {name}")
        self._flag = True

    @contextlib.contextmanager
    def deferred(self):
        """Before `arm()`, holds a signal that arrives inside the block until the block has
        ended, then raises `Preempted` (a second signal still interrupts at once).

        For jax's tracing, lowering and compiling and for orbax's restore: an exception raised
        from the handler in the middle of them (they run Python between their C++ calls) leaves
        their native state half-built, and the process then died of a segmentation fault at
        exit instead of exiting 0.
        """
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        # Not reached when the block raised: its own error is the one to report.
        if self._pending is not None and not self._armed:
            signum, self._pending = self._pending, None
            raise Preempted(f"{signal.Signals(signum).name} before training started")

    def arm(self) -> None:
        """From now on a signal is honoured after the current step rather than at once."""
        self._armed = True

    def requested(self, step: int) -> bool:
        """Whether to stop after `step`; on multi-host runs the same answer on every process."""
        if self.multihost:
            return multihost_utils.reached_preemption_sync_point(step)
        return self._flag

    def close(self) -> None:
        """Puts the previous signal handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
