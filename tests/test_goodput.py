"""Each row's time breakdown, goodput across a kill and a resume, and the report command.

Nothing here depends on how fast the machine is: the relations asserted hold for any durations
(a wait is part of its interval, a restart's restore and compile happen after the kill, the
steps redone are counted once), and the arithmetic is checked with numbers given by hand.
"""

import json
import os
import signal
import sys

import pytest

from electra_jax import goodput
from electra_jax.pretraining import metrics, runner, timing
from electra_jax.store import checkpoint_steps, checkpointing
from tests import command_server, held
from tests.conftest import ROOT, error_line, micro_config_file, run_command, subprocess_env
from tests.pretraining.test_runner import config_with, prepare_shared_data


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def train_command(config: str, workdir, settings: dict, hold_dir=None, point="") -> list[str]:
    """`python -m electra_jax.train` with --config.KEY=VALUE for `settings`; with `hold_dir`,
    held at `point` (tests/held.py)."""
    args = ["electra_jax.train", f"--config={config}", f"--workdir={workdir}"]
    args += [f"--config.{k}={v}" for k, v in settings.items()]
    return held.command(hold_dir, point, *args) if hold_dir else [sys.executable, "-m", *args]


def run(command: list[str]):
    """`command` started (tests/command_server.py's start: Popen's interface)."""
    return command_server.start(command, ROOT, subprocess_env())


# ------------------------------------------------------------------------------ arithmetic


def test_totals_count_from_the_first_start_and_survive_a_checkpoint():
    totals = timing.Totals.restored(None, started=100.0)
    totals.productive = 30.0
    assert totals.columns(160.0) == {"productive_sec": 30.0, "wall_sec": 60.0, "goodput": 0.5}
    saved = json.loads(json.dumps(totals.saved(pending=2.0)))  # as the checkpoint keeps it
    # Killed at 160 after 10 more productive seconds; resumed at 200 from that checkpoint.
    again = timing.Totals.restored(saved, started=200.0)
    assert again.first_start == 100.0 and again.productive == 32.0
    assert again.columns(200.0)["goodput"] == 32.0 / 100.0


def test_the_breakdown_of_an_interval_and_the_progress_note():
    b = timing.Breakdown()
    b.add("data_wait_sec", 2.0)
    b.add("data_wait_sec", 0.5)
    b.add("checkpoint_block_sec", 1.0)
    assert b.waited() == 3.5
    row = b.take()
    assert row == {"data_wait_sec": 2.5, "checkpoint_block_sec": 1.0, "eval_sec": 0.0}
    assert b.take() == {"data_wait_sec": 0.0, "checkpoint_block_sec": 0.0, "eval_sec": 0.0}
    # 3.5 s of 10: shown; 0.4 s of 10: not.
    assert timing.not_compute_note(row, 10.0) == "  not compute 35% (data 25%, checkpoint 10%)"
    quiet = {"data_wait_sec": 0.4, "checkpoint_block_sec": 0.0, "eval_sec": 0.0}
    assert timing.not_compute_note(quiet, 10.0) == ""


def test_the_report_accounts_for_the_wall_time():
    rows = [
        {"step": 1, "compile_sec": 20.0, "restore_sec": 1.0, "data_wait_sec": 1.0},
        {"step": 2, "checkpoint_block_sec": 2.0, "eval_sec": 3.0},
        {"step": 3, "compile_sec": 10.0, "restore_sec": 2.0, "data_wait_sec": 1.0},
        {"step": 4, "productive_sec": 40.0, "wall_sec": 100.0, "goodput": 0.4},
    ]
    # What the resume's first row adds, once split out of "other".
    split = {"prepare_sec": 4.0, "redone_sec": 6.0, "down_sec": 7.0}
    text = goodput.report(rows, "runs/x")
    assert text.splitlines()[0] == (
        "runs/x: step 4, goodput 40.0% (40.0s productive of 1m40s since the first start; "
        "2 starts in the rows kept)"
    )
    assert "compiling                         30.0s   30.0%" in text
    # 100 - 40 productive - 30 compile - 3 restore - 2 checkpoint - 3 eval - 2 data = 20
    assert "other                             20.0s   20.0%" in text
    rows[2].update(split)
    text = goodput.report(rows, "runs/x")
    assert "preparing data and the run         4.0s    4.0%" in text
    assert "steps redone after a kill          6.0s    6.0%" in text
    assert "down between starts                7.0s    7.0%" in text
    assert "other                              3.0s    3.0%" in text


