"""Several processes with simulated CPU devices on 127.0.0.1 (launch/local_multiprocess.sh): the
same losses as one process, resume from their checkpoint on the same layout and on another number
of processes or devices per process, and a bounded failure when a peer dies."""

import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from electra_jax.pretraining import metrics, runner
from tests.conftest import ROOT, built_once, error_line, subprocess_env
from tests.pretraining.test_runner import prepare_shared_data
from tests.test_preemption import _config_file


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _env(devices: int) -> dict:
    """subprocess_env, with every process keeping its compiled programs in the suite's
    compilation cache (tests/every_process_caches)."""
    env = subprocess_env(devices=devices)
    hook = str(ROOT / "tests" / "every_process_caches")
    env["PYTHONPATH"] = hook + os.pathsep + env["PYTHONPATH"]
    return env


def _launch(config_path, workdir, processes, devices):
    """`processes` x `devices` simulated CPU devices training on `workdir`: the finished
    process (two or more through launch/local_multiprocess.sh, one as `python -m`)."""
    env = dict(_env(devices), PORT=_free_port())
    flags = [f"--config={config_path}", f"--workdir={workdir}"]
    if processes == 1:
        argv = [sys.executable, "-m", "electra_jax.train", *flags]
    else:
        env["DEVICES_PER_PROCESS"] = str(devices)
        argv = ["bash", "launch/local_multiprocess.sh", str(processes), *flags]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


def _losses(workdir):
    return {r["step"]: r["loss"] for r in metrics.read_rows(os.path.join(workdir, "metrics.jsonl"))}


@pytest.fixture(scope="module")
def runs(shared_data, tmp_path_factory):
    """Two uninterrupted runs of the same 6 steps (checkpoints 3 and 6), made once per test run
    for the module's resumes, whichever worker runs them: 2 processes x 4 devices
    (launch/local_multiprocess.sh), and one process with one device (in the process that builds
    them). {"config": the config file, "two": workdir, "one": workdir}."""
    root = built_once(tmp_path_factory, "multihost-layouts", lambda r: _two_layouts(r, shared_data))
    return {"config": str(root / "config.py"), "two": root / "two", "one": root / "one"}


def _two_layouts(root, shared_data) -> None:
    config_path = _config_file(root, shared_data, num_steps=6, every=3)
    out = _launch(config_path, root / "two", 2, 4)
    assert out.returncode == 0, out.stderr[-3000:]
    runner.train(_file_config(config_path), str(root / "one"))


def _file_config(config_path):
    """The config of a config file, for runner.train in this process."""
    return runpy.run_path(config_path)["get_config"]()


def _from_checkpoint_3(runs, name, tmp_path):
    """A copy of run `name`'s workdir as a preemption after step 3 leaves it."""
    workdir = tmp_path / f"from_{name}"
    shutil.copytree(runs[name], workdir)
    shutil.rmtree(workdir / "checkpoints" / "6")
    return workdir


def _assert_same_losses(got, want, steps):
    assert sorted(got) == list(range(1, 7)), sorted(got)
    for step in steps:
        np.testing.assert_allclose(got[step], want[step], rtol=1e-4, err_msg=f"step {step}")


@pytest.mark.slow
def test_two_processes_match_one_and_resume(runs, tmp_path):
    two = runs["two"]
    a, b = _losses(runs["one"]), _losses(two)
    _assert_same_losses(b, a, range(1, 7))
    # Every process wrote its part of the state (orbax multi-host); process 0 alone the input
    # position, a step counter that does not depend on the process count.
    state = sorted(n for n in os.listdir(two / "checkpoints" / "6" / "state") if "process" in n)
    assert state == ["ocdbt.process_0", "ocdbt.process_1"], state
    position = json.loads((two / "checkpoints" / "6" / "position" / "position.json").read_text())
    assert position["data"] == {"next_index": 6}
    assert position["layout"] == {"processes": 2, "devices": 8}
    # The goodput totals (process 0's clock) travel with the position: nothing else does.
    assert set(position) == {"data", "layout", "goodput"}
    assert position["goodput"]["productive_sec"] > 0

    # Lose the last checkpoint: both processes restore step 3 and redo 4-6 identically.
    workdir = _from_checkpoint_3(runs, "two", tmp_path)
    out = _launch(runs["config"], workdir, 2, 4)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from checkpoint 3" in out.stderr
    assert _losses(workdir) == b


