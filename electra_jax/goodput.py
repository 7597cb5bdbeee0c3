"""`python -m electra_jax.goodput WORKDIR`: a run's goodput across restarts, and where its wall
time went, from its metrics.jsonl (what the columns count: electra_jax/pretraining/timing.py).
"""

from __future__ import annotations

import sys

from electra_jax.store import filenames, paths, workdir_files

_REPORTED = (
    ("compile_sec", "compiling"),
    ("restore_sec", "restoring checkpoints"),
    ("checkpoint_block_sec", "blocked on checkpoint saves"),
    ("eval_sec", "held-out evaluation"),
    ("data_wait_sec", "waiting for data"),
    # A start's first row: before its restore, and what the resume lost (timing.resume_columns).
    ("prepare_sec", "preparing data and the run"),
    ("redone_sec", "steps redone after a kill"),
    ("down_sec", "down between starts"),
)


# The columns the report does arithmetic on: each, where a row has it, a finite number.
_NUMBERS = ("wall_sec", "productive_sec", "goodput") + tuple(c for c, _ in _REPORTED)


def report(rows: list[dict], workdir: str) -> str:
    """The goodput report of a run's metrics rows (metrics.read_rows): its goodput at the last
    row and where the wall time since its first start went. ValueError when no row has the
    goodput columns."""
    last = next((r for r in reversed(rows) if r.get("wall_sec") is not None), None)
    if last is None:
        raise ValueError("no metrics row with goodput columns")
    wall, productive = last["wall_sec"], last.get("productive_sec")
    if productive is None or last.get("goodput") is None:
        raise ValueError(
            f"its row of step {last['step']} has wall_sec but no productive_sec or goodput"
        )
    if wall <= 0:
        raise ValueError(
            f"its row of step {last['step']} has wall_sec {wall}: no time to share out"
        )
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
        f"  {'other':<{width}}{_hms(lost):>10}  {100 * lost / wall:5.1f}%  (logging, the "
        "loop's own time, and starts whose rows predate the columns above)"
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
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m electra_jax.goodput WORKDIR", file=sys.stderr)
        return 2
    workdir = args[0]
    path = paths.join(workdir, filenames.METRICS_FILE)
    try:
        # The run's own file, read defensively: a folder or FIFO of that name, bytes that are
        # not UTF-8, a row that is no object or whose times are no numbers is one line.
        rows = workdir_files.read_rows(path, by_step=True, numbers=_NUMBERS)
    except workdir_files.WorkdirFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows and not paths.exists(path):
        print(f"error: {path} does not exist; name the workdir of a training run", file=sys.stderr)
        return 2
    try:
        print(report(rows, workdir))
    except ValueError as e:
        if "no metrics row" in str(e):
            reason = (
                "has no row with goodput columns (a run logged before they existed gets them "
                "from its next start)"
            )
        else:
            reason = f"cannot give a goodput report: {e}; {workdir_files.AWAY}"
        print(f"error: {path} {reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
