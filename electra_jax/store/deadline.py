"""Deadlines on calls to remote services: every one ends within a stated time, answered or not.

Two mechanisms, one per kind of call:

- `bound(scheme)`: the per-request timeout of the library that reaches a store, set explicitly
  to `request_seconds()` ($ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS, default 60) before its first
  request, where the library's own default is no limit at all: gcsfs asks aiohttp with
  `timeout=None` (a bucket that accepts the connection and never answers held a read forever),
  tensorstore's curl has no timeout unless its low-speed limit is set, and huggingface_hub's
  shared client has none (only some of its calls pass one). Each library's own retries then
  apply, so a store that never answers ends a call within a bound docs/reliability.md states.
  `paths` calls it before it hands a URI to etils.epath; readers that hand a URI to a library
  themselves (TFDS's data_dir) call it too. A request that timed out surfaces as `NoAnswer` (an
  OSError naming the path, `paths`) or as the library's own timeout, which `is_timeout` knows,
  and a command ends on either in one line (cli.run_to_the_end).
- `call_within(seconds, fn)`: a bounded wait, for a call whose library retries without end or
  has no timeout to set (the Hub upload): the call runs on a daemon thread that the caller stops
  waiting for at the deadline; the command then reports it in one line and ends (a daemon
  thread blocked on a socket does not hold the process up).

Imports only the environment reader (a leaf); the libraries are imported where they are bound.
"""

from __future__ import annotations

import errno
import math
import os
import threading
from collections.abc import Callable
from typing import Any

from electra_jax.store import environment

TIMEOUT_ENV = "ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS"
# How long one request to a remote store (gs://, hf://) may go without an answer (connecting,
# or between bytes of the answer) before it fails: a stalled request, not a slow transfer, since
# a large object is read and written in pieces. The libraries' retries come on top.
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 3600.0


class DeadlinePassed(TimeoutError):
    """The call did not end within its deadline (it may still be running, abandoned)."""


class NoAnswer(TimeoutError):
    """A request to a remote store got no answer within `request_seconds()`.

    An OSError (TimeoutError, errno ETIMEDOUT): a reader that names the file of an OSError it
    meets names this one, and its strerror fits "cannot read PATH (...)".
    """

    def __init__(self, path: str, seconds: float | None):
        # The deadline its library was given (`bound`); None: the library's own, whatever it is.
        within = f"within {seconds:g}s ({TIMEOUT_ENV})" if seconds else "within its library's time"
        super().__init__(errno.ETIMEDOUT, f"no answer {within}")
        self.filename = path

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def request_seconds() -> float:
    """$ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS, or the default where unset.

    Raises:
      environment.EnvironmentValueError: a value that is no number of seconds in (0, 3600].
    """
    return environment.positive_seconds(
        TIMEOUT_ENV,
        "how long a request to a remote store waits for an answer",
        DEFAULT_TIMEOUT_SECONDS,
        maximum=MAX_TIMEOUT_SECONDS,
    )


def is_timeout(error: BaseException) -> bool:
    """Whether `error` is a request's timeout, in any network library's type: Python's
    TimeoutError (asyncio's and aiohttp's, socket.timeout, NoAnswer) or a type named for one
    (httpx's TimeoutException, requests' Timeout), which are not OSErrors."""
    if isinstance(error, TimeoutError):
        return True
    return any(c.__name__ in ("TimeoutException", "Timeout") for c in type(error).__mro__)


def no_answer_line(error: BaseException) -> str:
    """The one line a command ends with on a request's timeout (`is_timeout`): what got no
    answer, and what to do."""
    if isinstance(error, NoAnswer):
        what = f"{error.filename}: {error.strerror}"
    else:
        said = " ".join(str(error).split())[:120]
        what = f"a request to a remote store got no answer ({type(error).__name__}: {said})"
    return f"{what}; check the network and the store's status, then run the same command again"


# The schemes whose library has been given its timeout in this process, and the value given:
# etils caches one filesystem per scheme, made at its first use, so the setting must come first.
_BOUND: dict[str, float] = {}
_BOUND_LOCK = threading.Lock()
# A forked child gets new clients (huggingface_hub closes its shared one there): bound again.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_BOUND.clear)


