"""tests/command_server.py: a command forked from the warm interpreter sees and ends as it would
in a fresh one."""

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import command_server
from tests.conftest import ROOT, subprocess_env

# What a command can see of how it was started, and an ending of each kind: printed on stdout as
# one JSON line; then, on stderr, the end it was asked for (argv[-1]).
_PROBE = """
import atexit, json, os, sys, threading, time
import __main__
end = sys.argv[-1]
atexit.register(lambda: print("atexit ran", file=sys.stderr))
print(json.dumps({
    "argv": sys.argv[1:], "path0": sys.path[0], "cwd": os.getcwd(),
    "env": os.environ.get("PROBE_VALUE"), "test": os.environ.get("PYTEST_CURRENT_TEST"),
    "main": __main__.__name__, "stdin": sys.stdin.read(), "jax_backends": _backends(),
}), flush=True)  # before a kill, whether or not PYTHONUNBUFFERED is set
if end == "devices":  # XLA_FLAGS, read when the backends start
    import jax
    print(jax.device_count())
if end == "thread":  # a non-daemon thread is joined before the interpreter ends
    late = lambda: (time.sleep(0.2), print("thread done", file=sys.stderr))  # noqa: E731
    threading.Thread(target=late).start()
elif end == "raise":
    raise KeyError("uncaught")
elif end == "message":  # sys.exit with a text: the text on stderr, exit code 1
    sys.exit("bye")
elif end == "interrupt":  # an uncaught KeyboardInterrupt: the traceback, then death by SIGINT
    raise KeyboardInterrupt
elif end == "exit":
    sys.exit(3)
elif end == "kill":
    os.kill(os.getpid(), 9)
elif end == "sleep":
    time.sleep(60)
"""
_BACKENDS = (
    "def _backends():\n"
    "    if 'jax' not in sys.modules:\n"
    "        return None\n"
    "    from jax._src import xla_bridge\n"
    "    return list(xla_bridge._backends)\n"
)


