"""checkpoint.every_minutes by a clock the test moves: asked only at rows, counted from the start
and from every save, timed or not (two processes, a kill and the exact resume:
tests/test_multihost.py)."""

from electra_jax.store import timed_saves


class _Clock:
    """Seconds that move only when the test says."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_save_is_due_at_the_first_row_after_the_interval_counted_from_the_last_save():
    clock = _Clock()
    timed = timed_saves.TimedSaves(minutes=2, log_every=5, start_step=10, now=clock)
    clock.t += 119
    assert not timed.due(15)
    clock.t += 1
    assert not timed.asks(16) and not timed.due(16)  # not a row: every process asks at rows
    assert timed.asks(20)
    assert timed.due(20)
    timed.saved(20)
    clock.t += 100
    assert not timed.due(25)
    timed.saved(26)  # a save by steps (or a preemption) restarts the interval too
    clock.t += 100
    assert not timed.due(30)
    clock.t += 20
    assert timed.due(30)


def test_zero_minutes_never_saves_and_reads_no_clock():
    def clock():
        raise AssertionError("read")

    timed = timed_saves.TimedSaves(minutes=0, log_every=1, start_step=0, now=lambda: 0.0)
    timed._now = clock
    assert not any(timed.asks(s) or timed.due(s) for s in range(1, 50))


def test_fractions_of_a_minute_and_the_module_clock_are_used():
    clock = _Clock()
    saved, timed_saves.clock = timed_saves.clock, clock
    try:
        timed = timed_saves.TimedSaves(minutes=0.5, log_every=1, start_step=0)
    finally:
        timed_saves.clock = saved
    clock.t += 29.9
    assert not timed.due(1)
    clock.t += 0.1
    assert timed.due(2)