def bound_seconds(scheme: str | None) -> float | None:
    """The per-request deadline `bound` gave the library of `scheme` in this process, or None
    (not given: a local path, or a scheme with no setter)."""
    return _BOUND.get(scheme or "")


def bound(scheme: str | None) -> None:
    """Gives the library that reaches `scheme` ('gs', 'hf'; others and None: nothing) its
    per-request timeout, once per process, before its first request. A library's own setting
    of it, where the user made one, is kept (FSSPEC_GS_REQUESTS_TIMEOUT, HF_HUB_ETAG_TIMEOUT,
    TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS).

    Raises:
      environment.EnvironmentValueError: $ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS is not a number
        of seconds (commands check it at their start: cli.parse_flags).
    """
    setter = _SETTERS.get(scheme or "")
    if setter is None or scheme in _BOUND:
        return
    seconds = request_seconds()
    with _BOUND_LOCK:
        if scheme not in _BOUND:
            setter(seconds)
            _BOUND[scheme] = seconds


def _bound_gcs(seconds: float) -> None:
    # gcsfs (etils.epath's gs:// backend without TensorFlow) passes `requests_timeout` to each
    # aiohttp request; its default, None, is no limit. A timeout of the connection and of each
    # read (not of the whole request: a large object is fetched in block-sized requests) is
    # retried by gcsfs (6 tries, 1 + 2 + 4 + 8 + 16 s apart and up to a second more each).
    try:
        import aiohttp
        from fsspec import config as fsspec_config
    except ImportError:  # no [gcs] extra: paths.remote_errors names the missing package
        pass
    else:
        conf = fsspec_config.conf
        if not any("requests_timeout" in conf.get(name, {}) for name in ("gs", "gcs")):
            conf.setdefault("gs", {})["requests_timeout"] = aiohttp.ClientTimeout(
                total=None, sock_connect=seconds, sock_read=seconds
            )
    # tensorstore (orbax's checkpoints in a bucket) reads these when it makes its HTTP transport,
    # at its first request: a request that receives nothing for that long fails, and its GCS
    # driver retries it (32 tries, up to 32 s apart).
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", str(math.ceil(seconds)))
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")


def _bound_hf(seconds: float) -> None:
    # huggingface_hub (etils.epath's hf:// backend, HfFileSystem): its shared httpx client has
    # no timeout, and its listings pass `timeout=None` per request, which httpx takes as none at
    # all; its repository check and file reads pass their own (HF_HUB_ETAG_TIMEOUT,
    # HF_HUB_DOWNLOAD_TIMEOUT: 10 s by default), set to the same value here unless the user set
    # them. Every request its client sends gets `seconds` wherever it asked for no limit (an
    # httpx request hook fills the request's timeout), and the client is made so again if
    # huggingface_hub makes a new one (after an SSL error). File reads are retried (5 times, up
    # to 8 s apart).
    try:
        from huggingface_hub import constants, set_client_factory
        from huggingface_hub.utils import _http
    except ImportError:  # paths.remote_errors names the missing package
        return
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        if not os.environ.get(name):
            setattr(constants, name, seconds)

    def fill(request) -> None:
        limits = request.extensions.get("timeout")
        if isinstance(limits, dict):
            request.extensions["timeout"] = {
                kind: seconds if value is None else value for kind, value in limits.items()
            }

    def client():
        made = _http.default_client_factory()
        hooks = made.event_hooks
        made.event_hooks = {**hooks, "request": [*hooks.get("request", []), fill]}
        return made

    set_client_factory(client)  # closes the shared client: the next request makes ours


_SETTERS: dict[str, Callable[[float], None]] = {"gs": _bound_gcs, "hf": _bound_hf}


def call_within(seconds: float, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """fn(*args, **kwargs)'s result or exception, if it ends within `seconds`.

    Raises:
      DeadlinePassed: it did not; the call is left running on its daemon thread.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (handed to the caller, whatever it is)
            outcome["error"] = e

    thread = threading.Thread(target=run, name="electra_jax-deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeadlinePassed(f"no answer within {seconds:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
