"""The hostile-input table (tests/hostile_inputs.py): every case ends cleanly and loses nothing."""

import pytest

from tests import hostile_inputs


@pytest.mark.slow
def test_every_hostile_input_ends_in_one_clean_line_and_loses_nothing(tmp_path):
    rows = hostile_inputs.run_all(tmp_path, workers=2)
    assert len(rows) >= 30
    failed = [r for r in rows if not r.passed]
    assert not failed, hostile_inputs.table(rows)
