"""`python -m tests.held HOLD_DIR POINT MODULE [ARGS...]`: `python -m MODULE ARGS...` whose work
stops at a point the test picks and waits there until the test releases it, or kills it.

A test that signals or kills a run must know where the run is when the signal comes. A sleep, or
"the run takes longer than that", is a race on a loaded machine: the run finishes before the
signal, or the signal comes before the part under test has started. Here the run reaches POINT,
writes HOLD_DIR/held (what is held) and waits until HOLD_DIR/release exists (`release`). A run
never released goes on after LIMIT seconds, so that a failed test leaves no process behind.

POINT:
  step=N  the training loop's question "stop after step N?" (the preemption watcher's
          `requested`), the first time it is asked for a step >= N. The answer for that step is
          taken before the hold: a signal sent once `held` exists is honoured at the next one.
  mark=N  the same place, but the run only writes `held` and goes on: a signal sent then arrives
          while the steps after N run.
  save    orbax's commit of the process's first checkpoint (the rename of its temporary folder,
          written in full): the run is mid-save, and its next save waits behind this one.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import time

LIMIT = 600.0
HELD, RELEASE = "held", "release"
ORBAX_TEMPORARY = ".orbax-checkpoint-tmp"  # in the name of the folder orbax writes a step into


def command(hold_dir, point: str, module: str, *args: str) -> list[str]:
    """The argv that runs `python -m module args` held at `point`."""
    return [sys.executable, "-m", "tests.held", str(hold_dir), point, module, *args]


def hold(hold_dir, what: str, wait: bool = True) -> None:
    """Writes HOLD_DIR/held (atomically: a test that sees it reads all of it), then waits for
    HOLD_DIR/release (at most LIMIT seconds) when `wait`."""
    path = os.path.join(hold_dir, HELD)
    with open(path + ".tmp", "w") as f:
        f.write(what)
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + LIMIT
    while wait and not os.path.exists(os.path.join(hold_dir, RELEASE)):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)  # a signal's Python handler runs here, in the main thread


def wait_held(
    hold_dir, proc: subprocess.Popen | None = None, timeout: float = 600, read_stderr: bool = True
) -> str:
    """What the run holds, once it is there. Raises AssertionError when `proc` ends first, with
    the end of its stderr unless another reader has it (`read_stderr`); or, a guard against a
    hang, after `timeout` seconds."""
    path = os.path.join(hold_dir, HELD)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr and read_stderr else ""
            raise AssertionError(f"the run ended (exit {proc.returncode}) before its hold: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the run did not reach its hold in {timeout:.0f}s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


def release(hold_dir) -> None:
    """Lets a held run go on."""
    with open(os.path.join(hold_dir, RELEASE), "w"):
        pass


def _at_step(hold_dir, first: int, wait: bool) -> None:
    from electra_jax.store import checkpointing

    requested = checkpointing.PreemptionWatcher.requested
    done = []

    def held_requested(self, step):
        answer = requested(self, step)
        if step >= first and not done:
            done.append(step)
            hold(hold_dir, f"after step {step}", wait)
        return answer

    checkpointing.PreemptionWatcher.requested = held_requested


def _in_save(hold_dir) -> None:
    rename = os.rename
    done = []

    def held_rename(src, dst, *args, **kwargs):
        name = os.path.basename(os.fspath(src))
        if ORBAX_TEMPORARY in name and not done:
            done.append(name)
            hold(hold_dir, f"committing {name}")
        return rename(src, dst, *args, **kwargs)

    os.rename = held_rename


def main(argv: list[str]) -> None:
    hold_dir, point, module, *args = argv
    kind, _, value = point.partition("=")
    if kind in ("step", "mark"):
        _at_step(hold_dir, int(value), wait=kind == "step")
    elif kind == "save":
        _in_save(hold_dir)
    else:
        raise SystemExit(f"tests.held: unknown point {point!r}")
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
