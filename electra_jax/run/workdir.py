"""Who owns a folder: the marker that makes it a workdir, and the lock that gives it to one run.

A workdir is a folder that is missing, empty, or ours. Ours means it holds the marker `.electra_jax`
(JSON: the kind of run, pre-training or fine-tuning). One narrow exception, for the folders our
commands wrote before the marker existed (version 2026-12-01): a folder without the marker is ours
only when its config.json is one our commands write: a pre-training config (model, generator, train
and data sections, data.source, train.num_steps; files of the user's beside it are left alone), or a
fine-tuning config (family, task or version beside learning_rate, batch_size and seq_length) with
nothing beside it that fine-tuning does not write; or, without config.json, when it holds only what
`prepare` writes (tokenizer/ with a tokenizer in it, data/). Anything else that is not empty (a
Hugging Face model folder, a home directory, another program's config.json beside a checkpoints/
folder) is refused, whatever it contains, so a run never writes its config.json over somebody else's
file. A pre-training workdir is never taken for a fine-tuning one, nor the reverse: fine-tuning
writes a config.json of its own, which would leave a pre-training run unloadable.

No file the run writes at the top of a workdir (the marker, .lock, config.json, metrics.jsonl,
tokenizer/, ...) may be a symbolic link: it would lead the run's writes to a file outside the
workdir, so the claim refuses it in one line naming it. The workdir itself may be a link, and so
may checkpoints/, data/ and tensorboard/ when they lead to a folder: those hold only what the run
writes, wherever the user keeps them.

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
import fcntl
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable

from electra_jax.data.tokenizer import MODEL_FILENAME
from electra_jax.data.wordpiece import VOCAB_FILENAME
from electra_jax.errors import ConfigError
from electra_jax.store import deadline, environment, gcs_lock, jsonio, paths
from electra_jax.store.filenames import (
    CHANGES_FILE,
    CHECKPOINTS_DIR,
    COMMANDS_FILE,
    CONFIG_FILE,
    DATA_DIR,
    DATA_RECORD,
    EVAL_FILE,
    EXPORT_DIR,
    EXPORT_MANIFEST,
    GLUE_PREDICTIONS_FILE,
    HF_REFERENCE_METRICS_FILE,
    LOCK,
    MARKER,
    METRICS_FILE,
    MODEL_FILE,
    NULL_SCORES_FILE,
    REMAT_RECORD,
    RESULTS_FILE,
    SQUAD_PREDICTIONS_FILE,
    TENSORBOARD_DIR,
    TOKENIZER_DIR,
    WANDB_DIR,
    WANDB_FILE,
    WEIGHTS_FILE,
)
from electra_jax.store.jsonio import write_json

PRETRAIN, FINETUNE = "pre-training", "fine-tuning"
KINDS = (PRETRAIN, FINETUNE)

# What our commands write into a workdir, for folders made before the marker existed.
_PRETRAIN_ENTRIES = frozenset(
    {
        CONFIG_FILE,
        CHECKPOINTS_DIR,
        TOKENIZER_DIR,
        DATA_DIR,
        METRICS_FILE,
        TENSORBOARD_DIR,
        EXPORT_DIR,
        HF_REFERENCE_METRICS_FILE,
        CHANGES_FILE,
        DATA_RECORD,
        REMAT_RECORD,
        EVAL_FILE,
        COMMANDS_FILE,
        WANDB_FILE,
        WANDB_DIR,
    }
)
_FINETUNE_ENTRIES = frozenset(
    {
        CONFIG_FILE,
        TOKENIZER_DIR,
        RESULTS_FILE,
        GLUE_PREDICTIONS_FILE,
        SQUAD_PREDICTIONS_FILE,
        NULL_SCORES_FILE,
        MODEL_FILE,
        WEIGHTS_FILE,
        CHECKPOINTS_DIR,
        EXPORT_DIR,
        CHANGES_FILE,
    }
)


@dataclasses.dataclass
class Claim:
    """A workdir held by this process: the lock stays held until `release()` (or the with-block
    ends, or the process ends)."""

    path: str
    kind: str
    # What gives the lock back: closing the flock's only descriptor, or a gs:// workdir's
    # gcs_lock.GcsLock.release; None without a lock.
    _release: Callable[[], None] | None = None

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def check_workdir(workdir: str, flag: str = "--workdir", create: bool = True) -> None:
    """ConfigError naming `workdir` when it cannot be one: a URI other than gs://, a file, a
    path that is not UTF-8; with `create`, also one that cannot be created or written.

    A gs://BUCKET/PATH workdir is written through the path layer (paths.py); other URIs are
    refused, since os.makedirs would quietly create a local ./s3:/... tree.
    """
    try:
        workdir.encode("utf-8")
    except UnicodeEncodeError:
        shown = workdir.encode("utf-8", "backslashreplace").decode("utf-8")
        raise ConfigError(
            f"{flag} {shown} is not valid UTF-8; use a path of UTF-8 characters"
        ) from None
    if paths.unwritable(workdir):
        raise ConfigError(f"{flag} {workdir} {paths.unwritable(workdir)}")
    # In a bucket: a path, not an object; with `create`, a probe object is written and removed
    # (a missing bucket or package, or no access, is one line).
    try:
        with paths.remote_errors(workdir, flag):
            if paths.exists(workdir) and not paths.isdir(workdir):
                raise ConfigError(
                    f"{flag} {workdir} is a file, not a folder; choose another {flag}"
                )
            if create:
                paths.makedirs(workdir)
                probe = paths.join(workdir, f".write_test{os.getpid()}")
                paths.write_atomic(probe, "ok")
                paths.remove(probe)
    except ConfigError:
        raise
    except deadline.NoAnswer as e:  # not "not writable": the store did not answer
        raise ConfigError(f"{flag} {deadline.no_answer_line(e)}") from None
    except Exception as e:  # OSError; in a bucket a missing package, gcsfs's HTTP errors
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())[:200]
        raise ConfigError(
            f"{flag} {workdir} is not writable ({reason}); {paths.access_advice(workdir)}choose "
            f"another {flag}"
        ) from None


def _our_by_product(name: str) -> bool:
    """Files our tools put in a workdir beside a run's own: the write probe, the marker's
    temporary while process 0 writes it (jsonio.write_atomic's `<file>.tmp<pid>`: the other
    processes of a run look at the folder meanwhile), and the logs of
    launch/local_multiprocess.sh (process_<i>.log, written before the processes start)."""
    if name.startswith(".write_test"):
        return True
    if name.startswith(f"{MARKER}.tmp") and _pid_like(name[len(MARKER) + 4 :]):
        return True
    return name.startswith("process_") and name.endswith(".log") and _pid_like(name[8:-4])


def _read_json(path: str):
    try:
        return jsonio.loads(paths.read_bytes(path))
    except (OSError, ValueError):
        return None


def _is_our_pretraining_config(config) -> bool:
    """The config.json of one of our pre-training runs: its sections are objects, data names a
    source, train a number of steps."""
    if not isinstance(config, dict):
        return False
    sections = ("model", "generator", "train", "data")
    if not all(isinstance(config.get(k), dict) for k in sections):
        return False
    return "source" in config["data"] and "num_steps" in config["train"]


def _is_our_finetuning_config(config) -> bool:
    """The config.json of one of our fine-tunings (GLUE: task; SQuAD: version; both: family)."""
    if not isinstance(config, dict):
        return False
    named = "family" in config or "task" in config or "version" in config
    return named and {"learning_rate", "batch_size", "seq_length"} <= set(config)


def _is_prepare_output(path: str, visible: set[str]) -> bool:
    """What `prepare` wrote before the marker: tokenizer/ (with a tokenizer's file) and data/."""
    if not visible <= {TOKENIZER_DIR, DATA_DIR} or TOKENIZER_DIR not in visible:
        return False
    folder = paths.join(path, TOKENIZER_DIR)
    return paths.isdir(folder) and bool(
        {MODEL_FILENAME, VOCAB_FILENAME} & set(paths.listdir(folder))
    )


def _our_hidden(name: str) -> bool:
    """Hidden names our writes leave: the (damaged) marker and a temporary `<file>.tmp<pid>`."""
    if name == MARKER:
        return True
    stem, _, pid = name.rpartition(".tmp")
    return bool(stem) and _pid_like(pid)


def _pid_like(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²', which no process id is written as."""
    return text.isascii() and text.isdigit()


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
    # A folder from before the marker (or whose marker was damaged): ours only by a config.json
    # of ours and nothing beside it that our commands do not write (see the module's docstring).
    config = _read_json(paths.join(path, CONFIG_FILE))
    if _is_our_pretraining_config(config):  # a user's notes beside an old run are kept
        return PRETRAIN
    visible = {n for n in names if not n.startswith(".")}
    if not all(_our_hidden(n) for n in names - visible):
        return None
    if _is_our_finetuning_config(config) and visible <= _FINETUNE_ENTRIES:
        return FINETUNE
    if CONFIG_FILE not in visible and _is_prepare_output(path, visible):
        return PRETRAIN
    return None


# The names a run writes at the top of its workdir: none may be a link (see the docstring)...
_WRITTEN = _PRETRAIN_ENTRIES | _FINETUNE_ENTRIES | {MARKER, LOCK}
# ...but these folders, which hold only what the run itself writes there, may be links to a
# folder elsewhere: where a user keeps a run's bulk (a scratch disk), not a file of theirs.
_STORAGE = frozenset({CHECKPOINTS_DIR, DATA_DIR, TENSORBOARD_DIR})


def _refuse_links(path: str, flag: str) -> None:
    """ConfigError naming the first name a run writes at the top of `path` (or its temporary,
    `<name>.tmp<pid>`) that is a symbolic link."""
    for name, (target, to_folder) in sorted(paths.links_in(path).items()):
        written = name in _WRITTEN or name.rpartition(".tmp")[0] in _WRITTEN
        if name in _STORAGE and to_folder:
            continue
        if written:
            raise ConfigError(
                f"{flag} {path}: {name} is a symbolic link (to {target}); a run "
                f"writes {name} and would change the file it points at, outside the workdir: "
                f"remove the link (or move the real file there), or choose another {flag}"
            )


def _what_it_is(path: str) -> str:
    """A few words on a folder that is not ours, for the refusal."""
    config = _read_json(paths.join(path, CONFIG_FILE))
    if isinstance(config, dict) and "model_type" in config:
        return "a Hugging Face model folder (its config.json has model_type)"
    if paths.isfile(paths.join(path, EXPORT_MANIFEST)):
        return "an electra_jax export"
    if paths.isfile(paths.join(path, MARKER)):
        return f"a folder whose {MARKER} marker is damaged and whose files are not a run's"
    names = sorted(paths.listdir(path))
    if CONFIG_FILE in names and not (
        _is_our_pretraining_config(config) or _is_our_finetuning_config(config)
    ):
        return (
            f"not an electra_jax workdir: it has no {MARKER} marker, and its config.json is "
            "not a run's (another program's?)"
        )
    if CONFIG_FILE not in names and CHECKPOINTS_DIR in names:
        return (
            f"not an electra_jax workdir: it holds checkpoints/ but neither the {MARKER} marker "
            "nor a config.json (if it is a run of ours, put its config.json back)"
        )
    ours = _PRETRAIN_ENTRIES | _FINETUNE_ENTRIES
    foreign = [n for n in names if n not in ours and n != LOCK and not _our_hidden(n)]
    if foreign and CONFIG_FILE in names:
        return (
            f"not an electra_jax workdir: it has no {MARKER} marker, and it holds files no "
            f"electra_jax command writes ({', '.join(foreign[:3])})"
        )
    shown = names[:3]
    return f"a non-empty folder that is not an electra_jax workdir (it holds {', '.join(shown)})"


def _holder(lock_path: str) -> str:
    info = _read_json(lock_path)
    if not isinstance(info, dict):
        return "another process"
    return (
        f"{info.get('command', 'a run')} (pid {info.get('pid', '?')} on host "
        f"{info.get('host', '?')}, since {info.get('started', '?')})"
    )


def _take_lock(path: str, lock_path: str, kind: str, flag: str, command: str) -> int:
    try:
        fd = paths.open_no_follow(lock_path, os.O_RDWR | os.O_CREAT)
    except paths.LinkRefused as e:  # a link put there after the claim's check
        raise ConfigError(str(e)) from None
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
            f"{flag} {path} is not writable ({e.strerror}); {jsonio.write_advice(e)}, or choose "
            f"another {flag}"
        ) from None
    return fd


def _write_marker(path: str, marker: str, kind: str, flag: str) -> None:
    """The marker (the file `marker`) of a `kind` workdir, written once the lock is held;
    ConfigError when a run of the other kind made the folder its own since the claim's checks
    (then, nothing is written)."""
    found = _read_json(marker)
    if isinstance(found, dict) and found.get("kind") == kind:
        return
    if isinstance(found, dict) and found.get("kind") in KINDS:
        _refuse_other_kind(path, found["kind"], kind, flag)
    # Local: a temporary file and os.replace; gs://: one upload (jsonio.write_atomic).
    write_json(marker, {"kind": kind, "format": 1})


def _take_remote_lock(path: str, lock_path: str, kind: str, flag: str, command: str):
    """The lease lock `lock_path` (WORKDIR/.lock) of a gs:// workdir (gcs_lock.py), or
    ConfigError naming its live holder."""
    try:
        lock = gcs_lock.GcsLock(lock_path, {"command": command, "kind": kind})
    except environment.EnvironmentValueError as e:  # its lease, from the environment
        raise ConfigError(str(e)) from None
    try:
        lock.acquire()
    except gcs_lock.LockHeld as e:
        raise ConfigError(
            f"{flag} {path} is in use by {e}; wait for it to end (or stop it), or use another "
            f"{flag}"
        ) from None
    except gcs_lock.ForeignLock as e:
        raise ConfigError(f"{flag} {path}: {e}") from None
    except Exception as e:  # google-cloud-storage's errors: no bucket, no access, no network
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(
            f"{flag} {path}: its lock object cannot be written ({reason}); check the bucket "
            f"name and this machine's access to it, or choose another {flag}"
        ) from None
    return lock


# What a run manages inside its workdir: it writes these, reads them back, and may set aside or
# remove what it finds there (a damaged checkpoint, stale prepared data). Another command's
# output inside one would be taken for the run's own; `hf/` (the export's default place) is not
# one of them.
MANAGED = frozenset({CHECKPOINTS_DIR, DATA_DIR, TOKENIZER_DIR, TENSORBOARD_DIR, MARKER, LOCK})


def inside_managed(path: str) -> tuple[str, str] | None:
    """(workdir, entry) when `path` is, or lies inside, the entry of MANAGED of a workdir of
    ours (e.g. RUN/checkpoints/99 -> (RUN, 'checkpoints')); None otherwise. Only ancestors whose
    child on the way is a managed name are looked at, so a deep path costs a few string checks."""
    for parent, child in reversed(paths.ancestors(paths.absolute(path))):
        if child in MANAGED and kind_of(parent) in KINDS:
            return parent, child
    return None


def refuse_managed(path: str, flag: str) -> None:
    """ConfigError (one line) when `path`, an output of a command, is inside a folder another
    run manages (inside_managed)."""
    found = inside_managed(path)
    if found:
        run, entry = found
        raise ConfigError(
            f"{flag} {path} is inside {paths.join(run, entry)}, which the run in {run} manages "
            f"(it would take what is written there for its own, or set it aside): choose a "
            f"{flag} outside it"
        )


def claim(
    path: str,
    kind: str,
    *,
    lock: bool = True,
    flag: str = "--workdir",
    command: str | None = None,
) -> Claim:
    """Makes `path` a workdir of `kind` (PRETRAIN or FINETUNE) held by this process: `check`,
    then `hold`. With `lock` False (the other processes of a multi-host run) only the checks
    run: nothing is written.

    Returns:
      a Claim; its lock is held until `release()`.
    """
    check(path, kind, flag)
    return hold(path, kind, flag=flag, command=command) if lock else Claim(paths.normal(path), kind)


def check(path: str, kind: str, flag: str = "--workdir") -> None:
    """ConfigError (one line) when `path` cannot be a workdir of `kind`: a file, a URI, a folder
    that is not ours, a workdir of the other kind, a link where the run writes a file, a folder
    where a pre-training run writes a file (or a file where it writes a folder). Nothing is
    written: a run's plan asks it before its lock (`hold`)."""
    path = paths.normal(path)  # no trailing slash: gs://b/run/ and gs://b/run are one
    check_workdir(path, flag, create=False)
    refuse_managed(path, flag)
    found = kind_of(path)
    if found is None:
        raise ConfigError(
            f"{flag} {path} is {_what_it_is(path)}; a run writes config.json and more there, so "
            f"it takes only an empty or new folder, or one of its own: choose another {flag}"
        )
    if found and found != kind:
        _refuse_other_kind(path, found, kind, flag)
    if found is not None and paths.isdir(path):
        _refuse_links(path, flag)
        _refuse_misplaced_outputs(path, kind)


# What a run of each kind writes at the top of its workdir as a file (False) or a folder (True),
# beside the marker and config.json, that a user might have put the other thing in the place of.
_OUTPUTS = {
    PRETRAIN: ((METRICS_FILE, False), (CHANGES_FILE, False), (COMMANDS_FILE, False),
               (TENSORBOARD_DIR, True)),
}  # fmt: skip


def _refuse_misplaced_outputs(path: str, kind: str) -> None:
    """ConfigError when a folder stands where the run writes a file (or a file where it writes a
    folder): found by the plan, not when the first row is written after the step compiled."""
    for name, folder in _OUTPUTS.get(kind, ()):
        output = paths.join(path, name)
        if paths.exists(output) and paths.isdir(output) != folder:
            what, wants = ("a file", "a folder") if folder else ("a folder", "a file")
            raise ConfigError(
                f"{output} is {what}, where the run writes {wants} of that name; move it away "
                "(or choose another --workdir)"
            )


def _refuse_other_kind(path: str, found: str, kind: str, flag: str) -> None:
    raise ConfigError(
        f"{flag} {path} is a {found} workdir; a {kind} run would overwrite its files: "
        f"choose a new {flag}"
    )


def hold(path: str, kind: str, *, flag: str = "--workdir", command: str | None = None) -> Claim:
    """The lock of `path`, a workdir whose claim's checks passed (`claim` with `lock` False, the
    plan of a run), held by this process; the folder created if needed. ConfigError (one line)
    when it cannot be written, another process holds it, or a run of the other kind made it its
    own since the checks."""
    path = paths.normal(path)
    check_workdir(path, flag)
    command = command or os.path.basename(sys.argv[0]) or "python"
    lock, marker = paths.join(path, LOCK), paths.join(path, MARKER)
    if paths.is_remote(path):
        remote = _take_remote_lock(path, lock, kind, flag, command)
        release: Callable[[], None] = remote.release
    else:
        # Closing the only descriptor releases the flock.
        release = functools.partial(os.close, _take_lock(path, lock, kind, flag, command))
    try:
        _write_marker(path, marker, kind, flag)
    except ConfigError:
        release()
        raise
    except OSError as e:
        release()
        raise ConfigError(
            f"{flag} {path} is not writable ({e.strerror or e}); choose another {flag}"
        ) from None
    return Claim(path, kind, release)


@contextlib.contextmanager
def claimed(path: str, kind: str, **kwargs):
    """`claim` as a with-block: the lock is released when the block ends."""
    c = claim(path, kind, **kwargs)
    try:
        yield c
    finally:
        c.release()
