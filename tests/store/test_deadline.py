"""Every network call has a deadline (store/deadline.py): a bounded wait ends at its deadline,
and a store that accepts the connection and never answers ends a read, a listing or a glob
within the per-request timeout, as deadline.NoAnswer naming the path.

The stores are local sockets that never answer (tests/silent_servers.py). Each store's test runs
in a fresh interpreter, as a command does: the libraries' timeouts are set once per process,
before their first request (etils keeps one filesystem per scheme). The libraries' own back-off
between their retries (gcsfs: 1 + 2 + 4 + 8 + 16 s; huggingface_hub: 1 + 2 + 4 + 8 + 8 s) is
theirs, not what is tested, and is made 0 there; their tries, each ending at the deadline, stay.
"""

import threading

import pytest

from electra_jax.store import deadline, environment
from tests.conftest import run_python
from tests.silent_servers import HUB_DATASET


def test_a_call_within_its_deadline_gives_its_result_or_its_error():
    assert deadline.call_within(60, lambda a, b: a + b, 1, b=2) == 3
    with pytest.raises(KeyError, match="x"):
        deadline.call_within(60, lambda: {}["x"])


def test_a_call_past_its_deadline_is_abandoned_on_its_thread():
    release = threading.Event()
    with pytest.raises(deadline.DeadlinePassed, match="no answer within 0.2s"):
        deadline.call_within(0.2, release.wait)  # blocks until the test releases it
    release.set()


def test_the_request_deadline_is_read_from_the_environment_and_checked(monkeypatch):
    monkeypatch.delenv(deadline.TIMEOUT_ENV, raising=False)
    assert deadline.request_seconds() == deadline.DEFAULT_TIMEOUT_SECONDS
    monkeypatch.setenv(deadline.TIMEOUT_ENV, "2.5")
    assert deadline.request_seconds() == 2.5
    for bad in ("abc", "0", "inf", "7200"):
        monkeypatch.setenv(deadline.TIMEOUT_ENV, bad)
        with pytest.raises(environment.EnvironmentValueError, match=f"{deadline.TIMEOUT_ENV}="):
            deadline.request_seconds()


def test_a_timeout_is_known_in_each_library_s_type():
    class TimeoutException(Exception):  # httpx's, which is no OSError
        pass

    class ReadTimeout(TimeoutException):
        pass

    assert deadline.is_timeout(ReadTimeout("timed out"))
    assert deadline.is_timeout(TimeoutError())  # asyncio's, aiohttp's, socket.timeout
    assert deadline.is_timeout(deadline.NoAnswer("gs://b/x", 1))
    assert not deadline.is_timeout(OSError(5, "I/O error"))
    assert not deadline.is_timeout(ValueError("timeout is not a number"))


# A read of an object in a bucket whose server never answers (STORAGE_EMULATOR_HOST, which
# gcsfs and tensorstore both take).
_BUCKET_PROBE = """
import asyncio, sys, time
import gcsfs.retry

no_backoff = type(sys)("no_backoff")
no_backoff.sleep = lambda seconds: asyncio.sleep(0)
gcsfs.retry.asyncio = no_backoff
from electra_jax.store import deadline, paths

for call in (
    lambda: paths.read_bytes("gs://bucket/run/config.json"),
    lambda: paths.glob("gs://bucket/corpus/*.txt", "data.source"),  # a listing that never ends
):
    started = time.monotonic()
    try:
        call()
    except deadline.NoAnswer as e:
        print(f"{e} | {time.monotonic() - started:.1f}s")
import os
print(os.environ.get("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"))
"""


def test_a_bucket_that_never_answers_ends_a_read_and_a_listing_at_their_deadline(
    silent_address, monkeypatch
):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", silent_address)
    monkeypatch.setenv(deadline.TIMEOUT_ENV, "0.25")
    monkeypatch.delenv("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", raising=False)
    # Without the deadline gcsfs waits for ever (aiohttp with timeout=None): the guard fails.
    out = run_python("-c", _BUCKET_PROBE, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    read, listed, low_speed = out.stdout.strip().splitlines()
    for said, path in ((read, "gs://bucket/run/config.json"), (listed, "gs://bucket/corpus")):
        line, seconds = said.split(" | ")
        assert line == f"{path}: no answer within 0.25s ({deadline.TIMEOUT_ENV})"
        assert float(seconds[:-1]) < 30  # 6 tries of 0.25 s, and the interpreter's pace
    assert low_speed == "1"  # tensorstore (orbax's checkpoints) ends a silent request too


# A glob of a dataset on a Hub that answers the repository check and never the listing.
_HUB_PROBE = """
import sys, time
from huggingface_hub.utils import _http

no_backoff = type(sys)("no_backoff")
no_backoff.sleep = lambda seconds: None
_http.time = no_backoff
from electra_jax.store import deadline, paths

started = time.monotonic()
try:
    paths.glob("hf://datasets/DATASET/**/*.txt", "data.source")
except deadline.NoAnswer as e:
    print(f"{e} | {time.monotonic() - started:.1f}s")
""".replace("DATASET", HUB_DATASET)


def test_a_hub_that_never_answers_a_listing_ends_the_glob_at_its_deadline(
    half_answering_hub, monkeypatch
):
    monkeypatch.setenv("HF_ENDPOINT", half_answering_hub)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(deadline.TIMEOUT_ENV, "0.25")
    # huggingface_hub asks for the listing with no timeout: without the deadline it waits for
    # ever, and the guard fails.
    out = run_python("-c", _HUB_PROBE, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    line, seconds = out.stdout.strip().split(" | ")
    pattern = f"hf://datasets/{HUB_DATASET}/**/*.txt"
    assert line == f"{pattern}: no answer within 0.25s ({deadline.TIMEOUT_ENV})"
    assert float(seconds[:-1]) < 30  # 6 tries of 0.25 s, and the interpreter's pace
