"""Every network call has a deadline: `export --push_to_hub` against a Hub that accepts the
connection and never answers ends within its stated time, in one line, the export kept."""

import time

import pytest

from electra_jax.hf import hub


@pytest.fixture
def silent_hub(silent_address, monkeypatch):
    """The Hub at a local address that accepts connections and never answers."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", silent_address)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return silent_address


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
