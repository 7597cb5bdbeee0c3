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

It is the only module that asks whether a path is remote: `scheme` is the one parser (a scheme
is case-insensitive, RFC 3986: GS://b/x is gs://b/x, and is handed on as that, since etils, gcsfs
and tensorstore know only the lower-case form), and the functions below hold the choice between
the local and the remote code path (globs, file keys, files a library writes or reads by name,
the checks of a place to write), so that their callers have one.

Every request it sends has a deadline: before a URI reaches etils.epath, the library behind its
scheme is given its per-request timeout (`deadline.bound`), and a request that timed out is
`deadline.NoAnswer`, an OSError naming the path (`_answering`, `_answered`).

It imports only store/deadline.py and its environment reader (leaves); a caller passes the
exception its command reports, e.g. data's DataError, as `error`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fnmatch
import functools
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

from electra_jax.store import deadline

# A path with a scheme (gs://bucket/x) is remote; anything else is a local path, read and
# written with os calls.
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# The schemes etils.epath reads, and the package its fsspec backend needs for each. For gs://,
# epath uses TensorFlow's gfile instead when tensorflow is installed.
REMOTE_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}
# The schemes written directly: GCS (orbax and tensorstore write it; a run's lock uses its
# generation preconditions, gcs_lock.py). Other stores are read only.
WRITABLE_SCHEMES = ("gs",)

# Bytes per read or write when a file is copied to or from a bucket.
COPY_CHUNK_BYTES = 16 << 20
# Concurrent stat calls on objects (file_keys): one round trip each, so a corpus of thousands
# of objects is keyed in seconds rather than minutes.
STAT_THREADS = 32


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
    """The scheme of a URI in lower case ('gs' for gs://b/x and for GS://b/x: a scheme is
    case-insensitive, RFC 3986 section 3.1); None for a local path."""
    match = _SCHEME.match(os.fspath(path))
    return match.group(1).lower() if match else None


def is_remote(path: str) -> bool:
    return scheme(path) is not None


def normal(path: str) -> str:
    """A URI with its scheme in lower case, as etils, gcsfs and tensorstore take it only, and no
    trailing slash (GS://b/x/ -> gs://b/x: one workdir, one lock); a local path as it is."""
    path = os.fspath(path)
    found = scheme(path)
    if not found:
        return path
    return f"{found}://{path[len(found) + 3 :].rstrip('/')}"


def _epath(path: str):
    bound(path)
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from etils import epath

    return epath.Path(normal(path))


def bound(path: str) -> None:
    """Gives the library behind `path`'s scheme its per-request deadline (deadline.bound),
    for a reader that hands the URI to a library that reads it itself (TFDS's data_dir); a
    local path: nothing."""
    deadline.bound(scheme(path))


@contextlib.contextmanager
def _answered(path: str) -> Iterator[None]:
    """A block of requests about the URI `path` whose timeout (in its library's type) is
    raised as deadline.NoAnswer naming `path`; a local path's block passes through."""
    try:
        yield
    except deadline.NoAnswer:
        raise
    except Exception as e:
        if is_remote(path) and deadline.is_timeout(e):
            raise deadline.NoAnswer(normal(path), deadline.bound_seconds(scheme(path))) from e
        raise


def _answering(fn: Callable) -> Callable:
    """`fn(path, ...)` whose requests' timeouts are deadline.NoAnswer naming `path`."""

    @functools.wraps(fn)
    def call(path, *args, **kwargs):
        with _answered(path):
            return fn(path, *args, **kwargs)

    return call


def remote_path(path: str, what: str, error: type[Exception] = ValueError):
    """An ``etils.epath.Path`` for a URI.

    Args:
      path: e.g. ``gs://bucket/dir/file``.
      what: the config field it came from, for messages (e.g. ``data.tokenizer``).
      error: the exception the caller's command reports in one line (data's DataError).

    Raises:
      error: a scheme etils.epath does not read, or etils itself missing.
    """
    _check_readable(path, what, error)
    bound(path)
    try:
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        from etils import epath
    except ImportError:
        raise error(
            f"{what}: reading {path} needs etils.epath: pip install 'etils[epath]'"
        ) from None
    return epath.Path(normal(path))


