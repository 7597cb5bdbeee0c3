"""`python -m tests.save_clock SECONDS MODULE [ARGS...]`: `python -m MODULE ARGS...` whose
checkpoint.every_minutes clock (store/timed_saves.py) is a counter, not the machine's: on
process 0 each reading is SECONDS later than the one before (the first reads 0), on every other
process it reads 0 forever.

Which steps a run saves by the clock is then fixed, however fast or loaded the machine, and a
process that decided by its own clock would save none: a run that saves at all shows that
process 0's clock decided for every process. Chains with tests/held.py (its MODULE may be this).
"""

from __future__ import annotations

import runpy
import sys


def _counter(seconds: float):
    readings = []

    def clock() -> float:
        import jax

        if jax.process_index() != 0:
            return 0.0
        readings.append(None)
        return (len(readings) - 1) * seconds

    return clock


def main(argv: list[str]) -> None:
    seconds, module, *args = argv
    from electra_jax.store import timed_saves

    timed_saves.clock = _counter(float(seconds))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
