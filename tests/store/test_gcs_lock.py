"""The gs:// workdir lock against a real GCS server (tests/gcs_emulator.py): one holder at a time,
a clear refusal, takeover of dead holders, and no race that lets two processes both hold it."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from electra_jax.store import gcs_lock
from tests.conftest import ROOT, subprocess_env


def _blob(uri):
    from google.cloud import storage

    bucket, name = gcs_lock.split(uri)
    return storage.Client().bucket(bucket).blob(name)


def _write_holder(uri, **info):
    _blob(uri).upload_from_string(json.dumps(info))


def _lock(uri, lines=None, lost=None, lease=30.0, renew_every=None):
    return gcs_lock.GcsLock(
        uri,
        {"command": "test"},
        lease=lease,
        log=(lines.append if lines is not None else None),
        on_lost=(lost.append if lost is not None else None),
        renew_every=renew_every,
    )


def test_a_held_lock_is_refused_naming_its_holder_and_age_then_freed_by_release(gcs):
    uri = f"{gcs}/run/.lock"
    first = _lock(uri)
    started = time.time()
    first.acquire()
    with pytest.raises(gcs_lock.LockHeld) as e:
        _lock(uri).acquire()
    elapsed = time.time() - started  # the age the message may report, however slow the calls
    message = str(e.value)
    assert f"pid {os.getpid()} on host " in message
    found = re.search(r"renewed (\d+)s ago, and runs out (\d+)s after its last renewal", message)
    assert found, message
    age, left = int(found[1]), int(found[2])
    assert age <= elapsed + 0.5 and abs(age + left - 30) <= 1, message
    first.release()
    assert json.loads(_blob(uri).download_as_bytes())["released"] is True
    again = _lock(uri)
    again.acquire()  # a released lock is taken without a word
    assert again.held
    again.release()


def test_a_dead_holder_on_this_host_is_taken_over_at_once_with_one_line(gcs):
    uri = f"{gcs}/run/.lock"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    pid = int(dead.stdout)
    probe = _lock(uri)
    _write_holder(
        uri,
        command="electra_jax.train",
        pid=pid,
        host=probe._holder["host"],
        pid_namespace=probe._holder["pid_namespace"],
        started="then",
        lease_seconds=3600,
    )
    lines = []
    lock = _lock(uri, lines)
    lock.acquire()
    assert len(lines) == 1 and f"its process {pid} on this host has ended" in lines[0]
    lock.release()


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"not json {", "it is not JSON"),
        (b"[1, 2]", "it holds a JSON list"),
        (b'{"note": "mine"}', "its command is None, not a command's name"),
        (
            json.dumps({"command": "x", "host": "h", "pid": 3, "lease_seconds": "x"}).encode(),
            "its lease_seconds is 'x', not a finite number of seconds > 0",
        ),
        (
            b'{"command": "x", "host": "h", "pid": 3, "lease_seconds": 1e999}',
            "its lease_seconds is inf, not a finite number of seconds > 0",
        ),
        (
            json.dumps({"command": "x", "host": "h", "pid": True, "lease_seconds": 60}).encode(),
            "its pid is True, not a process id",
        ),
    ],
)
def test_a_lock_object_that_is_not_our_record_is_named_with_the_way_out(gcs, content, problem):
    """Neither "in use by a run (pid ? on host ?)" nor "cannot be written": what is wrong with
    the object, and what to do; the object is left as it is."""
    from electra_jax.errors import ConfigError
    from electra_jax.run import workdir

    uri = f"{gcs}/run/.lock"
    _blob(uri).upload_from_string(content)
    with pytest.raises(gcs_lock.ForeignLock) as e:
        _lock(uri).acquire()
    assert str(e.value) == (
        f"its lock object {uri} does not hold a lock record of electra_jax ({problem}); if no "
        f"run uses this workdir, delete that object (gcloud storage rm {uri}) and run again"
    )
    with pytest.raises(ConfigError) as e:  # what the commands print
        workdir._take_remote_lock(
            f"{gcs}/run", f"{gcs}/run/.lock", workdir.PRETRAIN, "--workdir", "train"
        )
    assert str(e.value).startswith(f"--workdir {gcs}/run: its lock object {uri} does not hold")
    assert _blob(uri).download_as_bytes() == content


def test_a_holder_on_another_host_is_taken_over_only_after_its_lease(gcs):
    uri = f"{gcs}/run/.lock"
    lease = 2.0
    _write_holder(
        uri,
        command="electra_jax.train",
        pid=1,
        host="elsewhere",
        started="then",
        lease_seconds=lease,
    )
    written = time.time()  # after the server stamped the object: its lease ends later
    lines = []
    while True:
        taker = _lock(uri, lines, lease=lease)
        try:
            taker.acquire()
            break
        except gcs_lock.LockHeld as e:
            assert "on host elsewhere" in str(e)
            assert time.time() - written < lease + 120, "never taken over"  # a hang guard
        time.sleep(0.1)  # the next attempt; the lease's expiry is what is being waited for
    # Never before the lease ran out (the server runs on this machine's clock, and stamped the
    # object before `written`, so only a small margin of clock resolution).
    assert time.time() - written > lease - 0.05
    # Released: left renewing, its thread outlived the server and ended the test process
    # (a lost lock's default answer).
    taker.release()
    assert len(lines) == 1 and f"past its lease of {lease:.0f}s" in lines[0], lines


def test_a_holder_whose_lock_was_taken_learns_it_at_its_next_renewal(gcs):
    uri = f"{gcs}/run/.lock"
    lost = []
    # A long lease renewed often: a lease of a second or less (renewals every 0.2 s, each
    # allowed 1 s) was lost on a loaded machine for a slow renewal ("could not be renewed")
    # before the takeover was seen; this one has 15 s of slow renewals to spare.
    holder = _lock(uri, lost=lost, lease=20.0, renew_every=0.2)
    holder.acquire()
    _write_holder(uri, command="other", pid=2, host="elsewhere", started="now", lease_seconds=60)
    deadline = time.time() + 120  # a guard against a hang; the next renewal is due in 0.2 s
    while not lost and time.time() < deadline:
        time.sleep(0.05)
    assert lost and "another run has taken it over" in lost[0] and not holder.held
    holder.release()  # does not free the other run's lock
    assert json.loads(_blob(uri).download_as_bytes())["host"] == "elsewhere"


_RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from electra_jax.store import gcs_lock
    base, go, n, ready = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from google.cloud import storage  # imported before the start, like gcs_lock's client
    storage.Client()
    open(ready, "w").close()
    while not os.path.exists(go):  # start together: the parent creates it once both are ready
        time.sleep(0.001)
    won = []
    for i in range(n):
        lock = gcs_lock.GcsLock(f"{base}/{i}/.lock", {"command": "racer"}, lease=60,
                                log=lambda line: None)
        try:
            lock.acquire()
            won.append(i)
            lock._stop.set()  # keep it: no renewal, no release
        except gcs_lock.LockHeld:
            pass
    print(json.dumps(won))
    """
)


@pytest.mark.parametrize("start", ["absent", "released"])
def test_two_processes_racing_for_the_same_locks_never_both_win(gcs, tmp_path, start):
    n = 12
    base = f"{gcs}/race"
    if start == "released":
        for i in range(n):
            _write_holder(f"{base}/{i}/.lock", released=True, host="x", pid=1)
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, base, str(go), str(n), str(tmp_path / f"ready{k}")],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    deadline = time.time() + 120
    while not all((tmp_path / f"ready{k}").exists() for k in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in racers), "racers died"
        time.sleep(0.01)
    go.write_text("go")
    results = []
    for proc in racers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(set(json.loads(out)))
    assert results[0] | results[1] == set(range(n))  # every lock has a holder
    assert not results[0] & results[1]  # and only one
