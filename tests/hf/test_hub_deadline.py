"""Every network call has a deadline: `export --push_to_hub` against a Hub that accepts the
connection and never answers ends within its stated time, in one line, the export kept."""

import socket
import threading
import time

import pytest

from electra_jax.hf import hub
from electra_jax.store import deadline


def test_a_call_within_its_deadline_gives_its_result_or_its_error():
    assert deadline.call_within(60, lambda a, b: a + b, 1, b=2) == 3
    with pytest.raises(KeyError, match="x"):
        deadline.call_within(60, lambda: {}["x"])


def test_a_call_past_its_deadline_is_abandoned_on_its_thread():
    release = threading.Event()
    with pytest.raises(deadline.DeadlinePassed, match="no answer within 0.2s"):
        deadline.call_within(0.2, release.wait)  # blocks until the test releases it
    release.set()


@pytest.fixture
def silent_hub(monkeypatch):
    """A local address that accepts connections (the kernel's backlog) and never answers."""
    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield endpoint
    server.close()  # the abandoned request's connection is reset, and its thread ends


def test_a_hub_that_never_answers_ends_the_push_at_its_deadline(silent_hub, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    started = time.monotonic()
    with pytest.raises(hub.HubTimeout) as e:
        hub.push(str(tmp_path), "someone/electra", {"files": ["model.safetensors"]},
                 timeout_seconds=1)  # fmt: skip
    assert time.monotonic() - started < 30  # the deadline, not the library's (none)
    line = str(e.value)
    assert line.startswith(f"the export is in {tmp_path}, but the Hub ({silent_hub}) did not")
    assert "within 1s (--hub_timeout_seconds)" in line and "\n" not in line
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"
