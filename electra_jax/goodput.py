"""Where a run's time goes, and its goodput across restarts.

Each metrics row's interval (from the previous row to this one, the held-out evaluation left
out) is split into the seconds the loop waited for data, blocked on a checkpoint save, or
compiled a program; the rest is compute. The held-out evaluation's seconds are reported beside
it (`eval_sec`). The first row after each start also has what the start cost before the steps:
`restore_sec` (the checkpoint's restore, or the fresh state's initialisation) and `compile_sec`
(the programs, from jax's persistent cache where they were there: `compile_cache_hits`).

Goodput is the productive seconds (compute of the steps the run keeps) over the wall seconds
since the run's first start. Both totals are saved in every checkpoint (the first start's time
and the productive seconds up to its step) and restored from it, so that a run killed after its
last checkpoint and resumed counts the steps it redoes once, and the time they took the first
time, with the restart's, as lost: the goodput falls. A workdir whose checkpoints predate the
totals starts them at its next start.

    python -m electra_jax.goodput WORKDIR

prints a run's report from its metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
import sys
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


# ------------------------------------------------------------------------------------ report

_REPORTED = (
    ("compile_sec", "compiling"),
    ("restore_sec", "restoring checkpoints"),
    ("checkpoint_block_sec", "blocked on checkpoint saves"),
    ("eval_sec", "held-out evaluation"),
    ("data_wait_sec", "waiting for data"),
)


def report(rows: list[dict], workdir: str) -> str:
    """The goodput report of a run's metrics rows (metrics.read_rows): its goodput at the last
    row and where the wall time since its first start went. ValueError when no row has the
    goodput columns."""
    last = next((r for r in reversed(rows) if r.get("wall_sec") is not None), None)
    if last is None:
        raise ValueError("no metrics row with goodput columns")
    wall, productive = last["wall_sec"], last["productive_sec"]
    starts = sum(1 for r in rows if r.get("restore_sec") is not None)
    lines = [
        f"{workdir}: step {last['step']}, goodput {100 * last['goodput']:.1f}% "
        f"({_hms(productive)} productive of {_hms(wall)} since the first start; "
        f"{starts} start{'s' if starts != 1 else ''} in the rows kept)"
    ]
    accounted = productive
    width = max(len(name) for _, name in _REPORTED) + 2
    for column, name in _REPORTED:
        seconds = sum(r.get(column) or 0.0 for r in rows)
        accounted += seconds
        lines.append(f"  {name:<{width}}{_hms(seconds):>10}  {100 * seconds / wall:5.1f}%")
    lost = max(wall - accounted, 0.0)
    lines.append(
        f"  {'other':<{width}}{_hms(lost):>10}  {100 * lost / wall:5.1f}%  (steps redone after a "
        "kill, starts before their first row, time between runs, logging)"
    )
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def main(argv: list[str] | None = None) -> int:
    """`python -m electra_jax.goodput WORKDIR`: prints the run's report; one line and exit 2
    for a workdir that has none."""
    from electra_jax import filenames, metrics, paths

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m electra_jax.goodput WORKDIR", file=sys.stderr)
        return 2
    workdir = args[0]
    path = paths.join(workdir, filenames.METRICS_FILE)
    if not paths.exists(path):
        print(f"error: {path} does not exist; name the workdir of a training run", file=sys.stderr)
        return 2
    rows = metrics.read_rows(path)
    try:
        print(report(rows, workdir))
    except ValueError:
        print(
            f"error: {path} has no row with goodput columns (a run logged before they existed "
            "gets them from its next start)",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