def _check_readable(path: str, what: str, error: type[Exception]) -> None:
    found = scheme(path)
    if found is not None and found not in REMOTE_PACKAGES:
        schemes = ", ".join(f"{s}://" for s in REMOTE_PACKAGES)
        raise error(
            f"{what}: {path} has scheme {found}://, which cannot be read; use a local or "
            f"mounted path, or one of {schemes}"
        )


@contextlib.contextmanager
def remote_errors(path: str, what: str, error: type[Exception] = ValueError):
    """Reading or writing `path` for `what` (a config field): a scheme etils.epath does not read,
    and a missing filesystem package, become one `error` line naming the package. A local path
    passes through.

    etils.epath reaches gs:// through fsspec, which imports gcsfs (s3fs, ...) at the first call
    and raises ImportError when it is not installed.
    """
    _check_readable(path, what, error)
    try:
        yield
    except ImportError as e:
        package = REMOTE_PACKAGES.get(scheme(path) or "", "")
        if not package:
            raise
        alternative = " (or tensorflow)" if package == "gcsfs" else ""
        raise error(
            f"{what}: reading {path} needs {package}{alternative}, which is not installed "
            f"({e}): pip install {package}"
        ) from None


def unwritable(path: str, read: bool = False) -> str:
    """Why electra_jax cannot write to `path` itself (a URI of a store other than gs://, which
    os.makedirs would quietly make a local ./s3:/... tree of), as the end of a sentence naming
    it (`read`: one it would also read, where a reader must be refused too); '' for a local path
    or a gs:// one."""
    found = scheme(path)
    if found is None:
        return ""
    if found in WRITABLE_SCHEMES:
        bucket = path[len(found) + 3 :].split("/", 1)[0]
        return "" if bucket else f"names no bucket; use {found}://BUCKET/PATH"
    return (
        f"is a {found}:// URI, which electra_jax does not {'read or ' if read else ''}write "
        "directly; give "
        "gs://BUCKET/PATH (written directly), or mount the store as a filesystem every host "
        "sees (NFS, a FUSE mount) and give that path"
    )


def _fresh(path: str) -> None:
    """Drops gcsfs's cached listings of `path` and its parent (the fsspec backend's), so that
    what another process or tensorstore wrote there is seen."""
    bound(path)
    try:
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        from etils.epath.backend import fsspec_backend

        fs = fsspec_backend.fs(path)
    except Exception:  # TensorFlow's gfile backend, or no fsspec: nothing is cached
        return
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate()


def absolute(path: str) -> str:
    """os.path.abspath for a local path; a URI without a trailing slash, its scheme in lower case
    (abspath would make ./gs:/...)."""
    return normal(path) if is_remote(path) else os.path.abspath(path)


def join(path: str, *names: str) -> str:
    return (
        os.path.join(path, *names) if not is_remote(path) else "/".join([path.rstrip("/"), *names])
    )


@_answering
def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    _fresh(path)
    return _epath(path).exists()


@_answering
def isdir(path: str) -> bool:
    """A local folder; on an object store, a prefix that holds objects."""
    if not is_remote(path):
        return os.path.isdir(path)
    _fresh(path)
    return _epath(path).is_dir()


@_answering
def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    _fresh(path)
    return _epath(path).is_file()


@_answering
def listdir(path: str) -> list[str]:
    """The names in a folder (an object store's: the next level of names under the prefix)."""
    if not is_remote(path):
        return os.listdir(path)
    _fresh(path)
    return [p.name for p in _epath(path).iterdir()]


