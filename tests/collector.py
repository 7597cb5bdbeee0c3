"""The suite's long-lived processes (its pytest workers and tests/command_server.py's servers and
their children) collect garbage less often and never look again at what they imported.

Why: Python's cyclic collector walks every object of the generations it collects. A worker
holds millions (jax, flax, orbax, tensorflow-datasets, the test modules, every traced program),
and tracing makes objects fast enough to set off a full collection every few seconds: measured
with gc.callbacks, test_optimizer_step and test_networks in one process spent 6.3 s of 60 s in
the collector, 5.1 s of it in 18 full collections (1.4 s with `settle`), and a profile of the
whole suite (perf, 2 cores) put 11% of its CPU time in the collector. What is collected is the
same garbage, later: no test's numbers depend on when.
"""

import gc

# Collections of the youngest generation every 50,000 allocations net of deallocations instead of
# 700, and of the older ones 20 and 100 times rarer than that (10 and 10 by default).
THRESHOLDS = (50_000, 20, 100)


def settle() -> None:
    """Collects once, then moves every object alive into the permanent generation (gc.freeze:
    no later collection walks them) and sets THRESHOLDS. Call it once the imports are done."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
