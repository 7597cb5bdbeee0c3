"""A trace of chosen training steps (log.profile_steps, log.profile_num_steps) in WORKDIR/profile.

jax.profiler's trace of steps FIRST .. LAST, started once every program the steps use is
compiled and stopped once the last of them has finished on the device: host and device events,
each compiled call marked `train` with its first step (`step_num`, which TensorBoard's profile
plugin groups steps by) and its last (`last_step`; a call runs train.steps_per_call steps).
So a "step" of xprof's step-time view is one call, K optimizer steps: the steps of one compiled
call cannot be marked from the host, and the line that starts the trace says so.
The loop ends calls at FIRST - 1 and at LAST, so the trace holds exactly those steps; where
those are not ends of whole calls, a line says so and names the window that is.

Written as jax writes it: WORKDIR/profile/plugins/profile/<time>/ with `<host>.xplane.pb`
(TensorBoard: `tensorboard --logdir WORKDIR/profile`, the Profile tab) and
`perfetto_trace.json.gz` (ui.perfetto.dev: Open trace file). A gs:// workdir's trace is written
on this host and uploaded when it ends. Nothing happens, and nothing is imported, when off.
"""

from __future__ import annotations

import contextlib

import jax

from electra_jax.pretraining import metrics
from electra_jax.store import filenames, paths

FOLDER = filenames.PROFILE_DIR


class Profile:
    """The trace of steps first .. first + count - 1 (steps counted from 1, as the rows' are);
    first = 0 traces nothing."""

    def __init__(self, workdir: str, first: int, count: int, start_step: int, per_call: int = 1):
        self.first, self.last = first, first + count - 1
        self.per_call = per_call
        self.target = paths.join(workdir, FOLDER)
        self.active = False
        self.wanted = first > 0 and start_step < first
        if first > 0 and start_step >= first:
            metrics.log(
                f"log.profile_steps={first}: the run resumes at step {start_step}, after it; "
                "no trace (name a later step)"
            )
        elif self.wanted and ((first - 1) % per_call or self.last % per_call):
            # Said rather than rounded: the trace holds the steps asked for, but the calls that
            # end at them are shorter than train.steps_per_call, which can cost a program of
            # its own (one step a call) at the first start and makes the trace's calls unlike
            # the run's other calls.
            lo = (first - 1) // per_call * per_call + 1
            hi = -(-self.last // per_call) * per_call
            metrics.log(
                f"log.profile_steps={first}, log.profile_num_steps={count}: steps {first}-"
                f"{self.last} are not whole calls of train.steps_per_call={per_call}; the calls "
                "at their ends run one step each (a program of its own, compiled before the "
                f"trace); log.profile_steps={lo}, log.profile_num_steps={hi - lo + 1} traces "
                "whole calls"
            )
        self._local = None
        self._traced = first - 1  # the last step whose call the trace holds

    def steps(self) -> tuple[int, int] | None:
        """(first, last) of the steps to trace, or None when there is no trace to take."""
        return (self.first, self.last) if self.wanted else None

    def bounds(self) -> tuple[int, ...]:
        """The steps a call must end at so that the trace holds exactly its steps."""
        return (self.first - 1, self.last) if self.wanted else ()

    @contextlib.contextmanager
    def call(self, step: int, size: int):
        """Around the call of `size` steps after `step`, its batches read and its results
        waited for: the trace starts before the first traced call and stops after the last."""
        if not self.wanted:
            yield
            return
        if step == self.first - 1 and not self.active:
            self._start()
        if not self.active:
            yield
            return
        with jax.profiler.StepTraceAnnotation("train", step_num=step + 1, last_step=step + size):
            yield
        self._traced = step + size
        if self._traced >= self.last:
            self.stop()

    def _start(self) -> None:
        # The target itself, or for a gs:// one a temporary folder on this host (uploaded).
        self._local = paths.LocalFolder(self.target, prefix="electra_jax-profile-")
        jax.profiler.start_trace(self._local.path, create_perfetto_trace=True)
        self.active = True
        # xprof's steps are these annotations: one per call, of up to steps_per_call steps.
        per = f"one call of up to {self.per_call} steps" if self.per_call > 1 else "one step"
        metrics.log(
            f"tracing steps {self.first}-{self.last}: each `train` step of the trace is {per} "
            "(step_num its first step, last_step its last)"
        )

    def stop(self) -> None:
        """Ends the trace (at its last step, or when the run stops inside it) and writes it."""
        if not self.active:
            return
        jax.profiler.stop_trace()
        self.active, self.wanted = False, False
        self._local.upload()
        self._local.close()
        metrics.log(
            f"wrote a trace of steps {self.first}-{self._traced} to {self.target} (tensorboard "
            "--logdir there, or its perfetto_trace.json.gz in ui.perfetto.dev)"
        )