def test_what_a_resume_lost_from_the_rows_before_it():
    rows = [
        {"step": 2, "wall_sec": 10.0},
        {"step": 4, "wall_sec": 20.0},  # the checkpoint resumed from
        {"step": 6, "wall_sec": 31.0},  # dropped: steps 5 and 6 are done again
        {"step": 8},  # a row without the columns counts for nothing
    ]
    lost = timing.resume_columns(rows, 4, since_first_start=40.0)
    assert lost == {"redone_sec": 11.0, "down_sec": 9.0}
    assert timing.resume_columns(rows[:2], 4, 25.0) == {"redone_sec": 0.0, "down_sec": 5.0}
    assert timing.resume_columns([], 0, 3.0) == {}  # a first start


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda w: None, "metrics.jsonl does not exist; name the workdir of a training run"),
        (
            lambda w: (w / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n'),
            "has no row with goodput columns",
        ),
    ],
)
def test_the_report_command_refuses_a_workdir_without_one(tmp_path, make, says):
    workdir = tmp_path / "w"
    workdir.mkdir()
    make(workdir)
    out = run_command("electra_jax.goodput", str(workdir))
    assert says in error_line(out, only=True)


# -------------------------------------------------------------------------------- the loop


@pytest.mark.slow
def test_every_row_has_its_breakdown_and_a_resume_goes_on_counting(shared_data, tmp_path):
    cfg = config_with(shared_data)
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir), stop_after=4)  # checkpoints 3 and 4
    runner.train(cfg, str(workdir))
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for row in rows:
        for column in ("data_wait_sec", "checkpoint_block_sec", "eval_sec"):
            assert row[column] >= 0, (row["step"], column)
        assert 0 < row["productive_sec"] < row["wall_sec"] and 0 < row["goodput"] < 1
    starts = [r["step"] for r in rows if "restore_sec" in r]
    assert starts == [r["step"] for r in rows if "compile_sec" in r] == [1, 5]
    assert starts == [r["step"] for r in rows if "prepare_sec" in r]
    # A resume after a clean stop: nothing redone, the time between the two down.
    assert rows[4]["redone_sec"] == 0 and rows[4]["down_sec"] > 0 and "down_sec" not in rows[0]
    # The save of step 3 blocked the interval of step 4's row, and none blocked step 2's.
    assert rows[3]["checkpoint_block_sec"] > 0 and rows[1]["checkpoint_block_sec"] == 0
    # One clock from the first start: the wall and productive totals go on after the resume.
    for before, after in zip(rows, rows[1:], strict=False):
        assert after["wall_sec"] > before["wall_sec"]
        assert after["productive_sec"] > before["productive_sec"]
    gap = rows[4]["wall_sec"] - rows[3]["wall_sec"]
    assert gap > rows[4]["restore_sec"] + rows[4]["compile_sec"]
    saved = checkpointing.saved_goodput(str(workdir), 6)
    assert saved["productive_sec"] >= rows[-1]["productive_sec"]


def _entries(cache) -> set[str]:
    """The compilation cache's entries (jax names each `<program>-<key>-cache`)."""
    return {n for n in os.listdir(cache) if n.endswith("-cache")} if cache.exists() else set()


