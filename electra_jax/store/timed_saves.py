"""checkpoint.every_minutes: a checkpoint once that many minutes have passed since the last one
(or since this start), besides those of checkpoint.every_steps.

A preemption without SIGTERM (a host failure, a maintenance event) loses the steps since the last
checkpoint; at a large model's step, checkpoint.every_steps can be hours of them. The clock bounds
that loss whatever the step time.

The decision is orbax's ContinuousCheckpointingPolicy: the primary host (process 0) compares its
own clock with the time of the last save and hands its answer to every other process through
jax's coordination service (a key it sets, which they read with a blocking get). An orbax save is
collective, so every process must save the same steps; clocks that disagree between hosts cannot
split them, since only process 0's is read.

It is asked at the steps that are multiples of log.every_steps: every process reaches them (a
compiled call ends there), the saved step has its metrics row (metrics.jsonl then ends where a
resume starts), and the coordination service keeps one key per question, so asking once a row
rather than once a call keeps that to a few thousand over a paper run. A timed save therefore
comes at the first row at least every_minutes after the last save.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable

# The clock the decision reads (process 0's counts): monotonic, so that a change of the
# machine's date moves no save. A test replaces it (tests/save_clock.py) or passes `now`.
clock: Callable[[], float] = time.monotonic

_ORIGIN = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
    """orbax's PolicyCheckpointInfo: a step and when it was saved (or the start)."""

    step: int
    time: datetime.datetime
    metrics: dict | None = None


class TimedSaves:
    """Whether a step is due a checkpoint by the clock (`due`); `saved` after every save, timed
    or not, restarts the interval. `minutes` 0: never."""

    def __init__(
        self,
        minutes: float,
        log_every: int,
        start_step: int,
        now: Callable[[], float] | None = None,
    ):
        self.minutes, self.log_every = minutes, log_every
        self._now = now if now is not None else clock
        self._policy = None
        if minutes > 0:
            from orbax.checkpoint import checkpoint_managers

            self._policy = checkpoint_managers.ContinuousCheckpointingPolicy(
                minimum_interval_secs=minutes * 60
            )
        # A resume counts from its start, not from its checkpoint's commit: the time the run
        # was down cost no work, and the first steps after a start should not wait on a save.
        self._last = self._at(start_step)

    def _at(self, step: int) -> _Checkpoint:
        return _Checkpoint(step, _ORIGIN + datetime.timedelta(seconds=self._now()))

    def asks(self, step: int) -> bool:
        """Whether `step` is one the clock is asked at (`due`): a multiple of log.every_steps,
        when every_minutes > 0."""
        return self._policy is not None and step % self.log_every == 0

    def due(self, step: int) -> bool:
        """Whether `step` saves by the clock: the same answer on every process, process 0's.
        Every process must ask at the same steps (those `asks` names)."""
        if not self.asks(step):
            return False
        from orbax.checkpoint import checkpoint_managers, options

        context = checkpoint_managers.DecisionContext(
            # Not orbax's "a save is still being written": our save waits for it, and an
            # interval silently stretched by slow storage would not be the one configured.
            is_saving_in_progress=False,
            reached_preemption=False,
            multiprocessing_options=options.MultiprocessingOptions(primary_host=0),
        )
        return bool(self._policy.should_save(self._at(step), [self._last], context=context))

    def saved(self, step: int) -> None:
        """A checkpoint of `step` was started now: the next timed one is `minutes` from here."""
        self._last = self._at(step)
