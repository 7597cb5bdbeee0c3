"""One path layer for a workdir's files: local paths with os calls, URIs through etils.epath.

A workdir, a data.cache_dir or an init_from may be `gs://BUCKET/PATH`. orbax writes checkpoints
there itself (through tensorstore); everything else a run writes or reads (config.json, the
marker, metrics.jsonl, TensorBoard events, the tokenizer, prepared shards, config_changes.jsonl)
goes through the functions here. epath reaches gs:// through TensorFlow's gfile when TensorFlow
is installed, else through fsspec and gcsfs (the `[gcs]` extra).

Locally every function is the os call the package made before this layer existed, so local
guarantees stay as they were: atomic writes are a temporary file, fsync and os.replace; appends are
fsynced. No local write follows a symbolic link: a file to write, its temporary, or a file to append
to that is a link raises LinkRefused (the file it points at, outside our folder, stays as it was);
files are opened with O_NOFOLLOW, so a link put there after the check is refused too (and so is a
file with other hard links, before it is truncated or appended to). On an object store there is no
rename and no append, but an object is never seen half-written: a write is one upload that appears
whole when it completes, so `write_atomic` is a plain upload, and `append_text` reads the object and
writes it again (for small files only: config_changes.jsonl). Listings of a remote folder are read
fresh each time (gcsfs caches them, and tensorstore's writes of a checkpoint do not pass through
that cache).

A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from typing import IO

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")

# Bytes per read or write when a file is copied to or from a bucket.
COPY_CHUNK_BYTES = 16 << 20


class LinkRefused(OSError):
    """A write, append or replace of a path that is a symbolic link: refused, since it would
    change a file outside the folder (the message names the path and what to do)."""

    def __init__(self, path: str, hard_links: int = 0):
        if hard_links:
            what = f"has {hard_links} hard links (it is also a file elsewhere)"
        else:
            try:
                what = f"is a symbolic link (to {os.readlink(path)})"
            except OSError:
                what = "is a symbolic link"
        super().__init__(
            f"{path} {what}; electra_jax writes nothing through a link, which would change a "
            "file outside its folder: remove the link (or move the real file there)"
        )
        self.filename = path

    def __str__(self) -> str:
        return self.args[0]


def refuse_link(path: str) -> None:
    """LinkRefused when local `path` is a symbolic link (a dangling one included)."""
    if not is_remote(path) and os.path.islink(path):
        raise LinkRefused(path)


def open_no_follow(path: str, flags: int) -> int:
    """os.open with O_NOFOLLOW: a symbolic link at `path` is LinkRefused, not followed, and so
    is a file with other hard links (the same file elsewhere), found before it is truncated or
    written."""
    try:
        # 0o666 (less the umask), as open() creates files; O_TRUNC only once the file is known.
        fd = os.open(
            path,
            (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
            0o666,
        )
    except OSError as e:
        if os.path.islink(path):
            raise LinkRefused(path) from None
        raise e from None
    links = os.fstat(fd).st_nlink
    if links > 1:
        os.close(fd)
        raise LinkRefused(path, links)
    if flags & os.O_TRUNC:
        os.ftruncate(fd, 0)
    return fd


def no_follow_opener(path, flags):
    """An `opener` for open(): the file opened with O_NOFOLLOW (LinkRefused for a link)."""
    return open_no_follow(path, flags)


def scheme(path: str) -> str | None:
    """'gs' for gs://..., None for a local path."""
    match = _SCHEME.match(os.fspath(path))
    return match.group(1).lower() if match else None


def is_remote(path: str) -> bool:
    return scheme(path) is not None


def _epath(path: str):
    from etils import epath

    return epath.Path(path)


def _fresh(path: str) -> None:
    """Drops gcsfs's cached listings of `path` and its parent (the fsspec backend's), so that
    what another process or tensorstore wrote there is seen."""
    try:
        from etils.epath.backend import fsspec_backend

        fs = fsspec_backend.fs(path)
    except Exception:  # TensorFlow's gfile backend, or no fsspec: nothing is cached
        return
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate()


