"""One run per gs:// workdir: a lock object with a lease, kept by generation preconditions.

flock(2) has no meaning on an object store, but every write to a GCS object can be made
conditional on the object's generation (a number GCS changes at every write). The lock is the
object WORKDIR/.lock, JSON naming its holder:

- taking it is a write with `if_generation_match=0` (only if absent), or with the generation
  just read when the object there says `released` or its holder's lease ran out; of two runs
  that try at once, GCS lets exactly one write succeed and the other gets 412 Precondition
  Failed, looks again and finds the winner's lock;
- the holder renews it every lease / 4 seconds (a thread) with the generation of its own last
  write, so a renewal also proves nobody took the lock meanwhile;
- a lock whose object has not been rewritten for `lease_seconds` (by GCS's own `updated` time)
  belongs to a run that is gone (SIGKILL, a preempted VM) and is taken over, with one log line;
  a holder on this host whose process has ended (same host name and pid namespace, pid not
  running) is taken over at once, as the kernel frees a flock at once;
- a holder that has not renewed for 3/4 of the lease (its renewals failing, or GCS refusing them
  because another run has taken the lock) ends its process at once with one line, before anyone
  may take the lock over: two runs never both believe they hold it. This assumes the hosts'
  clocks agree to within a quarter of the lease (60 s by default: NTP keeps cloud VMs within
  milliseconds);
- release writes `released` (again conditional on the holder's generation, so a run that lost
  the lock never frees the winner's).

The lease is `ELECTRA_JAX_LOCK_LEASE_SECONDS` (default 60): a rerun after a SIGKILL on another
host waits at most that long. The holder's and the takers' values must agree; the holder writes
its own into the lock, and takers use the larger of the two.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from electra_jax.store import deadline, jsonio

DEFAULT_LEASE_SECONDS = 60.0
LEASE_ENV = "ELECTRA_JAX_LOCK_LEASE_SECONDS"
# No run of ours holds a lease longer than a day: a lock object naming a longer one (1e300, which
# JSON holds as a finite number) would hold the workdir for ever, so it is not taken for ours.
MAX_LEASE_SECONDS = 86400.0
# Attempts at taking the lock when other runs keep changing it under us.
_ATTEMPTS = 5


class LockHeld(Exception):
    """The lock belongs to a live run; the message names it (command, pid, host, age)."""


def lease_seconds() -> float:
    """$ELECTRA_JAX_LOCK_LEASE_SECONDS, or the default where unset; EnvironmentValueError for a
    value that is no number of seconds > 0 (it was silently replaced by the default)."""
    from electra_jax.store import environment

    return environment.positive_seconds(
        LEASE_ENV, "the gs:// lock's lease", DEFAULT_LEASE_SECONDS, maximum=MAX_LEASE_SECONDS
    )


def split(uri: str) -> tuple[str, str]:
    """('BUCKET', 'PATH/TO/OBJECT') of gs://BUCKET/PATH/TO/OBJECT."""
    rest = uri.split("://", 1)[1]
    bucket, _, name = rest.partition("/")
    return bucket, name


