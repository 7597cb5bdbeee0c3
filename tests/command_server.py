"""The suite's commands, started from a warm interpreter: `python -m MODULE`, `python -c CODE` and
`python SCRIPT` run in a process forked from a server that imported jax, flax, optax, orbax, grain
and the package's heavy modules once, instead of in a fresh interpreter that imports them again.

Why: the suite starts about 500 commands. A fresh interpreter spends about 0.4 s of a core on
what a refusal imports and on its teardown at the end, and 2-3 s more on a micro run's imports;
forked from the server, a refusal takes 0.04 s and a micro run about 3 s less.

What the command sees is what `python` would give it: its argv, environment, working folder,
sys.path[0] and `__main__`, stdin from /dev/null, stdout and stderr to files of its own, a
process of its own (one command per fork), and the interpreter's end (non-daemon threads joined,
atexit handlers run, streams flushed; an uncaught exception's traceback and exit code 1; death by
SIGINT after a KeyboardInterrupt), without the teardown of every module that follows it in a
fresh interpreter. What differs: the libraries are already imported (no backend started: the
child starts its own, reading XLA_FLAGS then), so whether a command imports jax is asked of fresh
interpreters (`fresh=True`: tests/conftest.py's heavy_imports_of and heavy_imports_at_exit); a
server serves the environment it was started with (jax reads its JAX_* settings at import), and
a command under another one, with other interpreter options or with input on stdin runs fresh,
as does one whose caller's server is busy with another command (another thread's, or one
`start` began that has not ended). `run` is subprocess.run's stand-in, `start` Popen's.

Protocol, one JSON line each way: the caller sends {argv, cwd, env, out, err}; the server forks,
answers {"pid"}, waits for the child and answers {"code"} (subprocess's return code: -N for a
signal). The server ends when its stdin closes (its caller's process ended).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

ROOT = pathlib.Path(__file__).resolve().parents[1]

# What the server imports before it forks: what the commands import after their checks.
WARM = (
    "jax",
    "jax.numpy",
    "flax.linen",
    "optax",
    "orbax.checkpoint",
    "grain",
    "electra_jax.cli",
    "electra_jax.pretraining.runner",
    "electra_jax.finetune.loop",
)
# The package's commands (`python -m`): each is executed afresh in the child, so the server never
# imports them.
COMMANDS = (
    "electra_jax.train",
    "electra_jax.prepare",
    "electra_jax.evaluate",
    "electra_jax.export",
    "electra_jax.goodput",
    "electra_jax.finetune.__main__",
)
# Set per call and read by nothing at import (XLA_FLAGS: when the child starts its backends).
_PER_CALL = ("PYTEST_CURRENT_TEST", "XLA_FLAGS")


# ------------------------------------------------------------------------------------ the server


def serve() -> None:
    """The server's loop (its process: `python -c`, stdin and stdout the caller's pipes)."""
    import importlib

    from tests import collector

    for name in WARM:
        importlib.import_module(name)
    from jax._src import xla_bridge

    imported = [name for name in COMMANDS if name in sys.modules]
    if xla_bridge._backends or imported:  # a child would not start as a fresh interpreter
        _say({"cold": f"backends {list(xla_bridge._backends)}, commands {imported}"})
        return
    collector.settle()  # its children never walk what the server imported
    _say({"ready": os.getpid()})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(request)  # never returns: the command ends the process
        _say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _say({"code": os.waitstatus_to_exitcode(status)})


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _become(request: dict) -> None:
    """In the forked child: the command of `request`, as `python ARGV` would run it; ends the
    process with the command's exit code and never returns."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)  # replaces the server's pipes: the child keeps none of them
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (fd 0 is the process's, as ever)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _end(_run_as_main(*request["argv"]))


def _run_as_main(option: str, target: str, *args: str):
    """`python option target args...` in this process: its exit code, or the KeyboardInterrupt
    it ended with; an uncaught exception's traceback printed as the interpreter prints it."""
    import runpy
    import types

    try:
        if option == "-m":
            sys.path[0] = os.getcwd()
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif option == "-c":
            sys.path[0] = ""
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:  # a script: option is its path, target its first argument
            sys.path[0] = os.path.dirname(os.path.abspath(option))
            sys.argv = [option, target, *args]
            runpy.run_path(option, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        sys.excepthook(type(e), e, e.__traceback__)
        return e
    except BaseException as e:
        sys.excepthook(type(e), e, e.__traceback__)
        return 1
    return 0


def _end(code) -> None:
    """The interpreter's end as a command sees it (non-daemon threads joined, then the atexit
    handlers, then stdout and stderr flushed: exit code 120 if that fails), without its teardown
    of every module, which the server's imports would make cost 0.3-0.5 s a command. An end by
    KeyboardInterrupt is a death by SIGINT, as Python's own."""
    import atexit

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    if isinstance(code, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# ------------------------------------------------------------------------------------ the caller


class _Server:
    def __init__(self, env: dict):
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests import command_server; command_server.serve()"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._pending = b""  # read from the server, not yet a whole line
        hello = self._read(timeout=300)
        self.ready = hello is not None and "ready" in hello

    def _read(self, timeout: float | None) -> dict | None:
        """The server's next message; None past `timeout` seconds or when it ended."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def start(self, argv: list[str], cwd, env: dict, folder: str) -> int:
        """Starts `argv` with its stdout and stderr in FOLDER/out and FOLDER/err: its pid."""
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        request = {"argv": argv[1:], "cwd": str(cwd), "env": env, "out": out, "err": err}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        started = self._read(timeout=60)
        if started is None:
            self.ready = False
            raise RuntimeError(f"the command server did not start {argv}")
        return started["pid"]

    def ended(self, argv: list[str], timeout: float | None) -> int | None:
        """The exit code of the command started last (subprocess's: -N for a signal); None
        while it runs after `timeout` seconds."""
        answer = self._read(timeout)
        if answer is None and self.proc.poll() is not None:
            self.ready = False  # out of step with its caller: it serves no more
            raise RuntimeError(f"the command server ended while it ran {argv}")
        return None if answer is None else answer["code"]

    def run(self, argv: list[str], cwd, env: dict, timeout: float | None):
        with tempfile.TemporaryDirectory(prefix="command-") as folder:
            pid = self.start(argv, cwd, env, folder)
            code = self.ended(argv, timeout)
            if code is None:  # killed, as subprocess.run kills it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if self.ended(argv, timeout=60) is None:
                    self.ready = False
                    raise RuntimeError(f"the command server did not end {argv} when killed")
            stdout, stderr = (_text(os.path.join(folder, name)) for name in ("out", "err"))
        if code is None:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, code, stdout, stderr)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a command still running that nobody waits for
                self.proc.kill()


def _text(path: str) -> str:
    return pathlib.Path(path).read_text(errors="replace")


class Started:
    """A command running in a child of the server, as `subprocess.Popen(argv, stdout=PIPE,
    stderr=PIPE, text=True)` gives it: pid, args, returncode, poll, wait, communicate,
    send_signal, terminate, kill, and stdout and stderr read as the command writes them (from
    its files: a command that writes more than a pipe holds never waits for its reader). The
    server is held until the command's end is known."""

    def __init__(self, server: _Server, argv: list[str], cwd, env: dict):
        self.args, self.returncode = argv, None
        self._server, self._lock = server, threading.Lock()
        folder = tempfile.mkdtemp(prefix="command-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        self.stdout, self.stderr = (
            _Following(os.path.join(folder, name), self) for name in ("out", "err")
        )
        self.pid = server.start(argv, cwd, env, folder)

    def _wait(self, timeout: float | None) -> bool:
        """Whether the command has ended, waiting `timeout` seconds for it (under _lock)."""
        if self.returncode is None:
            try:
                code = self._server.ended(self.args, timeout)
            except RuntimeError:
                self._server.lock.release()
                raise
            if code is None:
                return False
            self.returncode = code
            self._server.lock.release()
        return True

    def ended(self) -> bool:
        """Whether the command is known to have ended, without waiting for another thread."""
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._wait(timeout=0)
            finally:
                self._lock.release()
        return self.returncode is not None

    def poll(self) -> int | None:
        with self._lock:
            self._wait(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if not self._wait(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple[str, str]:
        assert input is None, "the command's stdin is /dev/null"
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (ended since: reaped by the server, its pid free again only
            with contextlib.suppress(ProcessLookupError):  # after a few thousand more starts)
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Following:
    """A command's output file read as the command writes it, as a pipe reads: a read ends
    at the command's end, a line once whole or at the end."""

    def __init__(self, path: str, command: Started):
        pathlib.Path(path).touch()  # the command's own opening truncates it, still empty
        self._file = open(path, errors="replace")  # noqa: SIM115  (open while the command runs)
        self._command, self._partial = command, ""

    def readline(self) -> str:
        while True:
            ended = self._command.ended()  # before the read: then all of it is in the file
            self._partial += self._file.readline()
            if self._partial.endswith("\n") or ended:
                line, self._partial = self._partial, ""
                return line
            time.sleep(0.01)

    def read(self) -> str:
        while not self._command.ended():
            time.sleep(0.01)
        rest, self._partial = self._partial + self._file.read(), ""
        return rest

    def __iter__(self):
        return iter(self.readline, "")

    def close(self) -> None:
        self._file.close()


_SERVERS: dict[tuple, _Server] = {}  # the least recently used first
_ASKED: dict[tuple, int] = {}
_KEPT = 2  # servers at most, each for an environment asked for more than once
_STARTING = threading.Lock()


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CALL))


def _server(env: dict) -> _Server | None:
    """The server for `env`, held for the caller (release its lock), started at the second
    call with that environment (a server costs about four fresh starts), in place of the least
    recently used idle one where _KEPT are running (a test's process may change its own
    environment for good: libtpu's settings); None where none is free to serve it."""
    key = _key(env)
    with _STARTING:  # held while a server is taken, so that none is closed once taken
        _ASKED[key] = _ASKED.get(key, 0) + 1
        if key not in _SERVERS:
            if _ASKED[key] < 2:
                return None
            if len(_SERVERS) >= _KEPT:
                idle = [k for k, s in _SERVERS.items() if not s.lock.locked()]
                if not idle:
                    return None
                _SERVERS.pop(idle[0]).close()
            _SERVERS[key] = _Server({k: v for k, v in env.items() if k not in _PER_CALL})
            atexit.register(_SERVERS[key].close)
        server = _SERVERS.pop(key)
        _SERVERS[key] = server  # now the most recently used
        if not server.ready or not server.lock.acquire(blocking=False):
            return None
    return server


def servable(argv: list[str]) -> bool:
    """Whether the server can run `argv`: this interpreter with -m, -c or a script, no other
    options."""
    if len(argv) < 3 or argv[0] != sys.executable:
        return False
    return argv[1] in ("-m", "-c") or not argv[1].startswith("-")


def start(argv: list[str], cwd, env: dict, fresh: bool = False):
    """subprocess.Popen(argv, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE, text=True), from the
    warm server where it can (`fresh`: never): the running command."""
    server = None if fresh or not servable(argv) else _server(env)
    if server is not None:
        try:
            return Started(server, argv, cwd, env)
        except BaseException:
            server.lock.release()
            raise
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run(argv: list[str], cwd, env: dict, timeout: float | None = None, fresh: bool = False):
    """subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout),
    from the warm server where it can (`fresh`: never): the finished process."""
    server = None if fresh or not servable(argv) else _server(env)
    if server is not None:
        try:
            return server.run(argv, cwd, env, timeout)
        finally:
            server.lock.release()
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
