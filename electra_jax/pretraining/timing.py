"""Where a run's time goes, as the runner counts it: the waits of each metrics row's interval
and the goodput totals a checkpoint keeps.

Each metrics row's interval (from the previous row to this one, the held-out evaluation left
out) is split into the seconds the loop waited for data, blocked on a checkpoint save, or
compiled a program; the rest is compute. The held-out evaluation's seconds are reported beside
it (`eval_sec`). The first row after each start also has what the start cost before the steps:
`restore_sec` (the checkpoint's restore, or the fresh state's initialisation) and `compile_sec`
(the programs, from jax's persistent cache where they were there: `compile_cache_hits`), what
came before them (`prepare_sec`: the data, its tokenizer and the step's setup), and for a start
after others what was lost between (`redone_sec`, `down_sec`: resume_columns).

Goodput is the productive seconds (compute of the steps the run keeps) over the wall seconds
since the run's first start. Both totals are saved in every checkpoint (the first start's time
and the productive seconds up to its step) and restored from it, so that a run killed after its
last checkpoint and resumed counts the steps it redoes once, and the time they took the first
time, with the restart's, as lost: the goodput falls. A workdir whose checkpoints predate the
totals starts them at its next start.

`python -m electra_jax.goodput WORKDIR` reports them from metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
import time

# The seconds of an interval that are not compute, by metrics.jsonl column; the evaluation's
# are outside the interval (its row's own column).
WAITS = ("data_wait_sec", "checkpoint_block_sec", "compile_sec")
# What the progress line names, in this order, once the share that is not compute passes 5%.
_SHOWN = (
    ("data_wait_sec", "data"),
    ("checkpoint_block_sec", "checkpoint"),
    ("compile_sec", "compile"),
    ("eval_sec", "eval"),
)
SHOW_ABOVE = 0.05


def now() -> float:
    """The clock of every figure here, in seconds: wall time, which goes on across processes
    and hosts, so that a resumed run's wall total includes the time it was down."""
    return time.time()


class Breakdown:
    """The seconds of the current interval spent waiting, by column (WAITS and eval_sec), and
    the programs loaded from the compilation cache in it."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.cache_hits = 0

    def add(self, column: str, seconds: float) -> None:
        self.seconds[column] = self.seconds.get(column, 0.0) + seconds

    def waited(self) -> float:
        """The interval's seconds so far that were not compute (WAITS)."""
        return sum(self.seconds.get(c, 0.0) for c in WAITS)

    def take(self) -> dict[str, float]:
        """The interval's columns (data_wait_sec, checkpoint_block_sec, eval_sec always;
        compile_sec where something compiled), the counts set back to zero."""
        out = {c: self.seconds.get(c, 0.0) for c in ("data_wait_sec", "checkpoint_block_sec")}
        out["eval_sec"] = self.seconds.get("eval_sec", 0.0)
        if "compile_sec" in self.seconds:
            out["compile_sec"] = self.seconds["compile_sec"]
        if self.cache_hits:
            out["compile_cache_hits"] = float(self.cache_hits)
        self.seconds, self.cache_hits = {}, 0
        return out


@dataclasses.dataclass
class Totals:
    """The run's goodput totals: when it first started (now()) and the productive seconds of
    the steps it keeps."""

    first_start: float
    productive: float = 0.0

    def saved(self, pending: float = 0.0) -> dict:
        """What a checkpoint keeps: the totals with `pending` productive seconds of steps not
        yet in a row."""
        return {"first_start": self.first_start, "productive_sec": self.productive + pending}

    @classmethod
    def restored(cls, saved: dict | None, started: float) -> Totals:
        """The totals a checkpoint kept (`saved`), or a run first started at `started` (no
        checkpoint, or one written before the totals)."""
        if not saved:
            return cls(first_start=started)
        return cls(float(saved["first_start"]), float(saved["productive_sec"]))

    def columns(self, at: float) -> dict[str, float]:
        """productive_sec, wall_sec (since the first start) and goodput at time `at`."""
        wall = max(at - self.first_start, 1e-9)
        goodput = self.productive / wall
        return {"productive_sec": self.productive, "wall_sec": wall, "goodput": goodput}


def resume_columns(previous: list[dict], resume_step: int, since_first_start: float) -> dict:
    """What a start `since_first_start` seconds after the run's first one lost before it, from
    the rows the run had written (`previous`: all of them, those past `resume_step`, which the
    resume drops, included): `redone_sec`, the wall time those dropped rows took after the last
    kept one (steps done again now), and `down_sec`, from the last row to this start (the steps
    after it that no row shows, and the time no process ran). {} without such rows."""
    walls = [(r["step"], r["wall_sec"]) for r in previous if r.get("wall_sec") is not None]
    if not walls:
        return {}
    last = max(w for _, w in walls)
    kept = max((w for s, w in walls if s <= resume_step), default=0.0)
    return {"redone_sec": max(last - kept, 0.0), "down_sec": max(since_first_start - last, 0.0)}


def not_compute_note(row: dict, interval: float) -> str:
    """'  not compute 12% (data 3%, checkpoint 9%)' when the waits in an interval of `interval`
    seconds (`row`: Breakdown.take's, with the evaluation's eval_sec, which is outside it) pass
    SHOW_ABOVE of it with the evaluation; else ''."""
    total = interval + row.get("eval_sec", 0.0)
    parts = [(name, row.get(c, 0.0) / total) for c, name in _SHOWN if total > 0]
    share = sum(s for _, s in parts)
    if share <= SHOW_ABOVE:
        return ""
    named = ", ".join(f"{name} {100 * s:.0f}%" for name, s in parts if s >= 0.005)
    return f"  not compute {100 * share:.0f}% ({named})"