def _pid_namespace() -> str:
    """This process's pid namespace (containers on one host have their own), '' if unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's live process, or not a pid we can ask about
    return True


def _client():
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from google.cloud import storage

    # With STORAGE_EMULATOR_HOST set (tests), the client talks to that server anonymously.
    return storage.Client()


def _errors():
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from google.api_core import exceptions

    return exceptions


class GcsLock:
    """The lock object `uri` (gs://BUCKET/PATH/.lock), held from `acquire()` to `release()`.

    holder: what the lock says of this run (command, kind); host, pid, start time and lease are
    added. log: gets the one line of a takeover. on_lost: called (from the renewal thread) with
    one line when the lease cannot be kept; by default it prints the line and ends the process
    with exit code 1, since the run may no longer write the workdir. renew_every: seconds between
    renewals, a quarter of the lease by default (a takeover is noticed at the next one).
    """

    def __init__(
        self,
        uri: str,
        holder: dict[str, Any],
        *,
        lease: float | None = None,
        log: Callable[[str], None] | None = None,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        renew_every: float | None = None,
    ):
        self.uri = uri
        self.lease = lease or lease_seconds()
        self.renew_every = renew_every or self.lease / 4
        self._bucket_name, self._name = split(uri)
        self._holder = {
            **holder,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "pid_namespace": _pid_namespace(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "lease_seconds": self.lease,
        }
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._on_lost = on_lost or _exit_lost
        self._clock = clock
        self._generation: int | None = None
        self._confirmed = 0.0  # clock() when the last successful write was sent
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._blob_handle = None

    # ----------------------------------------------------------------------------- take

    def _blob(self):
        if self._blob_handle is None:
            self._blob_handle = _client().bucket(self._bucket_name).blob(self._name)
        return self._blob_handle

    def _write(self, info: dict, generation: int, quick: bool = False) -> int:
        """Writes `info` if the object's generation is `generation` (0: absent); its new
        generation. Raises google.api_core.exceptions.PreconditionFailed otherwise. Each
        request waits deadline.request_seconds() for an answer (google-cloud-storage's own
        retries on top); `quick` (renewals): no retries and a timeout of a quarter lease, so
        that a hung request never keeps the holder from noticing that its lease is running
        out."""
        blob = self._blob()
        if quick:
            extra = {"retry": None, "timeout": max(1.0, self.lease / 4)}
        else:
            extra = {"timeout": deadline.request_seconds()}
        blob.upload_from_string(
            json.dumps(info, sort_keys=True),
            content_type="application/json",
            if_generation_match=generation,
            **extra,
        )
        return int(blob.generation)

    def _read(self):
        """(generation, holder dict, seconds since GCS last wrote it) or None when absent."""
        errors = _errors()
        bucket = _client().bucket(self._bucket_name)
        seconds = deadline.request_seconds()  # each request's; the library's retries on top
        blob = bucket.get_blob(self._name, timeout=seconds)
        if blob is None:
            return None
        try:
            data = blob.download_as_bytes(if_generation_match=blob.generation, timeout=seconds)
        except (errors.PreconditionFailed, errors.NotFound):
            return "changed"
        try:
            info = jsonio.loads(data)
        except ValueError:  # malformed, or nested too deep: a lock object that is not ours
            info = None
        updated = blob.updated or datetime.datetime.now(datetime.timezone.utc)
        age = datetime.datetime.now(datetime.timezone.utc).timestamp() - updated.timestamp()
        return int(blob.generation), info, max(0.0, age)

    def _stale(self, info: dict, age: float) -> str | None:
        """Why the holder in `info` is gone ('' when it released the lock), or None if it may
        be alive."""
        if info.get("released"):
            return ""
        same_host = (
            info.get("host") == self._holder["host"]
            and info.get("pid_namespace") == (self._holder["pid_namespace"])
        )
        pid = info.get("pid")
        alive = not (same_host and self._holder["pid_namespace"] and isinstance(pid, int)) or (
            _pid_alive(pid)
        )
        if not alive:
            return f"its process {pid} on this host has ended"
        lease = max(self.lease, float(info.get("lease_seconds") or 0))
        if age > lease:
            return f"it was last renewed {age:.0f}s ago, past its lease of {lease:.0f}s"
        return None

    def acquire(self) -> None:
        """Takes the lock, or raises LockHeld naming the live holder."""
        errors = _errors()
        for _ in range(_ATTEMPTS):
            found = self._read()
            if found == "changed":
                continue
            reason = None
            if found is None:
                generation, info = 0, {}
            else:
                generation, info, age = found
                problem = record_problem(info)
                if problem:
                    raise ForeignLock(
                        f"its lock object {self.uri} does not hold a lock record of electra_jax "
                        f"({problem}); if no run uses this workdir, delete that object (gcloud "
                        f"storage rm {self.uri}) and run again"
                    )
                reason = self._stale(info, age)
                if reason is None:
                    raise LockHeld(describe_holder(info, age, self.lease))
            sent = self._clock()
            try:
                new = self._write(self._holder, generation)
            except errors.PreconditionFailed:
                continue  # another run wrote it first: look again
            with self._mutex:
                self._generation, self._confirmed = new, sent
            if reason:
                self._log(f"took over the lock {self.uri} of {holder_words(info)}: {reason}")
            self._thread = threading.Thread(target=self._renew_loop, daemon=True, name="lock")
            self._thread.start()
            return
        raise LockHeld(f"the lock {self.uri} keeps changing under us (other runs taking it)")

    # ---------------------------------------------------------------------------- renew

    def _renew_loop(self) -> None:
        errors = _errors()
        while not self._stop.wait(self.renew_every):
            sent = self._clock()
            try:
                with self._mutex:
                    if self._generation is None:
                        return
                    info = {**self._holder, "renewed": time.time()}
                    new = self._write(info, self._generation, quick=True)
                    self._generation, self._confirmed = new, sent
                continue
            except errors.PreconditionFailed:
                try:
                    adopted = self._adopt()
                except Exception:  # unreadable now: the lock is not known to be ours
                    adopted = False
                if not adopted:
                    self._lost("another run has taken it over")
                    return
                continue
            except Exception as e:  # the network, GCS unavailable: try again at the next tick
                reason = " ".join(str(e).split())[:200]
            if self._clock() - self._confirmed > 0.75 * self.lease:
                self._lost(f"it could not be renewed for {0.75 * self.lease:.0f}s ({reason})")
                return

    def _adopt(self) -> bool:
        """After a refused renewal: whether the object still names this run (a write whose
        answer was lost did land); its generation is then taken as ours."""
        found = self._read()
        if not isinstance(found, tuple):
            return False
        generation, info, _ = found
        if record_problem(info):
            return False
        mine = all(info.get(k) == self._holder[k] for k in ("pid", "host", "started"))
        if not mine or info.get("released"):
            return False
        with self._mutex:
            self._generation = generation  # `_confirmed` stays: when that write was sent is unknown
        return True

    def _lost(self, why: str) -> None:
        with self._mutex:
            self._generation = None
        self._on_lost(
            f"error: lost the lock {self.uri} ({why}); this run stops at once so that two runs "
            "never write one workdir: run the command again to resume from the last checkpoint"
        )

    @property
    def held(self) -> bool:
        with self._mutex:
            return self._generation is not None

    # ---------------------------------------------------------------------------- release

    def release(self) -> None:
        """Stops renewing and marks the lock released (only if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        errors = _errors()
        with self._mutex:
            generation, self._generation = self._generation, None
        if generation is None:
            return
        try:
            self._write({**self._holder, "released": True}, generation)
        except errors.PreconditionFailed:
            pass  # taken over meanwhile: it is the new holder's now
        except Exception:
            pass  # unreachable: the lease runs out and the next run takes it over


def record_problem(info: Any) -> str | None:
    """What keeps the lock object's content (parsed JSON, None when it is not JSON) from being a
    lock record this package writes; None when it is one. A released record needs no holder."""
    if not isinstance(info, dict):
        return "it is not JSON" if info is None else f"it holds a JSON {jsonio.json_kind(info)}"
    if info.get("released") is True:
        return None
    for key, kind, words in (
        ("command", str, "a command's name"),
        ("host", str, "a host name"),
        ("pid", int, "a process id"),
    ):
        value = info.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"its {key} is {jsonio.one_line(repr(value), 40)}, not {words}"
    lease = info.get("lease_seconds")
    number = isinstance(lease, int | float) and not isinstance(lease, bool)
    if not (number and math.isfinite(lease) and lease > 0):
        return (
            f"its lease_seconds is {jsonio.one_line(repr(lease), 40)}, not a finite number of "
            "seconds > 0"
        )
    if lease > MAX_LEASE_SECONDS:
        return (
            f"its lease_seconds is {lease:g}, longer than any run's lease (at most "
            f"{MAX_LEASE_SECONDS:g} s): it would hold the workdir for ever"
        )
    return None


def holder_words(info: dict) -> str:
    return (
        f"{info.get('command', 'a run')} (pid {info.get('pid', '?')} on host "
        f"{info.get('host', '?')}, since {info.get('started', '?')})"
    )


class ForeignLock(Exception):
    """The lock object holds something other than our lock record: it cannot say whether a run
    holds the workdir, so it is neither taken over nor waited for. The message says what to do."""


def describe_holder(info: dict, age: float, lease: float) -> str:
    """'electra_jax.train (pid 12 on host h, since ...; renewed 5s ago, lease 60s)'."""
    lease = max(lease, float(info.get("lease_seconds") or 0))
    return (
        f"{holder_words(info)}; its lease was renewed {age:.0f}s ago, and runs out "
        f"{max(0.0, lease - age):.0f}s after its last renewal"
    )


def _exit_lost(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    os._exit(1)
