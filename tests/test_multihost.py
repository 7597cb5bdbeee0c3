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
from electra_jax.store import checkpoint_steps
from tests import command_server, held
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
    flags = [f"--config={config_path}", f"--workdir={workdir}"]
    if processes == 1:  # (from the suite's warm interpreter, as its other commands)
        argv = [sys.executable, "-m", "electra_jax.train", *flags]
        return command_server.run(argv, ROOT, subprocess_env(devices), timeout=400)
    env = dict(_env(devices), PORT=_free_port(), DEVICES_PER_PROCESS=str(devices))
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
def test_two_processes_match_one_and_each_saves_its_part(runs):
    """(Their resume on the same layout, exactly: the kill and resume of
    test_every_minutes_saves_by_process_0_s_clock_and_a_kill_resumes_exactly.)"""
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
    procs = _start_two(config_path, workdir, _LONG, "--peer_timeout_seconds=5")
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


def _start_two(config_path, workdir, *flags, prefixes=((), ())):
    """Both processes of a run of `config_path`, each `python -m electra_jax.train` or, with its
    `prefixes` entry, `python -m PREFIX... electra_jax.train` (a hook of tests/ that runs it)."""
    port = _free_port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                *prefixes[i],
                "electra_jax.train",
                f"--config={config_path}",
                f"--workdir={workdir}",
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
    procs = _start_two(config_path, workdir, _LONG)
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


@pytest.mark.slow
def test_every_minutes_saves_by_process_0_s_clock_and_a_kill_resumes_exactly(
    runs, shared_data, tmp_path
):
    """checkpoint.every_minutes=1 on 2 processes whose clocks disagree (tests/save_clock.py:
    process 0's moves 40 s a reading, process 1's stands still), every_steps out of reach: both
    save steps 2 and 4 (readings at the start, at each row and at each save: 40, 80 | 160, 200 |
    280 s after the start or the last save's 120, 240), killed after step 5 with 4 committed,
    resumed on the same layout: the losses of the run never interrupted (the suite's check that
    two processes resume their own checkpoint exactly)."""
    config_path = _config_file(
        tmp_path, shared_data, num_steps=6, every=1000, extra=["c.checkpoint.every_minutes = 1"]
    )
    workdir, hold_dir = tmp_path / "w", tmp_path / "hold"
    hold_dir.mkdir()
    clock = ["tests.save_clock", "40"]
    procs = _start_two(
        config_path, workdir, prefixes=(["tests.held", str(hold_dir), "step=5", *clock], clock)
    )
    try:
        held.wait_held(hold_dir, procs[0], read_stderr=False)
        committed = workdir / "checkpoints" / "4" / "commit_success.txt"
        deadline = time.monotonic() + 120
        while not committed.exists():  # the asynchronous save of 4, finished behind the hold
            assert time.monotonic() < deadline and procs[1].poll() is None, "no checkpoint 4"
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert checkpoint_steps.saved_steps(str(workdir)) == [2, 4]
    for step in (2, 4):
        state = workdir / "checkpoints" / str(step) / "state"
        parts = sorted(n for n in os.listdir(state) if n.startswith("ocdbt.process_"))
        assert parts == ["ocdbt.process_0", "ocdbt.process_1"], (step, parts)

    out = _launch(config_path, workdir, 2, 4)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from checkpoint 4" in out.stderr
    assert _losses(workdir) == _losses(runs["two"])


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