def makedirs(path: str) -> None:
    """os.makedirs(exist_ok=True); nothing on an object store, where a folder is a prefix that
    exists once it holds an object (and gcsfs's makedirs would create a missing bucket)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def access_advice(path: str) -> str:
    """What to check when writing `path` failed, ending in ', or ' (before 'choose another
    ...'): a bucket's name and this machine's access to it; '' for a local path, whose
    OSError says it all."""
    if not is_remote(path):
        return ""
    return (
        "check the bucket name and this machine's access to it (gcloud auth "
        "application-default login), or "
    )


def ancestors(path: str) -> list[tuple[str, str]]:
    """(folder, the name in it on the way to `path`) for each folder above the absolute `path`,
    from the top: /a/b/c -> [('/', 'a'), ('/a', 'b'), ('/a/b', 'c')]; gs://b/x/y ->
    [('gs://b', 'x'), ('gs://b/x', 'y')] (the bucket is the top)."""
    found = scheme(path)
    if found:
        parts = path[len(found) + 3 :].split("/")
        return [(f"{found}://" + "/".join(parts[:i]), parts[i]) for i in range(1, len(parts))]
    parts = path.split(os.sep)
    return [(os.sep.join(parts[:i]) or os.sep, parts[i]) for i in range(1, len(parts))]


def links_in(folder: str) -> dict[str, tuple[str, bool]]:
    """The entries of a local folder that are symbolic links: name -> (what it points at,
    whether it leads to a folder); {} in a bucket, where nothing is a link."""
    if is_remote(folder):
        return {}
    found = {}
    for name in os.listdir(folder):
        link = os.path.join(folder, name)
        if os.path.islink(link):
            found[name] = (os.readlink(link), os.path.isdir(link))
    return found


@contextlib.contextmanager
def open_file(path: str, mode: str = "rb") -> Iterator[IO]:
    """A file for reading (or a plain, non-atomic write, or an append) locally or in a bucket;
    locally a write or append never follows a link at `path` (LinkRefused)."""
    if not is_remote(path):
        writing = any(c in mode for c in "wax+")
        with open(path, mode, opener=no_follow_opener if writing else None) as f:
            yield f
        return
    with _answered(path), _epath(path).open(mode) as f:
        yield f


class NotAFile(OSError):
    """A path read as a file that is a folder, a FIFO, a socket or a device: reading it would
    fail later in words that name no file, or (a FIFO) wait forever for a writer."""

    def __init__(self, path: str, kind: str):
        code = errno.EISDIR if kind == "a folder" else errno.EINVAL
        super().__init__(code, f"it is {kind}, not a file")
        self.filename = path
        self.kind = kind


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at local `path`; NotAFile for anything else.
    Opened without blocking (a FIFO with no writer would block the open itself) and checked on
    the descriptor, so that what is checked is what is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotAFile(path, _kind_of(mode))
    os.set_blocking(fd, True)
    return fd


@_answering
def read_bytes(path: str) -> bytes:
    """The file's bytes; FileNotFoundError when it is absent, as open() raises it; NotAFile
    when it is a folder, a FIFO, a socket or a device."""
    if not is_remote(path):
        with os.fdopen(_open_regular(path), "rb") as f:
            return f.read()
    try:
        return _epath(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        if deadline.is_timeout(e):
            raise  # NoAnswer naming the path (_answering)
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


@_answering
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


@_answering
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


@_answering
def remove(path: str) -> None:
    if not is_remote(path):
        os.remove(path)
        return
    _epath(path).unlink()


@_answering
def rmtree(path: str) -> None:
    if not is_remote(path):
        shutil.rmtree(path)
        return
    _epath(path).rmtree()


@_answering
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
    with _answered(remote), open(local, "rb") as src, _epath(remote).open("wb") as dst:
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


def local_size(path: str) -> int | None:
    """The size of a local file (0 when it cannot be stat'ed); None for a URI, whose size would
    cost a round trip per object."""
    if is_remote(path):
        return None
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def total_size(files: list[str]) -> int | None:
    """The bytes of local files together (one stat each, 0 for one that cannot be stat'ed);
    None when one is a URI: a remote store's sizes would cost a round trip per object."""
    sizes = [local_size(f) for f in files]
    return None if None in sizes else sum(sizes)


def file_keys(files: list[str], what: str, error: type[Exception] = ValueError) -> list[list]:
    """[path, size, mtime] of each file, in order (a content key that changes when a file is
    added, removed or rewritten): a local file's absolute path, size and mtime in ns (os.stat);
    an object's URI, size and mtime in whole seconds as etils.epath stats it (GCS: its update
    time; 0 where the store reports none), STAT_THREADS at a time.

    Raises:
      OSError: a local file that cannot be stat'ed.
      error: an object that cannot be stat'ed, or its filesystem package missing (`what`, the
        config field, names it).
    """

    def key(path: str) -> list:
        if not is_remote(path):
            st = os.stat(path)
            return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
        try:
            with remote_errors(path, what, error), _answered(path):
                st = remote_path(path, what, error).stat()
        except OSError as e:
            raise error(f"{what}: cannot stat {path} ({e})") from None
        return [path, st.length, st.mtime]

    if not any(is_remote(f) for f in files):
        return [key(f) for f in files]
    with concurrent.futures.ThreadPoolExecutor(min(STAT_THREADS, len(files))) as pool:
        return list(pool.map(key, files))


def write_via(path: str, write: Callable[[str], None]) -> None:
    """Puts at `path` the file `write(tmp)` writes by name (a library that writes only local
    files, as safetensors' save_file): `tmp` is a hidden file beside `path`, renamed over it
    when written (atomic); for a URI a local temporary file, then one upload."""
    remote = is_remote(path)
    folder = None if remote else os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        if remote:
            upload_file(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local file with the bytes of `path`, for a library that reads only local files by name
    (safetensors' load_file): `path` itself when it is local; for a URI a temporary copy (one
    download), removed afterwards."""
    if not is_remote(path):
        yield path
        return
    fd, tmp = tempfile.mkstemp(prefix="electra_jax-", suffix=f"-{os.path.basename(path)}")
    try:
        with _answered(path), os.fdopen(fd, "wb") as dst, _epath(path).open("rb") as src:
            shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)
        yield tmp
    finally:
        os.remove(tmp)


def replace_files(folder: str, write: Callable[[str], None], last: str | None = None) -> None:
    """Puts in `folder` the files `write(tmp)` writes into an empty folder `tmp` (a tokenizer's
    save), so that no reader sees a partial set: locally `tmp` is a hidden folder beside
    `folder`, renamed to it when `folder` is missing, else its files moved in one by one with
    os.replace, `last` after the others (its presence then means the set is complete); for a URI
    `tmp` is a local temporary folder whose files are uploaded, `last` after the others."""
    remote = is_remote(folder)
    parent = None
    if not remote:
        folder = os.path.abspath(folder)
        parent = os.path.dirname(folder)
        os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.tmp-", dir=parent)
    try:
        write(tmp)
        if remote:
            upload_dir(tmp, folder, last=last)
            return
        try:
            os.rename(tmp, folder)
            return
        except OSError:
            if not os.path.isdir(folder):
                raise
        names = sorted(os.listdir(tmp), key=lambda name: (name == last, name))
        for name in names:
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class LocalFolder:
    """A local folder standing in for the folder `target`, for files a library writes by name
    (TensorBoard's event files, jax's profile): `target` itself when it is local; for a URI a
    temporary folder whose files `upload()` copies under `target` and `close()` removes.

    Attributes:
      path: the local folder to write in.
    """

    def __init__(self, target: str, prefix: str = "electra_jax-"):
        self.target = target
        self._remote = is_remote(target)
        self.path = tempfile.mkdtemp(prefix=prefix) if self._remote else target

    def upload(self, *names: str) -> None:
        """Copies the files `names` (a folder: every file under it; none named: all) to their
        places under `target`; nothing for a local target, whose files are in place."""
        if not self._remote:
            return
        for name in names or ("",):
            top = os.path.join(self.path, name) if name else self.path
            found = [top] if os.path.isfile(top) else []
            for root, _, files in os.walk(top):
                found += [os.path.join(root, f) for f in sorted(files)]
            for local in found:
                rel = os.path.relpath(local, self.path).replace(os.sep, "/")
                upload_file(local, join(self.target, rel))

    def close(self) -> None:
        """Removes the temporary folder of a URI target (upload first)."""
        if self._remote:
            shutil.rmtree(self.path, ignore_errors=True)


# ---------------------------------------------------------------------------------------- glob


def glob(
    pattern: str, what: str, error: type[Exception] = ValueError
) -> tuple[list[str], list[str]]:
    """The files a glob matches, sorted, as glob.glob(recursive=True) matches them (``**``
    spans folders; wildcards skip names that start with a dot), and the listing errors met.

    A local glob (``~`` expanded) walks the tree with os calls, each real file once
    (_local_glob); a URI's (gs://bucket/wiki/**/*.txt) is one walk of the bucket below the
    first wildcard, through etils.epath (_remote_glob).

    Args:
      pattern: the glob.
      what: the config field it came from, for messages (e.g. ``data.source 'text:...'``).
      error: the exception the caller's command reports in one line (data's DataError).

    Returns:
      (matched paths, listing errors: a bucket's, as text; none locally, where an unreadable
      folder is skipped as glob.glob skips it).

    Raises:
      error: a wildcard in a bucket's name, a scheme etils.epath does not read, or its
        filesystem package missing.
    """
    if not is_remote(pattern):
        return _local_glob(os.path.expanduser(pattern)), []
    return _remote_files(pattern, what, error)


def _local_glob(pattern: str) -> list[str]:
    """The files a local glob matches, sorted, each real file once.

    Matching is glob.glob's with ``recursive=True`` (``**`` spans directories; wildcards skip
    names that start with a dot), but the walk is bounded whatever links the tree holds: links to
    files are followed, and so are links to directories, except that a real directory is listed
    at most once per position in the pattern, so a link back to a parent (a loop) ends there
    instead of recursing forever. Directory links are followed after the real tree is walked, so
    files keep their own paths where they have one.

    A file reached by several paths (a link to it, a linked directory, a hard link) is read once,
    under the first of those paths, preferring one without links, in sorted order.
    """
    if not _MAGIC_RE.search(pattern):
        return [pattern] if os.path.isfile(pattern) else []
    if pattern.endswith(os.sep):
        return []  # glob matches only directories then, which hold no text themselves.
    parts = pattern.split(os.sep)
    first = next(i for i, p in enumerate(parts) if _MAGIC_RE.search(p))
    top = os.sep.join(parts[:first]) or (os.sep if pattern.startswith(os.sep) else "")
    rest = [p for p in parts[first:] if p]
    # Directories to list: (path, whether a link led there, pattern states). Real directories
    # are taken first (a stack, in sorted order); linked ones wait in `linked` until then.
    start = _glob_closure(rest, {0})
    stack = [(top, False, frozenset(start))]
    linked: list[tuple[str, bool, frozenset[int]]] = []
    listed: set[tuple[int, int, frozenset[int]]] = set()
    found: dict[tuple[int, int], tuple[bool, str]] = {}
    while stack or linked:
        if not stack:
            linked.sort(key=lambda item: item[0])
            stack = linked[::-1]
            linked = []
        directory, via_link, states = stack.pop()
        try:
            st = os.stat(directory or os.curdir)
            key = (st.st_dev, st.st_ino, states)
            if key in listed:
                continue
            listed.add(key)
            with os.scandir(directory or os.curdir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # Unreadable or vanished: glob skips it too.
        subdirs = []
        for entry in entries:
            after = _glob_step(rest, states, entry.name)
            if not after:
                continue
            path = os.path.join(directory, entry.name) if directory else entry.name
            try:
                is_link = entry.is_symlink()
                is_dir = entry.is_dir()  # Follows links, as glob does.
                if not is_dir and len(rest) in after and entry.is_file():
                    fst = entry.stat()
                    candidate = (via_link or is_link, path)
                    file_key = (fst.st_dev, fst.st_ino)
                    if file_key not in found or candidate < found[file_key]:
                        found[file_key] = candidate
            except OSError:
                continue  # A dangling link, or a file removed while listing.
            if is_dir and any(i < len(rest) for i in after):
                item = (path, via_link or is_link, frozenset(after))
                (linked if is_link else subdirs).append(item)
        stack.extend(reversed(subdirs))
    return sorted(path for _, path in found.values())


_MAGIC_RE = re.compile(r"[*?[]")


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _match_component(name: str, pattern: str) -> bool:
    # As glob.glob: a wildcard never matches a leading dot unless the pattern has one.
    if _hidden(name) and not _hidden(pattern):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _glob_closure(pattern: list[str], states: set[int]) -> set[int]:
    # `**` matches zero directories too: a state at `**` is also a state past it.
    out = set()
    for i in states:
        out.add(i)
        while i < len(pattern) and pattern[i] == "**":
            i += 1
            out.add(i)
    return out


def _glob_step(pattern: list[str], states: set[int], name: str) -> set[int]:
    """Pattern positions reachable after one more path component, ``name``.

    Positions index ``pattern`` (its components); ``len(pattern)`` means fully matched.
    """
    after = set()
    for i in states:
        if i == len(pattern):
            continue
        if pattern[i] == "**":
            if not _hidden(name):  # glob.glob's ** skips hidden files and directories
                after.add(i)
        elif _match_component(name, pattern[i]):
            after.add(i + 1)
    return _glob_closure(pattern, after)


def _walk(top: str, what: str, error: type[Exception], on_error: Callable) -> Iterator:
    """(root, folders, files) under the URI `top`, top down, as etils.epath walks it. For
    hf://, fsspec's own walk: etils hands fsspec's walk `max_depth` (fsspec's name is
    `maxdepth`), which gcsfs ignores and huggingface_hub's filesystem refuses with a TypeError,
    so that no hf:// glob could be listed."""
    path = remote_path(top, what, error)
    if scheme(top) != "hf":
        return path.walk(on_error=on_error)
    import fsspec  # etils.epath's backend for hf:// (present: remote_path found etils)

    fs, inner = fsspec.core.url_to_fs(normal(top))
    return fs.walk(inner, topdown=True, on_error=on_error)


def _remote_glob(
    top: str, pattern: list[str], what: str, error: type[Exception]
) -> tuple[list[str], list[str]]:
    """Files under ``top`` whose relative path matches ``pattern`` (components), as glob.glob
    with recursive=True would match them.

    One directory walk: epath's own glob refuses ``**`` and a listing per directory is what
    ``**`` costs anyway. Directories no match can lie under are not entered.

    Returns:
      (matched URIs, listing errors met).
    """
    errors: list[str] = []
    matched: list[str] = []
    first_root = None
    start = _glob_closure(pattern, {0})
    for root, dirs, files in _walk(top, what, error, errors.append):
        # fsspec's walk yields roots without the scheme ("bucket/dir"), TensorFlow's with it:
        # paths relative to the first root are the same either way.
        root = os.fspath(root).rstrip("/")
        first_root = root if first_root is None else first_root
        rel = [p for p in root[len(first_root) :].split("/") if p]
        states = start
        for part in rel:
            states = _glob_step(pattern, states, part)
        # In place, so the walk does not descend into directories no match can be under.
        dirs[:] = [
            d
            for d in dirs
            if any(i < len(pattern) for i in _glob_step(pattern, states, d.rstrip("/")))
        ]
        for name in files:
            if name and len(pattern) in _glob_step(pattern, states, name):
                matched.append("/".join([top, *rel, name]))
    for e in errors:  # a listing that got no answer is no listing: nothing can be said
        if deadline.is_timeout(e):
            raise deadline.NoAnswer(normal(top), deadline.bound_seconds(scheme(top))) from e
    return matched, [str(e) for e in errors]


def _remote_files(pattern: str, what: str, error: type[Exception]) -> tuple[list[str], list[str]]:
    """The objects a gs:// (s3://, ...) glob matches, sorted, and the listing errors met."""
    prefix = f"{scheme(pattern)}://"
    parts = [p for p in pattern[len(prefix) :].split("/") if p]
    magic = [i for i, p in enumerate(parts) if _MAGIC_RE.search(p)]
    if magic and magic[0] == 0:
        raise error(
            f"{what}: the bucket name cannot hold wildcards; glob below it, e.g. "
            f"{prefix}BUCKET/**/*.txt"
        )
    errors: list[str] = []
    with remote_errors(pattern, what, error), _answered(pattern):
        if not parts:
            found = []
        elif not magic:
            uri = prefix + "/".join(parts)
            path = remote_path(uri, what, error)
            found = [uri] if path.exists() and not path.is_dir() else []
        else:
            top = prefix + "/".join(parts[: magic[0]])
            found, errors = _remote_glob(top, parts[magic[0] :], what, error)
    return sorted(found), errors
