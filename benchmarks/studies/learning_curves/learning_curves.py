r"""Learning curves of electra_jax against an independent ELECTRA, on the same batches, as a plot.

    python -m electra_jax.train --config=configs/tiny.py --workdir=runs/curves-s0 --config.seed=0 \
        --config.train.learning_rate=1e-3 --config.train.rtd_prior_init=False
    python benchmarks/reference/hf_reference_pretrain.py --workdir runs/curves-s0 \
        --config runs/curves-s0/config.json --log_every 100
    ... the same for seeds 1, 2 ...
    python -m benchmarks.studies.learning_curves.learning_curves --out=runs/curves.png \
        runs/curves-s*

The two overrides give the run the paper's rate and zero-initialised head, as the reference trains
(configs/tiny.py holds the small-compute recipe instead). For each workdir, reads electra_jax's
WORKDIR/metrics.jsonl and the reference's WORKDIR/hf_reference_metrics.jsonl (written by
benchmarks/reference/hf_reference_pretrain.py, which trains transformers' ELECTRA with the original
objective and optimizer on the batches electra_jax reads), and plots gen_loss, disc_loss,
disc_recall and gen_accuracy against the step: per side, the mean over the workdirs (seeds) and a
band from their minimum to their maximum, each curve smoothed by a running mean over --smooth
logged rows (each row is one batch's value). The discriminator's loss is drawn with the entropy of
the replaced fraction beside it: the loss of a discriminator that only knows how many tokens are
replaced (the prior). With --each, one curve per workdir instead (runs that differ in a setting).
Prints one JSON line: per side and metric, the mean over seeds of the last --tail rows, and the
seeds' spread. """

from __future__ import annotations

import json
import math
import os
import statistics

from benchmarks import _cli

# electra_jax.pretraining.metrics imports jax (seconds): the function that uses it imports it,
# so that a refusal of a bad flag is not kept waiting.

METRICS = ("gen_loss", "disc_loss", "disc_recall", "gen_accuracy")
SIDES = {"electra_jax": "metrics.jsonl", "reference": "hf_reference_metrics.jsonl"}


def prior_entropy(p: float) -> float:
    """Binary cross-entropy (nats) of always predicting the replaced fraction p."""
    if not 0 < p < 1:
        return 0.0
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def smooth(values: list[float], window: int) -> list[float]:
    """Running mean over the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def curves(workdirs: list[str], smooth_rows: int) -> dict:
    """{side: {metric: {step: [value per workdir]}}} over the steps every workdir logged."""
    from electra_jax.pretraining import metrics

    out: dict = {}
    for side, name in SIDES.items():
        per_run = []
        for w in workdirs:
            rows = [r for r in metrics.read_rows(os.path.join(w, name)) if "disc_loss" in r]
            if rows:
                per_run.append(rows)
        if not per_run:
            continue
        steps = sorted(set.intersection(*({r["step"] for r in rows} for rows in per_run)))
        side_curves = {}
        for key in (*METRICS, "prior"):
            series = []
            for rows in per_run:
                by_step = {r["step"]: r for r in rows}
                if key == "prior":
                    values = [prior_entropy(by_step[s]["replaced_fraction"]) for s in steps]
                else:
                    values = [float(by_step[s].get(key, float("nan"))) for s in steps]
                series.append(smooth(values, smooth_rows))
            side_curves[key] = {"steps": steps, "runs": series}
        out[side] = side_curves
    return out


def tail_summary(data: dict, tail: int) -> dict:
    """Per side and metric: the mean over runs of each run's mean of its last `tail` values, and
    the spread (max - min) of those run means."""
    out = {}
    for side, side_curves in data.items():
        out[side] = {}
        for key, c in side_curves.items():
            finals = [statistics.mean(run[-tail:]) for run in c["runs"]]
            out[side][key] = {
                "mean": round(statistics.mean(finals), 4),
                "spread": round(max(finals) - min(finals), 4),
                "runs": len(finals),
                "last_step": c["steps"][-1],
            }
    return out


def plot(data: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, key in zip(axes.flat, METRICS, strict=True):
        for i, (name, side_curves) in enumerate(data.items()):
            color = f"C{i}"  # electra_jax blue, the reference orange
            c = side_curves[key]
            runs = c["runs"]
            mean = [statistics.mean(v) for v in zip(*runs, strict=True)]
            lo = [min(v) for v in zip(*runs, strict=True)]
            hi = [max(v) for v in zip(*runs, strict=True)]
            label = f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            ax.plot(c["steps"], mean, color=color, label=label)
            ax.fill_between(c["steps"], lo, hi, color=color, alpha=0.2)
            if key == "disc_loss":
                prior = [
                    statistics.mean(v) for v in zip(*side_curves["prior"]["runs"], strict=True)
                ]
                ax.plot(c["steps"], prior, color=color, linestyle=":", linewidth=1)
        ax.set_title(key + (" (dotted: the prior's entropy)" if key == "disc_loss" else ""))
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    _cli.legend(axes.flat[0])
    fig.suptitle(title)
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=110)


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("workdirs", nargs="+", help="one workdir per seed, trained by both sides")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--smooth", type=_cli.positive_int, default=5, help="rows in the running mean")
    ap.add_argument(
        "--tail", type=_cli.positive_int, default=5, help="rows averaged for the summary line"
    )
    ap.add_argument("--title", default="electra_jax and the reference on the same batches")
    ap.add_argument(
        "--each",
        action="store_true",
        help="one curve per workdir and side, named by its folder, instead of a band over "
        "them: for runs that differ in a setting rather than in the seed",
    )
    args = ap.parse_args(argv)
    for w in args.workdirs:
        _cli.directory("WORKDIR", w, "workdirs trained by both sides (metrics.jsonl)")
    _cli.each_once("WORKDIR", args.workdirs, key=os.path.realpath)
    if args.each:
        data = {}
        for w in args.workdirs:
            for side, side_curves in curves([w], args.smooth).items():
                name = os.path.basename(os.path.normpath(w))
                data[name if side == "electra_jax" else f"{name} {side}"] = side_curves
    else:
        data = curves(args.workdirs, args.smooth)
    if not data:  # name the files read, not only that there is nothing to plot
        from electra_jax.cli import fail

        files = [os.path.join(w, name) for w in args.workdirs for name in SIDES.values()]
        absent = [f for f in files if not os.path.exists(f)]
        said = [f"{f} does not exist" for f in absent]
        said += [f"{f} holds no row with disc_loss" for f in files if f not in absent]
        fail(f"{args.out}: nothing to plot: {'; '.join(said)}; nothing was written")
    plot(data, args.out, args.title)
    print(json.dumps(tail_summary(data, args.tail)))


if __name__ == "__main__":
    _cli.run(main)
