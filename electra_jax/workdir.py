"""Who owns a folder: the marker that makes it a workdir, and the lock that gives it to one run.

A workdir is a folder that is missing, empty, or ours. Ours means it holds the marker
`.electra_jax` (JSON: the kind of run, pre-training or fine-tuning) or, for folders written before
the marker existed, only what our commands write there. Anything else (a Hugging Face model
folder, a home directory) is refused, so a run never writes its config.json over somebody else's
file. A pre-training workdir is never taken for a fine-tuning one, nor the reverse: fine-tuning
writes a config.json of its own, which would leave a pre-training run unloadable.

The lock is WORKDIR/.lock, held with flock(2) by one process for the whole run (process 0 of a
multi-host run; the others write nothing that process 0 writes). The kernel releases it when the
process ends, however it ends (SIGKILL, the OOM killer), so a rerun resumes at once and no stale
lock is ever left to clean up. The file names the holder (host, pid, command, start time) for the
error a second run gets. flock works on local disks and on NFSv4; on storage without working
locks, run one command per workdir yourself.

A gs://BUCKET/PATH workdir has the same marker and the same checks, read and written through
the path layer (paths.py); its lock is the object WORKDIR/.lock with a lease (gcs_lock.py), since
an object store has no flock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import socket
import sys
import time

from electra_jax import jsonio, paths
from electra_jax.jsonio import write_json
from electra_jax.validate import ConfigError, check_workdir

MARKER = ".electra_jax"
LOCK = ".lock"
PRETRAIN, FINETUNE = "pre-training", "fine-tuning"
KINDS = (PRETRAIN, FINETUNE)

# What our commands write into a workdir, for folders made before the marker existed.
_PRETRAIN_ENTRIES = frozenset(
    {
        "config.json",
        "checkpoints",
        "tokenizer",
        "data",
        "metrics.jsonl",
        "tensorboard",
        "hf",
        "hf_reference_metrics.jsonl",
        "config_changes.jsonl",
    }
)
_FINETUNE_ENTRIES = frozenset(
    {
        "config.json",
        "tokenizer",
        "eval_results.json",
        "dev_predictions.jsonl",
        "dev_predictions.json",
        "dev_null_odds.json",
        "model.json",
        "model.safetensors",
        "checkpoints",
        "hf",
    }
)


@dataclasses.dataclass
class Claim:
    """A workdir held by this process: the lock stays held until `release()` (or the with-block
    ends, or the process ends)."""

    path: str
    kind: str
    _fd: int | None = None
    _remote: object | None = None  # a gcs_lock.GcsLock for a gs:// workdir

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None
        if self._remote is not None:
            self._remote.release()
            self._remote = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _our_by_product(name: str) -> bool:
    """Files our tools put in a workdir beside a run's own: the write probe, the marker's
    temporary while process 0 writes it (jsonio.write_atomic's `<file>.tmp<pid>`: the other
    processes of a run look at the folder meanwhile), and the logs of
    launch/local_multiprocess.sh (process_<i>.log, written before the processes start)."""
    if name.startswith(".write_test"):
        return True
    if name.startswith(f"{MARKER}.tmp") and name[len(MARKER) + 4 :].isdigit():
        return True
    return name.startswith("process_") and name.endswith(".log") and name[8:-4].isdigit()


def _read_json(path: str):
    try:
        return jsonio.loads(paths.read_bytes(path))
    except (OSError, ValueError):
        return None


def kind_of(path: str) -> str | None:
    """PRETRAIN or FINETUNE for a folder of ours, '' for a missing or empty one, None otherwise."""
    if not paths.isdir(path):
        return ""
    names = {n for n in paths.listdir(path) if n != LOCK and not _our_by_product(n)}
    if not names:
        return ""
    marker = _read_json(paths.join(path, MARKER))
    if isinstance(marker, dict) and marker.get("kind") in KINDS:
        return marker["kind"]
    # A folder from before the marker (or whose marker was damaged): recognised by its
    # config.json and what sits beside it. Hidden files (temporary files of an atomic write, the
    # marker) are ignored.
    visible = {n for n in names if not n.startswith(".")}
    config = _read_json(paths.join(path, "config.json"))
    finetuning = isinstance(config, dict) and ("task" in config or "family" in config)
    if finetuning and visible <= _FINETUNE_ENTRIES:
        return FINETUNE
    if isinstance(config, dict) and {"model", "generator", "train"} <= set(config):
        return PRETRAIN
    if visible <= _PRETRAIN_ENTRIES and ({"checkpoints", "tokenizer"} & visible):
        return PRETRAIN
    return None


def _what_it_is(path: str) -> str:
    """A few words on a folder that is not ours, for the refusal."""
    config = _read_json(paths.join(path, "config.json"))
    if isinstance(config, dict) and "model_type" in config:
        return "a Hugging Face model folder (its config.json has model_type)"
    if paths.isfile(paths.join(path, "export.json")):
        return "an electra_jax export"
    if paths.isfile(paths.join(path, MARKER)):
        return f"a folder whose {MARKER} marker is damaged and whose files are not a run's"
    shown = sorted(paths.listdir(path))[:3]
    return f"a non-empty folder that is not an electra_jax workdir (it holds {', '.join(shown)})"


def _holder(lock_path: str) -> str:
    info = _read_json(lock_path)
    if not isinstance(info, dict):
        return "another process"
    return (
        f"{info.get('command', 'a run')} (pid {info.get('pid', '?')} on host "
        f"{info.get('host', '?')}, since {info.get('started', '?')})"
    )


def _take_lock(path: str, kind: str, flag: str, command: str) -> int:
    import fcntl

    lock_path = os.path.join(path, LOCK)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(
            f"{flag} {path} is not writable ({e.strerror}); choose another {flag}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(
                f"{flag} {path} is in use by {_holder(lock_path)}; wait for it to end (or stop "
                f"it), or use another {flag}"
            ) from None
        raise ConfigError(
            f"{flag} {path} cannot be locked ({e.strerror}); put the workdir on storage with "
            "working file locks (a local disk, NFSv4)"
        ) from None
    holder = {
        "command": command,
        "kind": kind,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
    except OSError as e:
        os.close(fd)
        raise ConfigError(
            f"{flag} {path} is not writable ({e.strerror}); free space or choose another {flag}"
        ) from None
    return fd


def _write_marker(path: str, kind: str) -> None:
    marker = paths.join(path, MARKER)
    found = _read_json(marker)
    if isinstance(found, dict) and found.get("kind") == kind:
        return
    # Local: a temporary file and os.replace; gs://: one upload (jsonio.write_atomic).
    write_json(marker, {"kind": kind, "format": 1})


def _take_remote_lock(path: str, kind: str, flag: str, command: str):
    """The lease lock WORKDIR/.lock of a gs:// workdir (gcs_lock.py), or ConfigError naming its
    live holder."""
    from electra_jax import gcs_lock

    lock = gcs_lock.GcsLock(paths.join(path, LOCK), {"command": command, "kind": kind})
    try:
        lock.acquire()
    except gcs_lock.LockHeld as e:
        raise ConfigError(
            f"{flag} {path} is in use by {e}; wait for it to end (or stop it), or use another "
            f"{flag}"
        ) from None
    except Exception as e:  # google-cloud-storage's errors: no bucket, no access, no network
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(
            f"{flag} {path}: its lock object cannot be written ({reason}); check the bucket "
            f"name and this machine's access to it, or choose another {flag}"
        ) from None
    return lock


def claim(
    path: str,
    kind: str,
    *,
    lock: bool = True,
    flag: str = "--workdir",
    command: str | None = None,
) -> Claim:
    """Makes `path` a workdir of `kind` (PRETRAIN or FINETUNE) held by this process.

    Creates the folder if needed; refuses (ConfigError, one line) a file, a URI, a folder that is
    not ours, a workdir of the other kind, or one that another process holds. With `lock` False
    (the other processes of a multi-host run) only the checks run: nothing is written.

    Returns:
      a Claim; its lock is held until `release()`.
    """
    path = os.fspath(path)
    if paths.is_remote(path):
        path = paths.absolute(path)  # no trailing slash: gs://b/run/ and gs://b/run are one
    check_workdir(path, flag, create=False)
    found = kind_of(path)
    if found is None:
        raise ConfigError(
            f"{flag} {path} is {_what_it_is(path)}; a run writes config.json and more there, so "
            f"it takes only an empty or new folder, or one of its own: choose another {flag}"
        )
    if found and found != kind:
        raise ConfigError(
            f"{flag} {path} is a {found} workdir; a {kind} run would overwrite its files: "
            f"choose a new {flag}"
        )
    if not lock:
        return Claim(path, kind)
    check_workdir(path, flag)
    command = command or os.path.basename(sys.argv[0]) or "python"
    if paths.is_remote(path):
        remote = _take_remote_lock(path, kind, flag, command)
        try:
            _write_marker(path, kind)
        except OSError as e:
            remote.release()
            raise ConfigError(
                f"{flag} {path} is not writable ({e.strerror or e}); choose another {flag}"
            ) from None
        return Claim(path, kind, _remote=remote)
    fd = _take_lock(path, kind, flag, command)
    try:
        _write_marker(path, kind)
    except OSError as e:
        os.close(fd)
        raise ConfigError(
            f"{flag} {path} is not writable ({e.strerror}); choose another {flag}"
        ) from None
    return Claim(path, kind, fd)


@contextlib.contextmanager
def claimed(path: str, kind: str, **kwargs):
    """`claim` as a with-block: the lock is released when the block ends."""
    c = claim(path, kind, **kwargs)
    try:
        yield c
    finally:
        c.release()
