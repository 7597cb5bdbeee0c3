r"""The paper configs compiled by the TPU compiler for the slices they are meant for, on a machine
without a TPU: per-device memory against HBM, compile time and two MFU ceilings: a roofline of
XLA's FLOP and byte totals, and the compiler's own estimated cycles of every instruction.

    python -m benchmarks.compile_table --out=benchmarks/compile_table

Each row is one `python -m electra_jax.train --config=... --dry_run --topology=...` (its own
process: a large compile holds gigabytes), so the table shows exactly what a user's command
prints. Rows are written to OUT.json (and the markdown table to OUT.md) as each finishes, so an
interrupted run keeps the rows it has; a rerun skips the rows OUT.json already holds.
--only=NAME,... runs the rows whose names are given; --again runs them even where OUT.json
holds them, each new row taking its old one's place once it is done (a change to the program
measured against the table's figures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402
from electra_jax.store import jsonio  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (config, slice, overrides): each config on the slices its docstring names and today's, as it
# stands (base and large with train.remat='auto': the fastest policy that fits each slice, which
# the remat column names; bfloat16; model.attention='auto': the Pallas kernel on TPU where it
# wins), and, to compare on the same compiler, the XLA attention core (EINSUM) and the path
# before those defaults (XLA_FLOAT32: float32 compute, the XLA core), and large with full remat;
# the rows the targets of benchmarks/notes/compile.md name first, then the slices most booked.
EINSUM = ("--config.model.attention=einsum",)
XLA_FLOAT32 = ("--config.model.dtype=float32", "--config.model.attention=einsum")
REMAT = ("--config.train.remat=full",)  # the numbers of the run unchanged
BFLOAT16 = ("--config.model.dtype=bfloat16",)
ROWS = (
    ("large", "v4-128", ()),
    ("base", "v4-16", ()),
    ("base", "v4-16", XLA_FLOAT32),
    ("base", "v4-16", EINSUM),
    ("small", "v5e-8", ()),
    ("large", "v4-128", EINSUM),
    ("large", "v4-128", XLA_FLOAT32),
    ("large", "v4-128", REMAT),
    ("large", "v3-512", ()),
    ("large", "v5p-128", ()),
    ("base", "v5e-16", ()),
    ("base", "v3-16", ()),
    ("base", "v5p-16", ()),
    ("large", "v6e-64", ()),
    ("large", "v6e-64", REMAT),
    ("small", "v4-8", ()),
    ("small", "v5e-8", BFLOAT16),
    ("small", "v3-8", ()),
)


def row_name(config: str, topology: str, overrides) -> str:
    extra = "".join(f" {o.removeprefix('--config.')}" for o in overrides)
    return f"{config}@{topology}{extra}"


def run_row(config: str, topology: str, overrides, timeout: float) -> dict:
    """One dry run: its JSON summary, or {'error': its one line} (a setting that does not fit)."""
    argv = [sys.executable, "-m", "electra_jax.train", f"--config=configs/{config}.py"]
    argv += ["--dry_run", f"--topology={topology}", *overrides]
    t0 = time.time()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    row = {}
    if out.returncode == 0:
        row.update(json.loads(out.stdout.strip().splitlines()[-1]))
        row["jax_topology"] = row.pop("topology")
    else:
        row["error"] = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    row.update(config=config, topology=topology, overrides=list(overrides), commit=_commit())
    row["wall_seconds"] = round(time.time() - t0, 1)
    return row


def _commit() -> str:
    """The checkout's commit, with '+' when its tracked files (the table's own aside) differ
    from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    table = [f":(exclude)benchmarks/compile_table.{ext}" for ext in ("json", "md")]
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", *table], cwd=ROOT)
    return head.stdout.decode().strip() + ("+" if dirty.returncode else "")


def _gib(n) -> str:
    return "" if n is None else f"{n / 2**30:.2f}"


def _percent(share) -> str:
    return "" if share is None else f"{100 * share:.1f}%"


def markdown(rows: list[dict]) -> str:
    """The table: one line per row, in the order run."""
    head = (
        "| config | slice | settings | remat | devices x hosts | mesh (data x fsdp) | "
        "batch per device | GiB per device (state + temp) of HBM | fits (headroom GiB) | "
        "compile s | MFU ceiling (roofline) | MFU ceiling (compiler's cycles) | commit |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        settings = ", ".join(o.removeprefix("--config.") for o in r["overrides"]) or "as is"
        # The policy compiled; with train.remat='auto', the fastest that fits, as the run
        # chooses it (rows from before the field: blank).
        remat = r.get("remat", "")
        if "remat_auto" in r:
            remat = f"auto: {remat}"
        if "error" in r:
            lines.append(
                f"| {r['config']} | {r['topology']} | {settings} | | | | | | no: "
                f"{r['error'].removeprefix('error: ').split(';')[0]} | | | | "
                f"{r.get('commit', '')} |"
            )
            continue
        mesh = f"{r['mesh']['data']} x {r['mesh']['fsdp']}"
        mfu = _percent(r.get("mfu_ceiling"))
        cycles = _percent(r.get("mfu_ceiling_cycles"))
        if cycles and r.get("pallas_calls_per_step"):
            cycles += " (Pallas calls at their roofline)"
        lines.append(
            f"| {r['config']} | {r['topology']} ({r['jax_topology']}, {r['device_kind']}) "
            f"| {settings} | {remat} | {r['devices']} x {r['hosts']} | {mesh} | "
            f"{r['batch_per_device']} | "
            f"{_gib(r['memory_per_device_bytes'])} ({_gib(r['memory_state_bytes'])} + "
            f"{_gib(r['memory_temp_bytes'])}) of {_gib(r['hbm_per_device_bytes'])} | "
            f"{'yes' if r['fits'] else 'no'} ({_gib(r['headroom_bytes'])}) | "
            f"{r['compile_seconds']} | {mfu} | {cycles} | {r.get('commit', '')} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = _cli.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/compile_table", help="OUT.json and OUT.md")
    parser.add_argument("--only", default="", help="comma-separated row names (default: all)")
    parser.add_argument(
        "--timeout", type=_cli.positive_float, default=3600.0, help="seconds per row"
    )
    parser.add_argument("--again", action="store_true", help="rerun rows OUT.json holds")
    args = parser.parse_args()
    known = [row_name(*r) for r in ROWS]
    wanted = set(_cli.names("--only", args.only, known, "rows")) if args.only else set(known)
    path = args.out + ".json"
    rows = jsonio.read_json(path, ValueError, default=[])
    done = [row_name(r["config"], r["topology"], r["overrides"]) for r in rows]
    for spec in ROWS:
        name = row_name(*spec)
        if name not in wanted or (name in done and not args.again):
            continue
        print(f"{name} ...", flush=True)
        row = run_row(*spec, timeout=args.timeout)
        if name in done:
            rows[done.index(name)] = row
        else:
            rows.append(row)
            done.append(name)
        jsonio.write_json(path, rows)
        jsonio.write_atomic(args.out + ".md", markdown(rows))
        print(f"  {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()