@pytest.mark.slow
def test_two_processes_checkpoint_resumes_on_one_process(runs, tmp_path, capsys):
    """(N, M) = (2, 1), 4 devices each -> 1: the losses of the run that used one process from
    the start, and no checkpoint set aside."""
    workdir = _from_checkpoint_3(runs, "two", tmp_path)
    capsys.readouterr()
    runner.train(_file_config(runs["config"]), str(workdir))
    err = capsys.readouterr().err
    assert (
        "checkpoint 3 was written by 2 processes x 4 devices; resuming it on 1 process x 1 device"
        in err
    )
    assert "resumed from checkpoint 3" in err
    _assert_same_losses(_losses(workdir), _losses(runs["one"]), range(4, 7))
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_processes(runs, tmp_path):
    """(N, M) = (1, 2), 1 device each -> 4: the losses of the 2 x 4 run from the start."""
    workdir = _from_checkpoint_3(runs, "one", tmp_path)
    out = _launch(runs["config"], workdir, 2, 4)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "checkpoint 3 was written by 1 process x 1 device; resuming it on 2 processes x 4 devices"
        in out.stderr
    )
    _assert_same_losses(_losses(workdir), _losses(runs["two"]), range(4, 7))
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]


@pytest.mark.slow
def test_a_checkpoint_resumes_with_other_devices_per_process(runs, tmp_path):
    """One process, 1 device -> 8 devices: the losses of the run on 8 devices (one mesh of 8
    whether its devices are in one process or two: the same global batch on the same mesh)."""
    workdir = _from_checkpoint_3(runs, "one", tmp_path)
    out = _launch(runs["config"], workdir, 1, 8)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming it on 1 process x 8 devices" in out.stderr
    _assert_same_losses(_losses(workdir), _losses(runs["two"]), range(4, 7))


@pytest.mark.slow
def test_a_layout_that_cannot_split_the_batch_is_refused_naming_both(runs, tmp_path):
    """3 devices cannot split the run's batch of 8: one line, before anything is restored."""
    workdir = _from_checkpoint_3(runs, "two", tmp_path)
    out = _launch(runs["config"], workdir, 1, 3)
    line = error_line(out)
    assert "checkpoint 3" in line and "written by 2 processes x 4 devices" in line, line
    assert "this run's 1 process x 3 devices" in line and "train.batch_size=8" in line, line
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]
    assert max(_losses(workdir)) == 6  # nothing started: the rows after 3 are still there


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
            env=_env(4),
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
    # Both saved their part of the same step, whose position is that step's; the last row logged.
    saved = workdir / "checkpoints" / str(step)
    parts = sorted(n for n in os.listdir(saved / "state") if n.startswith("ocdbt.process_"))
    assert parts == ["ocdbt.process_0", "ocdbt.process_1"]
    position = json.loads((saved / "position" / "position.json").read_text())
    assert position["data"] == {"next_index": step}
    assert max(_losses(workdir)) == step


@pytest.mark.parametrize(
    "n, env, says",
    [
        ("0", {}, "N=0 processes: give 1 or more"),
        ("000", {}, "N=0 processes: give 1 or more"),
        ("2", {"DEVICES_PER_PROCESS": "0"}, "DEVICES_PER_PROCESS=0 must be a whole number >= 1"),
        ("2", {"PORT": "70000"}, "PORT=70000 must be a port number from 1 to 65535"),
    ],
)
def test_the_launcher_refuses_what_would_start_nothing_in_one_line(tmp_path, n, env, says):
    """`local_multiprocess.sh 0` started nothing and exited 0, as a finished run does."""
    out = subprocess.run(
        ["bash", "launch/local_multiprocess.sh", n, f"--workdir={tmp_path / 'w'}"],
        cwd=ROOT,
        env={**subprocess_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr == f"error: {says}\n"
    assert not (tmp_path / "w").exists()
