"""Fault injection: a run killed with SIGKILL at random moments, during saves too, and resumed each
time, ends with the numbers of a run never interrupted; nothing is set aside, no row is lost or
doubled."""

import json
import os
import random
import runpy
import signal
import sys
import time

import pytest

from electra_jax.pretraining import metrics, runner
from tests import command_server, held
from tests.conftest import ROOT, subprocess_env
from tests.pretraining.test_runner import prepare_shared_data

NUM_STEPS = 16
COMPARED = ("loss", "gen_loss", "disc_loss", "grad_norm", "gen_accuracy", "disc_accuracy")


def _config_file(tmp_path, tokenizer: str, cache_dir: str) -> str:
    path = tmp_path / "fault_config.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.micro import micro_config\n\n\n"
        "def get_config():\n"
        "    config = micro_config()\n"
        f"    config.data.tokenizer, config.data.cache_dir = {tokenizer!r}, {cache_dir!r}\n"
        f"    config.train.num_steps = {NUM_STEPS}\n"
        "    config.train.steps_per_call = 2\n"
        "    config.checkpoint.every_steps = 2\n"
        "    config.checkpoint.keep = 2\n"
        "    return config\n"
    )
    return str(path)


def _start(config: str, workdir, hold_dir=None, point="save"):
    """`python -m electra_jax.train`; with `hold_dir`, held at `point` (tests/held.py): by
    default in its first checkpoint's commit."""
    args = ["electra_jax.train", f"--config={config}", f"--workdir={workdir}"]
    # subprocess_env passes on the suite's compilation cache: every start after the first loads
    # the step instead of compiling it (the same executable, so the same numbers).
    argv = held.command(hold_dir, point, *args) if hold_dir else [sys.executable, "-m", *args]
    return command_server.start(argv, ROOT, subprocess_env())


def _saving(workdir) -> bool:
    """Whether orbax is writing a checkpoint now (its temporary folder exists)."""
    try:
        return any(".orbax-checkpoint-tmp" in n for n in os.listdir(workdir / "checkpoints"))
    except FileNotFoundError:
        return False


def _rows(workdir) -> int:
    return len(metrics.read_rows(str(workdir / "metrics.jsonl")))


def _kill_at(proc, workdir, how: str, rng: random.Random, hold_dir) -> str:
    """SIGKILLs `proc` at a moment chosen by `how`; returns what the moment was."""
    deadline = time.time() + 240
    start_rows = _rows(workdir)
    if how == "startup":  # importing, preparing, restoring or compiling
        time.sleep(rng.uniform(0.5, 6.0))
    elif how == "save":  # inside an asynchronous save: `proc` is held in its commit
        held.wait_held(hold_dir, proc)
        assert _saving(workdir) and _rows(workdir) > start_rows
    else:  # at a random moment among the steps: `proc` is held before the last ones
        assert start_rows < NUM_STEPS - 2, f"the run had {start_rows} rows before this start"
        while time.time() < deadline and proc.poll() is None and _rows(workdir) <= start_rows:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        assert proc.poll() is None  # held before its last steps: not finished
    saving = _saving(workdir)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return f"{how}{' (mid-save)' if saving else ''}"


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(tmp_path, tmp_path_factory):
    tokenizer, cache_dir = prepare_shared_data(tmp_path_factory)
    config = _config_file(tmp_path, tokenizer, cache_dir)

    # The run never interrupted, in this process (no command's start to pay for): it compiles
    # the step the commands then load from the compilation cache.
    straight = tmp_path / "straight"
    runner.train(runpy.run_path(config)["get_config"](), str(straight))
    expected = {r["step"]: r for r in metrics.read_rows(str(straight / "metrics.jsonl"))}
    assert sorted(expected) == list(range(1, NUM_STEPS + 1))

    rng = random.Random(1234)
    workdir = tmp_path / "killed"
    kills: list[str] = []
    # The random moment comes second: the save's run stops at its second checkpoint, behind
    # the held commit, far from the end, while a startup's kill may come late enough for the
    # run to be past step NUM_STEPS - 2 or finished.
    plan = ["save", "random", "startup"]
    for how in plan:
        # The save is held in its commit until the kill, written in full but not yet renamed
        # into place: polling for orbax's temporary folder raced the commit, which a fast
        # machine finishes before the kill. The random moment's run is held after step
        # NUM_STEPS - 2 until the kill: however fast the steps, it cannot finish first.
        hold_dir = tmp_path / f"hold-{how}"
        hold_dir.mkdir()
        points = {"save": "save", "random": f"step={NUM_STEPS - 2}"}
        proc = _start(config, workdir, hold_dir if how in points else None, points.get(how, ""))
        kills.append(_kill_at(proc, workdir, how, rng, hold_dir))
        assert not [n for n in os.listdir(workdir / "checkpoints") if "corrupt" in n]
        if proc.returncode == 0:
            break  # the run finished before the kill
    # The last start runs to the end.
    last = _start(config, workdir)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, (kills, err[-3000:])
    assert "warning: checkpoint" not in err, err  # nothing was found damaged

    assert any("mid-save" in k for k in kills), kills  # a save was really interrupted
    assert not [n for n in os.listdir(workdir / "checkpoints") if "corrupt" in n]
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, NUM_STEPS + 1)), kills
    for row in rows:
        for key in COMPARED:
            assert row[key] == expected[row["step"]][key], (row["step"], key, kills)
    text = (workdir / "metrics.jsonl").read_text()
    assert all(json.loads(line) for line in text.splitlines())  # no torn line left behind