@pytest.mark.slow
def test_a_kill_and_resume_counts_the_restart_as_lost_and_loads_the_step_from_the_cache(
    shared_data, tmp_path
):
    """Goodput across a SIGKILL, and compile.cache_dir (tests/pretraining/test_compile_cache.py):
    one run killed and resumed serves both, as the restart they are about is the same. The cache
    is told by jax's cache hits (the first row's compile_cache_hits) and its entries, not by
    timing."""
    config = micro_config_file(tmp_path / "config.py", shared_data)
    cache = tmp_path / "cache"
    settings = {
        "train.num_steps": 8,
        "train.steps_per_call": 1,
        "checkpoint.every_steps": 2,
        "compile.cache_dir": str(cache),
    }
    workdir, hold_dir = tmp_path / "w", tmp_path / "hold"
    hold_dir.mkdir()
    first = run(train_command(config, workdir, settings, hold_dir, "step=5"))
    held.wait_held(hold_dir, first)  # row 5 written; checkpoint 4 (or 2, if 4 was in flight)
    before = {r["step"]: r for r in metrics.read_rows(str(workdir / "metrics.jsonl"))}
    compiled = _entries(cache)
    assert compiled  # the step, written by the first start
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    resumed_from = checkpoint_steps.saved_steps(str(workdir))[-1]
    saved = checkpointing.saved_goodput(str(workdir), resumed_from)
    assert sorted(before) == [1, 2, 3, 4, 5] and resumed_from in (2, 4)

    second = run(train_command(config, workdir, settings))
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    rows = {r["step"]: r for r in metrics.read_rows(str(workdir / "metrics.jsonl"))}
    assert sorted(rows) == list(range(1, 9))
    after = rows[resumed_from + 1]  # the first row of the second start
    assert after["restore_sec"] > 0 and after["compile_sec"] > 0

    # The restart loaded the step from the cache and had nothing new to write there.
    assert "compiled the train step in" in err and "(from the compilation cache)" in err, err
    starts = [r for r in rows.values() if "restore_sec" in r]
    assert starts == [rows[1], after]
    assert "compile_cache_hits" not in rows[1] and after["compile_cache_hits"] >= 1
    assert _entries(cache) == compiled

    # Lost seconds (wall - productive) grow across the kill by at least the productive seconds
    # of the steps redone (counted once, from the checkpoint's total) and the restart's
    # restore and compile, which happened after the kill and are no step's compute.
    lost_before = before[5]["wall_sec"] - before[5]["productive_sec"]
    lost_after = after["wall_sec"] - after["productive_sec"]
    redone = before[5]["productive_sec"] - saved["productive_sec"]
    assert redone > 0
    restart = after["restore_sec"] + after["compile_sec"]
    assert lost_after >= lost_before + redone + restart - 1e-6
    # What the resume's first row says it lost: the rows it dropped took time (row 5's, after
    # checkpoint 4; 3 and 4's too after checkpoint 2), and the run was down until the restart.
    assert after["redone_sec"] >= before[5]["wall_sec"] - before[4]["wall_sec"] > 0
    assert after["down_sec"] > 0 and after["prepare_sec"] >= 0
    # So the goodput after the resume is below what the same totals would give without them.
    assert after["goodput"] < after["productive_sec"] / (after["wall_sec"] - redone - restart)
    # The first start is the one kept: the last checkpoint counts from it.
    final = checkpointing.saved_goodput(str(workdir), 8)
    assert final["first_start"] == saved["first_start"]

    report = run_command("electra_jax.goodput", str(workdir))
    assert report.returncode == 0, report.stderr
    assert f"step 8, goodput {100 * rows[8]['goodput']:.1f}%" in report.stdout
    assert "2 starts in the rows kept" in report.stdout
    assert "steps redone after a kill" in report.stdout and "down between starts" in report.stdout

    # Another model: its step is not in the cache; it is compiled and written there.
    other = {**settings, "model.intermediate_size": 96, "train.num_steps": 2}
    out = run(train_command(config, tmp_path / "other", other))
    _, err = out.communicate(timeout=600)
    assert out.returncode == 0, err[-3000:]
    assert "(from the compilation cache)" not in err
    (row, *_) = metrics.read_rows(str(tmp_path / "other" / "metrics.jsonl"))
    assert "compile_cache_hits" not in row
    assert _entries(cache) > compiled
