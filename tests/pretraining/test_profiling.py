"""log.profile_steps: a trace of exactly the chosen steps, whole calls or single steps, and no
compiling inside it."""

import glob
import gzip
import json

import pytest

from electra_jax.pretraining import runner
from tests.pretraining.test_runner import config_with, prepare_shared_data


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def _traced(workdir) -> tuple[list[tuple[int, int]], list[str]]:
    """((first step, last step) of each `train` call in the run's Perfetto trace, the names of
    its events)."""
    found = glob.glob(str(workdir / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(found) == 1, found  # what TensorBoard's profile plugin reads
    (perfetto,) = glob.glob(
        str(workdir / "profile" / "**" / "perfetto_trace.json.gz"), recursive=True
    )
    with gzip.open(perfetto) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    calls = [
        (int(e["args"]["step_num"]), int(e["args"]["last_step"]))
        for e in events
        if e.get("name") == "train" and e.get("ph") == "X"
    ]
    return sorted(calls), [str(e.get("name", "")) for e in events]


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, count, calls",
    [
        (3, 4, [(3, 4), (5, 6)]),  # on the grid of 2-step calls: two whole calls
        # Ending off it: a whole call, then a single step, whose program the first calls
        # (whole) did not need; compiled before the trace all the same.
        (3, 3, [(3, 4), (5, 5)]),
    ],
)
def test_the_trace_holds_exactly_the_chosen_steps(
    shared_data, tmp_path, capsys, first, count, calls
):
    cfg = config_with(shared_data)
    cfg.train.num_steps = 8
    cfg.train.steps_per_call = 2
    cfg.log.every_steps = cfg.checkpoint.every_steps = 6
    cfg.log.profile_steps, cfg.log.profile_num_steps = first, count
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir))
    traced, names = _traced(workdir)
    assert traced == calls
    # Every program the traced calls run was compiled (or loaded from the suite's compilation
    # cache) before the trace started: no compile line after its start, no XLA compile event
    # in it (such as "backend_compile_and_load", "PjRtCpuClient::Compile").
    compiles = {n for n in names if n == "backend_compile_and_load" or n.endswith("::Compile")}
    assert not compiles, sorted(compiles)
    err = capsys.readouterr().err
    last = first + count - 1
    tracing = err.index(f"tracing steps {first}-{last}")
    assert "compiled the" in err[:tracing] and "compiled the" not in err[tracing:], err
    assert f"wrote a trace of steps {first}-{last} to {workdir / 'profile'}" in err[tracing:]
    # What a step of the trace is, and a window off the grid of calls said so, with the one on it.
    assert "each `train` step of the trace is one call of up to 2 steps" in err
    off_grid = "are not whole calls of train.steps_per_call=2" in err
    assert off_grid == (last % 2 == 1)
    if off_grid:
        assert "log.profile_steps=3, log.profile_num_steps=4 traces whole calls" in err


@pytest.mark.slow
def test_no_trace_by_default_nor_for_steps_already_run(shared_data, tmp_path, capsys):
    cfg = config_with(shared_data)
    cfg.train.num_steps, cfg.train.steps_per_call = 4, 2
    cfg.log.every_steps = cfg.checkpoint.every_steps = 2
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir), stop_after=2)
    assert not (workdir / "profile").exists()
    # One whole call: its program only (no single step compiled for a profile not asked for).
    assert capsys.readouterr().err.count("compiled the") == 1
    cfg.log.profile_steps = 2
    runner.train(cfg, str(workdir))
    assert not (workdir / "profile").exists()
    assert "log.profile_steps=2: the run resumes at step 2, after it; no trace" in (
        capsys.readouterr().err
    )