def _probe_argv(kind: str, tmp_path, *args: str) -> list[str]:
    code = _PROBE.replace("import __main__\n", "import __main__\n" + _BACKENDS)
    if kind == "-c":
        return [sys.executable, "-c", code, *args]
    script = tmp_path / "probe.py"
    script.write_text(code)
    if kind == "script":
        return [sys.executable, str(script), *args]
    (tmp_path / "probe_pkg").mkdir(exist_ok=True)
    (tmp_path / "probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "probe_pkg" / "probe.py").write_text(code)
    return [sys.executable, "-m", "probe_pkg.probe", *args]


def _both(argv, cwd, env, timeout=60):
    """(served, fresh): the same command through the server and in a fresh interpreter."""
    served = command_server.run(argv, cwd, env, timeout=timeout)
    fresh = subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    return served, fresh


@pytest.fixture(scope="module")
def env():
    env = dict(subprocess_env(), PROBE_VALUE="x y")
    # The server starts at an environment's second call: this one starts it.
    for _ in range(2):
        command_server.run([sys.executable, "-c", "pass"], ROOT, env, timeout=120)
    server = command_server._server(env)  # held for this caller: released at once
    assert server is not None, "no server started"
    server.lock.release()
    return env


@pytest.mark.parametrize("kind", ["-c", "script", "-m"])
def test_a_served_command_sees_what_a_fresh_one_sees(kind, env, tmp_path):
    argv = _probe_argv(kind, tmp_path, "a b", "--flag=1", "thread")
    served, fresh = _both(argv, tmp_path, env)
    assert served.returncode == fresh.returncode == 0, (served.stderr, fresh.stderr)
    got, want = json.loads(served.stdout), json.loads(fresh.stdout)
    assert want["jax_backends"] is None and got["jax_backends"] == []  # imported, not started
    got["jax_backends"] = want["jax_backends"] = None
    assert got == want
    assert served.stderr == fresh.stderr == "thread done\natexit ran\n"


def test_each_ending_gives_the_code_and_output_a_fresh_interpreter_gives(env, tmp_path):
    for end, code in (("exit", 3), ("message", 1), ("kill", -9)):
        served, fresh = _both(_probe_argv("-c", tmp_path, end), tmp_path, env)
        assert served.returncode == fresh.returncode == code
        assert served.stderr == fresh.stderr
    served, fresh = _both(_probe_argv("-m", tmp_path, "raise"), tmp_path, env)
    assert served.returncode == fresh.returncode == 1
    for out in (served, fresh):
        lines = out.stderr.splitlines()
        assert lines[0] == "Traceback (most recent call last):" and lines[-2:] == [
            "KeyError: 'uncaught'",
            "atexit ran",
        ], out.stderr
    served, fresh = _both(_probe_argv("-c", tmp_path, "interrupt"), tmp_path, env)
    assert served.returncode == fresh.returncode == -2
    for out in (served, fresh):
        lines = out.stderr.splitlines()
        assert lines[0] == "Traceback (most recent call last):", out.stderr
        assert lines[-2:] == ["KeyboardInterrupt", "atexit ran"], out.stderr


def test_xla_flags_are_the_call_s_own(env, tmp_path):
    argv = _probe_argv("-c", tmp_path, "devices")
    for devices in (3, 1):
        flags = f"--xla_force_host_platform_device_count={devices}"
        served, fresh = _both(argv, tmp_path, dict(env, XLA_FLAGS=flags))
        assert served.returncode == fresh.returncode == 0, served.stderr
        assert served.stdout.splitlines()[-1] == fresh.stdout.splitlines()[-1] == str(devices)


def test_past_its_timeout_the_command_is_killed_and_timeout_expired_raised(env, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as e:
        command_server.run(_probe_argv("-c", tmp_path, "sleep"), tmp_path, env, timeout=2)
    assert '"argv": ["sleep"]' in e.value.output
    # The server serves the next command.
    out = command_server.run([sys.executable, "-c", "print(6 * 7)"], tmp_path, env, timeout=60)
    assert out.returncode == 0 and out.stdout == "42\n"


def test_what_the_server_cannot_run_as_python_would_runs_fresh(env, tmp_path):
    assert command_server.servable([sys.executable, "-m", "electra_jax.train", "--x"])
    assert command_server.servable([sys.executable, "script.py", "--x"])
    assert not command_server.servable([sys.executable, "-X", "importtime", "-c", "pass"])
    assert not command_server.servable(["bash", "launch/local_multiprocess.sh", "2"])
    # Another environment (jax read its settings at import) and `fresh`: a fresh interpreter,
    # which has not imported jax.
    code = "import sys; print('jax' in sys.modules)"
    other = dict(env, PROBE_VALUE="other")
    for kwargs in ({"env": other}, {"env": env, "fresh": True}):
        out = command_server.run([sys.executable, "-c", code], ROOT, timeout=60, **kwargs)
        assert out.stdout == "False\n", kwargs
    served = command_server.run([sys.executable, "-c", code], ROOT, env, timeout=60)
    assert served.stdout == "True\n"


def test_a_new_environment_takes_the_place_of_the_least_recently_used_server(env):
    others = [dict(env, PROBE_VALUE=f"other {i}") for i in range(command_server._KEPT)]
    for other in others:
        for _ in range(2):
            out = command_server.run([sys.executable, "-c", "pass"], ROOT, other, timeout=120)
            assert out.returncode == 0
    assert list(command_server._SERVERS) == [command_server._key(e) for e in others]


# A command that runs until it is signalled: a line on stderr once its handler is set, then,
# on SIGTERM, a line on stdout and a last one on stderr without its newline.
_WAITER = """
import signal, sys, time
def stop(signum, frame):
    print("out", flush=True)
    print(f"stopped by {signum}", end="", file=sys.stderr, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", file=sys.stderr, flush=True)
while True:
    time.sleep(0.01)
"""


def _started_and_popen(env, tmp_path):
    """(served, fresh): the waiter started through the server and by subprocess.Popen."""
    argv = [sys.executable, "-c", _WAITER]
    served = command_server.start(argv, tmp_path, env)
    assert isinstance(served, command_server.Started), "the server did not start it"
    fresh = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return served, fresh


def test_a_started_command_is_read_signalled_and_waited_for_as_popen_s(env, tmp_path):
    served, fresh = _started_and_popen(env, tmp_path)
    try:
        for proc in (served, fresh):
            assert proc.stderr.readline() == "ready\n"  # while it runs
            assert proc.poll() is None
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
            proc.send_signal(signal.SIGTERM)
            assert proc.communicate(timeout=60) == ("out\n", "stopped by 15")
            assert proc.returncode == proc.poll() == proc.wait() == 0
            proc.kill()  # ended: nothing happens
    finally:
        for proc in (served, fresh):
            proc.kill()
    # The server is free again: the next command is served.
    out = command_server.run([sys.executable, "-c", "import sys; print('jax' in sys.modules)"],
                             ROOT, env, timeout=60)  # fmt: skip
    assert out.stdout == "True\n"


def test_a_started_command_s_stderr_is_followed_by_another_thread_to_its_end(env, tmp_path):
    served, fresh = _started_and_popen(env, tmp_path)
    try:
        for proc in (served, fresh):
            lines = []
            reader = threading.Thread(target=lambda p=proc, got=lines: got.extend(p.stderr))
            reader.start()
            while not lines:  # the first line, read while the command runs
                assert proc.poll() is None
                time.sleep(0.01)
            proc.kill()
            assert proc.wait(timeout=60) == -signal.SIGKILL
            reader.join(timeout=60)
            assert lines == ["ready\n"] and not reader.is_alive()
    finally:
        for proc in (served, fresh):
            proc.kill()
