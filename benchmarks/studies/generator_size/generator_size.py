r"""The ELECTRA paper's Figure 3 (left): how wide the generator should be.

    python -m benchmarks.studies.generator_size.generator_size --preset=cpu \
        --out=runs/generator-size

Pre-trains the same discriminator with generators of 1/8, 1/4, 1/2, 3/4 and 1 times its width
(`generator.hidden_fraction`; the generator's heads are width / 64, at least 1, and its
feed-forward 4 x width, as the original's get_generator_config), all at the same number of
steps, then fine-tunes each, and a random-init network of the same shape, on each GLUE task x
seed exactly as the sample-efficiency study (benchmarks/studies/sample_efficiency/) does (the
same code: the same task files, fine-tuning settings, seeds and learning-rate rule).

It writes OUT/results.json, OUT/table.md (dev scores per generator size and task),
OUT/summary.json (the average dev score x100 and its std over seeds per generator size and for
random init) and OUT/generator_size.png: the average dev score against the generator's width
as a fraction of the discriminator's, random init dashed. The paper finds the best generators at
1/4 to 1/2 of the discriminator's width and one as wide as the discriminator clearly worse
(its Figure 3, left, for discriminators of width 256, 512 and 768 at 500K steps). Rerunning
with the same --out continues where it stopped.

Presets: `cpu` is sample_efficiency's `cpu` model (a 2-layer, 128-wide discriminator: generators
16, 32, 64, 96 and 128 wide) at 1,500 steps of 32 x 64 tokens each; `gpu` is ELECTRA-Small
(configs/small.py, 12 x 256, bf16, 128 tokens, batch 128: generators 32 to 256 wide) at 100K
steps each (untested here; at the ~16 ms step measured for ELECTRA-Small on one H200 about half
an hour per generator, the wider ones longer).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from benchmarks import _cli
from benchmarks.studies.sample_efficiency import sample_efficiency as se

FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)


def label(fraction: float) -> str:
    """The name of the model pre-trained with a generator of `fraction` of the width."""
    return f"generator_{fraction:g}"


def variants(fractions=FRACTIONS) -> dict:
    """sample_efficiency's model variants: ELECTRA with each generator width."""
    return {
        label(f): {"objective": "electra", "overrides": {"generator.hidden_fraction": f}}
        for f in fractions
    }


def _preset(base: dict, steps: int, **fields) -> dict:
    preset = {k: v for k, v in base.items() if k not in ("budget_flops", "objectives")}
    preset.update(
        budget_steps=steps,
        fractions=(1.0,),  # one checkpoint per model: the end of its run
        variants=variants(),
        objectives=tuple(variants()),
        **fields,
    )
    return preset


PRESETS = {
    # 1,500 steps of the 2-layer, 128-wide model: 3-5 minutes of pre-training per generator on
    # 2 CPU cores, then sample_efficiency's cpu fine-tuning (600 examples, 3 seeds, 5 tasks).
    "cpu": _preset(se.PRESETS["cpu"], 1500, warmup_fraction=0.1),
    "gpu": _preset(se.PRESETS["gpu"], 100_000, warmup_fraction=0.02),
}


def fraction_of(name: str) -> float | None:
    """The generator fraction of a model's label, None for random init."""
    return float(name[len("generator_") :]) if name.startswith("generator_") else None


def plot(results: dict, path: str) -> None:
    """PNG: the average dev score (x100, error bars the std over seeds) against the generator's
    width as a fraction of the discriminator's; random init as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    task_names, runs = results["tasks"], results["finetune"]
    xs, ys, errs = [], [], []
    for p in results["pretrain"]:
        mine = [r for r in runs if r["objective"] == p["objective"]]
        per_seed = se.per_seed_average(mine, task_names)
        if per_seed:
            xs.append(fraction_of(p["objective"]))
            ys.append(100 * statistics.mean(per_seed))
            errs.append(100 * statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label="ELECTRA")
    floor = se.per_seed_average([r for r in runs if r["objective"] == se.RANDOM], task_names)
    if floor:
        ax.axhline(100 * statistics.mean(floor), color="gray", linestyle="--", label="random init")
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel("generator width / discriminator width")
    ax.set_ylabel(f"average dev score x100 ({', '.join(task_names)})")
    ax.set_title(f"{results['budget_steps']} pre-training steps each")
    ax.grid(True, alpha=0.3)
    _cli.legend(ax)
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=120)


def run(preset: dict, out: str, **kwargs) -> dict:
    """sample_efficiency.run over the generator sizes, plus this benchmark's plot
    (results['plot']); kwargs as sample_efficiency.run's (tasks, seeds, corpus, glue_dir, log)."""
    results = se.run(preset, out, objectives=list(preset["objectives"]), **kwargs)
    results["plot"] = os.path.join(out, "generator_size.png")
    plot(results, results["plot"])
    return results


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="where every run goes; a rerun continues it")
    ap.add_argument("--tasks", default="", help="comma-separated; '' = the preset's")
    ap.add_argument("--seeds", type=_cli.natural_int, default=0, help="0 = the preset's")
    ap.add_argument("--corpus", help=se.CORPUS_HELP)
    ap.add_argument("--glue_dir", help=se.GLUE_HELP)
    args = ap.parse_args(argv)
    started = time.time()
    tasks = _cli.glue_tasks("--tasks", args.tasks) if args.tasks else None
    se.check_inputs(args.corpus, args.glue_dir)
    # A run that refuses to resume (its settings or corpus changed), or a workdir another
    # process holds: one line, as for a bad flag.
    with _cli.failures(f"--out {args.out}"):
        results = run(
            PRESETS[args.preset],
            args.out,
            tasks=tasks,
            seeds=args.seeds or None,
            corpus=args.corpus,
            glue_dir=args.glue_dir,
        )
    print(results["table"])
    print(f"\nplot: {results['plot']}  ({(time.time() - started) / 60:.1f} min)", file=sys.stderr)


if __name__ == "__main__":
    _cli.run(main)
