"""`python -m electra_jax.goodput WORKDIR`: a run's goodput across restarts, and where its wall
time went, from its metrics.jsonl (what the columns count: electra_jax/pretraining/timing.py).
"""

from __future__ import annotations

import sys

from electra_jax.store import filenames, paths

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
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m electra_jax.goodput WORKDIR", file=sys.stderr)
        return 2
    workdir = args[0]
    path = paths.join(workdir, filenames.METRICS_FILE)
    if not paths.exists(path):
        print(f"error: {path} does not exist; name the workdir of a training run", file=sys.stderr)
        return 2
    # Here, below the checks: metrics imports jax (seconds), which a refusal need not wait for.
    from electra_jax.pretraining import metrics

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
