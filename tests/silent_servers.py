"""Remote services that never answer, for the tests of every network call's deadline.

`silent_address`: a local address that accepts connections (the kernel's backlog) and never
answers a byte: a store, a Hub or any service whose machine is up and whose server hangs.
`half_answering_hub`: a Hugging Face Hub that answers the repository check of `someone/data`
(with the library's own timeout on it) and never answers anything else (a listing, a file),
which huggingface_hub asks with no timeout of its own. Nothing is sent anywhere else.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

# The dataset repository `half_answering_hub` knows.
HUB_DATASET = "someone/data"


@pytest.fixture
def silent_address():
    """'http://127.0.0.1:PORT' of a socket that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()  # an abandoned request's connection is reset, and its thread ends


class _HalfAnswering(http.server.BaseHTTPRequestHandler):
    release: threading.Event  # set by the fixture's teardown: the held requests end

    def do_GET(self) -> None:
        if self.path.split("?")[0] == f"/api/datasets/{HUB_DATASET}":
            body = json.dumps({"id": HUB_DATASET, "sha": "0" * 40, "private": False}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.release.wait()  # holds the request, answering nothing

    do_POST = do_GET

    def log_message(self, *args) -> None:  # the test's output stays the test's
        pass


@pytest.fixture
def half_answering_hub():
    """'http://127.0.0.1:PORT' of a Hub that answers only the repository check of
    HUB_DATASET."""
    release = threading.Event()
    handler = type("Handler", (_HalfAnswering,), {"release": release})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    release.set()
    server.shutdown()
    server.server_close()
