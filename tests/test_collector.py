"""tests/collector.py: the suite's workers and the commands forked from the warm interpreter run
with the collector settled."""

import gc

from tests import collector
from tests.conftest import run_python

_SEEN = "import gc; print(gc.get_threshold(), gc.get_freeze_count() > 0)"


def test_this_worker_collects_rarely_and_left_its_imports_out():
    assert gc.get_threshold() == collector.THRESHOLDS
    assert gc.get_freeze_count() > 10_000  # the imports and the test modules: frozen


def test_a_served_command_starts_settled_and_a_fresh_one_does_not():
    settled = f"{collector.THRESHOLDS} True\n"
    for _ in range(2):  # a server starts at its environment's second command
        served = run_python("-c", _SEEN)
    assert served.returncode == 0 and served.stdout == settled, served.stderr
    fresh = run_python("-c", _SEEN, fresh=True)
    assert fresh.returncode == 0 and fresh.stdout.endswith(" False\n"), fresh.stderr
    assert fresh.stdout != settled.replace("True", "False")  # Python's own thresholds
