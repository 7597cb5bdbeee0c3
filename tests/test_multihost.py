"""Two processes x 4 simulated CPU devices on 127.0.0.1 (launch/local_multiprocess.sh): the same
losses as one process, resume from their checkpoint, and a bounded failure when a peer dies."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from electra_jax import loop, metrics
from tests.conftest import ROOT, subprocess_env
from tests.test_loop import config_with, prepare_shared_data
from tests.test_preemption import _config_file


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _two_processes(config_path, workdir):
    env = dict(subprocess_env(), PORT=_free_port(), DEVICES_PER_PROCESS="4")
    return subprocess.run(
        [
            "bash",
            "launch/local_multiprocess.sh",
            "2",
            f"--config={config_path}",
            f"--workdir={workdir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def _losses(workdir):
    return {r["step"]: r["loss"] for r in metrics.read_rows(os.path.join(workdir, "metrics.jsonl"))}


@pytest.mark.slow
def test_two_processes_match_one_and_resume(shared_data, tmp_path):
    config_path = _config_file(tmp_path, shared_data, num_steps=6, every=3)
    one = tmp_path / "one"
    loop.train(config_with(shared_data), str(one))  # one process, one device
    two = tmp_path / "two"
    out = _two_processes(config_path, two)
    assert out.returncode == 0, out.stderr[-3000:]
    a, b = _losses(one), _losses(two)
    assert sorted(b) == list(range(1, 7))
    for step in a:
        np.testing.assert_allclose(b[step], a[step], rtol=1e-4, err_msg=f"step {step}")
    # Every process wrote its part of the checkpoint (orbax multi-host) and of the data state.
    data = sorted(n for n in os.listdir(two / "checkpoints" / "6" / "data") if "process" in n)
    assert data == ["process_0-of-2.json", "process_1-of-2.json"], data

    # Lose the last checkpoint: both processes restore step 3 and redo 4-6 identically.
    shutil.move(two / "checkpoints" / "6", tmp_path / "moved")
    out = _two_processes(config_path, two)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from checkpoint 3" in out.stderr
    assert _losses(two) == b


_LONG = "--config.train.num_steps=100000"


@pytest.mark.slow
def test_a_dead_peer_ends_the_run_within_the_timeout(shared_data, tmp_path):
    config_path = _config_file(tmp_path, shared_data, num_steps=6, every=1000)
    workdir = tmp_path / "w"
    procs = _start_two(config_path, workdir, "--peer_timeout_seconds=5")
    try:
        _wait_for_rows(workdir, procs[0])
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.time()
        _, err = procs[0].communicate(timeout=90)
        waited = time.time() - t0
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert waited < 60, waited
    # jax's coordination service ("another task died ... stopped sending heartbeats"), or
    # first the collective library, when the dead peer's socket closes mid-step (Gloo then
    # reports a closed connection, or a torn message: "gloo::EnforceNotMet ... Received data
    # size doesn't match").
    clues = ("another task died", "stopped sending heartbeats", "connection closed", "gloo")
    assert any(c in err.lower() for c in clues), err[:4000]


def _start_two(config_path, workdir, *flags):
    port = _free_port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "electra_jax.train",
                f"--config={config_path}",
                f"--workdir={workdir}",
                _LONG,
                f"--coordinator_address=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={i}",
                *flags,
            ],
            cwd=ROOT,
            env=subprocess_env(devices=4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]


def _wait_for_rows(workdir, proc, n=2):
    rows, deadline = workdir / "metrics.jsonl", time.time() + 300
    while not (rows.exists() and len(rows.read_text().splitlines()) >= n):
        assert time.time() < deadline and proc.poll() is None, "the run never started"
        time.sleep(0.5)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_the_same_step(shared_data, tmp_path):
    config_path = _config_file(tmp_path, shared_data, num_steps=6, every=1000)
    workdir = tmp_path / "w"
    procs = _start_two(config_path, workdir)
    try:
        _wait_for_rows(workdir, procs[0])
        procs[1].send_signal(signal.SIGTERM)  # as a pre-emptible VM's notice reaches one host
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], errs[0][-2000:] + errs[1][-2000:]
    step = int(errs[0].split("preempted at step ")[1].split(";")[0])
    # Both saved their part of the same step, the last row logged.
    data = sorted(
        n for n in os.listdir(workdir / "checkpoints" / str(step) / "data") if "of-2" in n
    )
    assert data == ["process_0-of-2.json", "process_1-of-2.json"]
    assert max(_losses(workdir)) == step