def absolute(path: str) -> str:
    """os.path.abspath for a local path; a URI as it is (abspath would make ./gs:/...)."""
    return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def join(path: str, *names: str) -> str:
    return (
        os.path.join(path, *names) if not is_remote(path) else "/".join([path.rstrip("/"), *names])
    )


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    _fresh(path)
    return _epath(path).exists()


def isdir(path: str) -> bool:
    """A local folder; on an object store, a prefix that holds objects."""
    if not is_remote(path):
        return os.path.isdir(path)
    _fresh(path)
    return _epath(path).is_dir()


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    _fresh(path)
    return _epath(path).is_file()


def listdir(path: str) -> list[str]:
    """The names in a folder (an object store's: the next level of names under the prefix)."""
    if not is_remote(path):
        return os.listdir(path)
    _fresh(path)
    return [p.name for p in _epath(path).iterdir()]


def makedirs(path: str) -> None:
    """os.makedirs(exist_ok=True); on an object store a folder exists once it holds an object,
    so this only checks that the bucket can be reached."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
        return
    _epath(path).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def open_file(path: str, mode: str = "rb") -> Iterator[IO]:
    """A file for reading (or a plain, non-atomic write, or an append) locally or in a bucket;
    locally a write or append never follows a link at `path` (LinkRefused)."""
    if not is_remote(path):
        writing = any(c in mode for c in "wax+")
        with open(path, mode, opener=no_follow_opener if writing else None) as f:
            yield f
        return
    with _epath(path).open(mode) as f:
        yield f


def read_bytes(path: str) -> bytes:
    """The file's bytes; FileNotFoundError when it is absent, as open() raises it."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    try:
        return _epath(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise OSError(e.errno, f"{path}: {e.strerror or e}") from e


def sha256_of_file(path: str) -> str:
    """The SHA-256 (hex) of a local file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` so that no reader ever sees a partial file: locally a temporary file
    beside it, fsynced and renamed over it; in a bucket one upload (an object appears whole)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if is_remote(path):
        _epath(path).write_bytes(data)
        return
    # os.replace would put the file in place of a link rather than write through it, but the
    # link there is somebody's: refused like every other write through a link.
    refuse_link(path)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.isfile(tmp) and not os.path.islink(tmp):
            os.remove(tmp)


def append_text(path: str, text: str) -> None:
    """Appends `text` and syncs it to disk; in a bucket (no appends) the object is read and
    written again with `text` added: for small files."""
    if not is_remote(path):
        with open(path, "a", encoding="utf-8", opener=no_follow_opener) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return
    old = read_text(path) if exists(path) else ""
    write_atomic(path, old + text)


def remove(path: str) -> None:
    if not is_remote(path):
        os.remove(path)
        return
    _epath(path).unlink()


def rmtree(path: str) -> None:
    if not is_remote(path):
        shutil.rmtree(path)
        return
    _epath(path).rmtree()


def move_dir(src: str, dst: str) -> None:
    """Renames a folder (os.rename); in a bucket, where a folder is a prefix, every object is
    copied to the new name first and only then deleted, so a crash half-way leaves both, never
    neither."""
    if not is_remote(src):
        os.rename(src, dst)
        return
    source = _epath(src)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    for f in files:
        target = _epath(join(dst, os.fspath(f.relative_to(source))))
        f.copy(target, overwrite=True)
    source.rmtree()
    _fresh(src)


def upload_file(local: str, remote: str) -> None:
    """Copies a local file into a bucket (streamed, in COPY_CHUNK_BYTES pieces)."""
    with open(local, "rb") as src, _epath(remote).open("wb") as dst:
        shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)


def upload_dir(local_dir: str, remote_dir: str, last: str | None = None) -> None:
    """Copies the files of a local folder (no subfolders) under `remote_dir`, `last` after all
    the others: its presence then means the set is complete (prepare's manifest.json)."""
    names = sorted(os.listdir(local_dir))
    if last in names:
        names.remove(last)
        names.append(last)
    for name in names:
        upload_file(os.path.join(local_dir, name), join(remote_dir, name))
