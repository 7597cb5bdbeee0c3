"""The hostile-input table (tests/hostile_inputs.py): every case ends cleanly and loses nothing.

One test per case, so that the suite's workers share the table instead of one worker running all
of it at the end of its queue; the trained micro run every case starts from is built once per test
run, by whichever worker needs it first, and read by all."""

import fcntl
import os

import pytest

from tests import hostile_inputs

CASES = hostile_inputs.cases()


@pytest.fixture(scope="session")
def hostile_context(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is a folder of the run's own; their parent is shared.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built = shared / "hostile-built"
    with open(shared / "hostile-built.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while one builds
        if not (built / "READY").exists():
            if built.exists():
                raise RuntimeError(f"building {built} failed in another worker (see its error)")
            built.mkdir()
            hostile_inputs.make_context(built)
            (built / "READY").touch()
    yield hostile_inputs.context_at(built, scratch=tmp_path_factory.mktemp("hostile"))
    hostile_inputs.release_holders()


def test_the_table_names_each_case_once_and_covers_the_commands():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "two cases share a name"
    assert len(CASES) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_ends_in_one_clean_line_and_loses_nothing(case, hostile_context):
    row = hostile_inputs.run_case(case, hostile_context)
    assert row.passed, hostile_inputs.table([row])
