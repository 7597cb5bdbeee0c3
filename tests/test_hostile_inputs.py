"""The hostile-input table (tests/hostile_inputs.py): every case ends cleanly and loses nothing.

One test per case, so that the suite's workers share the table instead of one worker running all
of it at the end of its queue; the trained micro run every case starts from is built once per test
run, by whichever worker needs it first, and read by all."""

import pytest

from tests import hostile_inputs
from tests.conftest import built_once

CASES = hostile_inputs.cases()


@pytest.fixture(scope="session")
def hostile_context(tmp_path_factory):
    built = built_once(tmp_path_factory, "hostile-built", hostile_inputs.make_context)
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
