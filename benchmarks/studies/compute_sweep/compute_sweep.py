r"""Where ELECTRA passes random init and MLM: the sample-efficiency benchmark over compute.

    python -m benchmarks.studies.compute_sweep.compute_sweep --preset=cpu --out=runs/compute-sweep

One pre-training run per objective on the small-data preset's in-domain corpus (the shared
corpus plus the GLUE tasks' training sentences, labels dropped): ELECTRA with configs/tiny.py's
recipe (its schedules stretched to the run), MLM at the learning rate of its own setting below,
each checkpointed at log-spaced fractions of the largest budget (`fractions`: budgets from
~1e12 to 3e14 counted FLOPs for the cpu preset, one run each, so the smaller budgets are the
early part of one schedule). Every checkpoint, and random init of the same shape, is then
fine-tuned on SST-2, MRPC, STS-B, CoLA and RTE by the sample-efficiency study's rule
(benchmarks/studies/sample_efficiency/sample_efficiency.py: a learning-rate sweep on seed 0, the
best rate for seeds 1 and 2; the same for every model) and probed (benchmarks/probe.py: logistic
regression on frozen mean-pooled states, SST-2), the low-noise second reading.

It writes OUT/summary.json (sample_efficiency's summary at the largest budget, plus `budgets`:
per budget and model the pre-training FLOPs and steps, the average dev score and its std over
seeds, and the probe's accuracy; `pretraining`: each run's held-out readings against FLOPs),
OUT/table.md, OUT/results.json, OUT/compute_sweep.png (average dev score and probe accuracy
against counted pre-training FLOPs: a line per objective with its seed band, random init as a
band, the budgets where ELECTRA first passes random init and MLM marked) and
OUT/pretraining.png (the held-out readings against FLOPs). `--report_only` writes the report
from the runs that have finished (while pre-training too: the probe at each saved checkpoint
and the held-out readings), so that a sweep cut short still reports what it measured.
Rerunning with the same --out continues.

The order is the readings' worth: pre-training, the probe at every checkpoint (minutes), then
the fine-tunings from the full budget down (every objective and random init first: the
headline). The pre-trainings can also run as one process each into one --out; start the
second once the first has logged its first compile (it makes the corpus, tokenizer and data
cache that the second then reads), and the whole command when both have ended:

    python -m benchmarks.studies.compute_sweep.compute_sweep --out=OUT --objectives=electra \
        --pretrain_only
    python -m benchmarks.studies.compute_sweep.compute_sweep --out=OUT --objectives=mlm \
        --pretrain_only
    python -m benchmarks.studies.compute_sweep.compute_sweep --out=OUT
"""

from __future__ import annotations

import json
import math
import os
import runpy
import statistics
import sys
import time

from benchmarks import _cli, probe
from benchmarks.studies.sample_efficiency import sample_efficiency
from electra_jax.store import checkpoint_steps

# electra_jax's pretraining and checkpointing modules import jax (seconds): the functions that
# use them import them, so that a refusal of a bad flag is not kept waiting.

ROOT = sample_efficiency.ROOT
RANDOM = sample_efficiency.RANDOM

_TINY = runpy.run_path(os.path.join(ROOT, "configs", "tiny.py"))["get_config"]()
# configs/tiny.py's schedules as fractions of its run, stretched to each sweep run.
_SCHEDULES = {
    key: getattr(_TINY.objective, key.split(".")[1]) / _TINY.train.num_steps
    for key in ("objective.temperature_steps", "objective.disc_mlm_steps")
    if getattr(_TINY.objective, key.split(".")[1], 0)
}

_SMALL_DATA = sample_efficiency.PRESETS["small-data-cpu"]

# ELECTRA whose discriminator learns faster than its generator: 4x the tiny recipe's rate, the
# generator at a tenth of it with its own embeddings (shared ones learn at the discriminator's
# rate, and through them the generator would still learn the unigram early). The best of the
# recipe study at this run's length (NOTES.md, first part, "The recipe at the sweep's length":
# held-out AUC 0.89 at 1,036 steps, and the slowest fall after it).
SLOW_GENERATOR = {
    "train.learning_rate": 1e-4,
    "train.generator_lr_scale": 0.1,
    "train.rtd_prior_init": True,
    "model.embedding_sharing": "none",
}

PRESETS = {
    # The default run's model (4 x 128, 128 tokens, batch 32) on the in-domain corpus, to 3e14
    # counted FLOPs per objective (~11K ELECTRA steps: about 70 minutes of one run on 2 cores).
    "cpu": {
        **_SMALL_DATA,
        "pretrain": {
            "data.vocab_size": 8192,
            "data.tokenizer_sample_sentences": 300_000,
            "data.heldout_examples": 512,
        },
        "variants": {
            "electra": {"objective": "electra", "overrides": {}},
            "electra-slowgen": {"objective": "electra", "overrides": SLOW_GENERATOR},
            # MLM's learning rate: the best of its own sweep (benchmarks/RESULTS.md).
            "mlm": {"objective": "mlm", "overrides": {"train.learning_rate": 1e-3}},
        },
        "schedule_fractions": _SCHEDULES,
        "warmup_fraction": _TINY.train.warmup_steps / _TINY.train.num_steps,
        "budget_flops": 3.0e14,
        "fractions": (1 / 243, 1 / 81, 1 / 27, 1 / 9, 1 / 3, 1.0),
        "finetune": {
            **_SMALL_DATA["finetune"],
            "seq_length": 128,
        },
        # Single sentences fit in 64 tokens (SST-2: 99.96% of its training set with this
        # tokenizer, CoLA: all), which halves their cost; pairs keep 128 (MRPC's median is 63).
        "finetune_tasks": {
            **_SMALL_DATA["finetune_tasks"],
            "SST-2": {**_SMALL_DATA["finetune_tasks"]["SST-2"], "seq_length": 64},
            "CoLA": {**_SMALL_DATA["finetune_tasks"]["CoLA"], "seq_length": 64},
        },
        "learning_rates": (1e-4, 3e-4, 1e-3),
        # SST-2's sentences fit in 64 tokens (99.96% of its training set with this tokenizer).
        "probe": {"task": "SST-2", "max_train_examples": 20000, "max_length": 64},
    },
}


def probes(results: dict, preset: dict, out: str, glue_dir: str, log) -> list[dict]:
    """The probe at every checkpoint of every objective and at random init: rows of {objective,
    step, task, accuracy}; each kept in OUT/probe/<model>-<step>.json and read back on a rerun.
    Budgets whose checkpoint is not saved yet (a sweep still pre-training) are left out."""
    import electra_jax

    spec = preset["probe"]
    folder = os.path.join(out, "probe")
    os.makedirs(folder, exist_ok=True)
    rows = []
    starts = []
    for p in results["pretrain"]:
        saved = checkpoint_steps.saved_steps(os.path.join(out, "pretrain", p["objective"]))
        starts += [(p["objective"], s) for s in p["steps"] if s in saved]
    first = None
    for name, step in [*starts, (RANDOM, 0)]:
        path = os.path.join(folder, f"{name}-{step}.json")
        if os.path.isfile(path):
            with open(path) as f:
                rows.append(json.load(f))
            continue
        if name == RANDOM:
            if first is None:  # every checkpoint's probe was read back: load one for its shape
                if not starts:
                    continue
                first = electra_jax.load(
                    os.path.join(out, "pretrain", starts[0][0]) + f"@{starts[0][1]}"
                )
            model = probe.random_model(first)
        else:
            model = electra_jax.load(os.path.join(out, "pretrain", name) + f"@{step}")
            first = first or model
        t0 = time.time()
        row = probe.probe_score(
            model,
            spec["task"],
            os.path.join(glue_dir, spec["task"]),
            spec["max_train_examples"],
            spec.get("max_length", 128),
        )
        row.update(objective=name, step=step, seconds=round(time.time() - t0, 1))
        log(f"probe {name}@{step}: {row['task']} accuracy {row['accuracy']:.4f}")
        sample_efficiency._write_json(path, row)
        rows.append(row)
    return rows


def budgets(results: dict) -> list[dict]:
    """Per budget: {fraction, pretrain_flops, models: {name: {steps, average, std, seeds,
    probe}}} with random init's readings under its name in every budget."""
    tasks, runs = results["tasks"], results["finetune"]
    probe_of = {(r["objective"], r["step"]): r for r in results.get("probe", [])}
    floor = sample_efficiency.per_seed_average([r for r in runs if r["objective"] == RANDOM], tasks)
    out = []
    for i, fraction in enumerate(results["fractions"]):
        row = {"fraction": fraction, "pretrain_flops": fraction * results["budget_flops"]}
        models = {}
        for p in results["pretrain"]:
            step = p["steps"][i]
            mine = [r for r in runs if r["objective"] == p["objective"] and r["step"] == step]
            models[p["objective"]] = _reading(
                sample_efficiency.per_seed_average(mine, tasks),
                probe_of.get((p["objective"], step)),
            )
            models[p["objective"]]["steps"] = step
        models[RANDOM] = _reading(floor, probe_of.get((RANDOM, 0)))
        row["models"] = models
        out.append(row)
    return out


def _reading(per_seed: list[float], probe_row: dict | None) -> dict:
    """A model's readings at one budget; `probe_se`: the probe accuracy's standard error from
    the dev set's size (sqrt(p (1 - p) / n), x100; the probe has no seeds to spread it)."""
    probe, se = None, None
    if probe_row is not None:
        p = probe_row["accuracy"]
        probe = round(100 * p, 2)
        if probe_row.get("dev_examples"):
            se = round(100 * math.sqrt(p * (1 - p) / probe_row["dev_examples"]), 2)
    return {
        "average": round(100 * statistics.mean(per_seed), 2) if per_seed else None,
        "std": round(100 * statistics.stdev(per_seed), 2) if len(per_seed) > 1 else None,
        "seeds": len(per_seed),
        "probe": probe,
        "probe_se": se,
    }


def crossovers(rows: list[dict], key: str = "average", model: str = "electra") -> dict:
    """The first budget's FLOPs at which `model`'s `key` passes random init's and MLM's, None
    where it never does: by more than the larger of their seed stds (the average over seeds),
    or of their standard errors (the probe: one fit, scored on a dev set of n sentences)."""
    found = {"random_init": None, "mlm": None}
    for row in rows:
        electra = row["models"].get(model, {})
        for other in found:
            them = row["models"].get(other, {})
            if found[other] is not None or electra.get(key) is None or them.get(key) is None:
                continue
            spread = "std" if key == "average" else f"{key}_se"
            margin = max(electra.get(spread) or 0.0, them.get(spread) or 0.0)
            if electra[key] > them[key] + margin:
                found[other] = row["pretrain_flops"]
    return found


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in (
        (axes[0], "average", "average dev score x100 (5 tasks)"),
        (axes[1], "probe", "SST-2 linear probe accuracy x100"),
    ):
        names = [n for n in rows[0]["models"]] if rows else []
        for name in names:
            xs = [r["pretrain_flops"] for r in rows if r["models"][name].get(key) is not None]
            ys = [r["models"][name][key] for r in rows if r["models"][name].get(key) is not None]
            sd = [r["models"][name].get("std") or 0.0 for r in rows if r["models"][name].get(key)]
            if not xs:
                continue
            style = "--" if name == RANDOM else "-o"
            (line,) = ax.plot(xs, ys, style, label=name.replace("_", " "))
            if key == "average":
                ax.fill_between(
                    xs,
                    [y - s for y, s in zip(ys, sd, strict=True)],
                    [y + s for y, s in zip(ys, sd, strict=True)],
                    alpha=0.2,
                    color=line.get_color(),
                )
        for other, flops in crossovers(rows, key).items():
            if flops is not None:
                ax.axvline(flops, color="grey", linestyle=":")
                ax.annotate(f"passes {other.replace('_', ' ')}", (flops, ax.get_ylim()[0]))
        ax.set_xscale("log")
        ax.set_xlabel("counted pre-training FLOPs")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        _cli.legend(ax)  # nothing fine-tuned yet: an empty panel
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=120)


# The held-out readings of the pre-training runs (docs/evaluation.md) shown against FLOPs.
READINGS = (
    "disc_auc",
    "disc_auc_frequent",
    "disc_auc_unigram",
    "disc_loss_gain",
    "collapse_cosine",
    "gen_accuracy",
    "mlm_accuracy",
)


def pretraining_readings(results: dict, out: str) -> dict:
    """Per pre-trained model, its held-out rows: [{step, pretrain_flops, <READINGS it has>}],
    read from OUT/pretrain/<model>/ (metrics.jsonl and any eval.jsonl)."""
    from electra_jax.pretraining import scoring

    found = {}
    for p in results["pretrain"]:
        rows = scoring.read_rows(os.path.join(out, "pretrain", p["objective"]))
        found[p["objective"]] = [
            {
                "step": r["step"],
                "pretrain_flops": r["step"] * p["flops_per_step"],
                **{
                    k: round(r[scoring.PREFIX + k], 4)
                    for k in READINGS
                    if r.get(scoring.PREFIX + k) is not None
                },
            }
            for r in rows
        ]
    return found


def plot_pretraining(readings: dict, path: str) -> None:
    """PNG: each held-out reading against counted pre-training FLOPs, a line per model that
    has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(READINGS), figsize=(4 * len(READINGS), 3.8))
    for ax, key in zip(axes, READINGS, strict=True):
        for name, rows in readings.items():
            mine = [r for r in rows if key in r]
            if mine:
                xs = [r["pretrain_flops"] for r in mine]
                ax.plot(xs, [r[key] for r in mine], "-o", markersize=3, label=name)
        ax.set_xscale("log")
        ax.set_title(f"held-out {key}", fontsize=9)
        ax.set_xlabel("counted pre-training FLOPs")
        ax.grid(True, which="both", alpha=0.3)
        _cli.legend(ax, fontsize=7)
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=110)


def sweep_table(results: dict) -> list[str]:
    """Markdown lines: seed 0's score (x100) at each fine-tuning learning rate, per start and
    task, the rate the sweep chose in bold ("-": not run yet)."""
    rows = results.get("sweep", [])
    rates = sorted({r["learning_rate"] for r in rows})
    if not rows:
        return []
    lines = [
        "Learning-rate sweep, seed 0 (x100; bold: the rate chosen for every seed):",
        "",
        "| start | task | " + " | ".join(f"{lr:g}" for lr in rates) + " |",
        "|---|---|" + "---|" * len(rates),
    ]
    by_key = {(r["objective"], r["step"], r["task"], r["learning_rate"]): r for r in rows}
    starts = dict.fromkeys((r["objective"], r["step"], r["task"]) for r in rows)
    for name, step, task in starts:
        cells = []
        for lr in rates:
            got = by_key.get((name, step, task, lr))
            cell = "-" if got is None else f"{100 * got['score']:.1f}"
            cells.append(f"**{cell}**" if got and got.get("chosen") else cell)
        lines.append(f"| {name}@{step} | {task} | " + " | ".join(cells) + " |")
    return lines


def report(results: dict, out: str) -> dict:
    """summary.json (sample_efficiency's summary plus `budgets` and `crossovers`), table.md and
    the plot, from whatever `results` holds."""
    summary = sample_efficiency.summary(results)
    rows = budgets(results)
    summary["budgets"] = rows
    summary["crossovers"] = {"average": crossovers(rows), "probe": crossovers(rows, "probe")}
    # The same for every other ELECTRA variant the sweep ran.
    summary["crossovers_by_model"] = {
        p["objective"]: {key: crossovers(rows, key, p["objective"]) for key in ("average", "probe")}
        for p in results["pretrain"]
        if p["objective"] not in ("electra", "mlm")
    }
    summary["pretraining"] = pretraining_readings(results, out)
    if any(summary["pretraining"].values()):
        plot_pretraining(summary["pretraining"], os.path.join(out, "pretraining.png"))
    sample_efficiency._write_json(os.path.join(out, "summary.json"), summary)
    lines = [
        "| budget FLOPs | model | steps | average +- std (seeds) | probe |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for name, m in r["models"].items():
            avg = "-" if m["average"] is None else f"{m['average']:.2f} +- {m['std'] or 0:.2f}"
            lines.append(
                f"| {r['pretrain_flops']:.3g} | {name} | {m.get('steps', 0)} | {avg} "
                f"({m['seeds']}) | {m['probe'] if m['probe'] is not None else '-'} |"
            )
    lines += ["", *sweep_table(results)]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if rows:
        plot(rows, os.path.join(out, "compute_sweep.png"))
    return summary


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", help=sample_efficiency.CORPUS_HELP)
    ap.add_argument("--glue_dir", help=sample_efficiency.GLUE_HELP)
    ap.add_argument("--report_only", action="store_true", help="report the finished runs")
    ap.add_argument(
        "--objectives", default="", help="comma-separated models of the preset; '' = all"
    )
    ap.add_argument(
        "--pretrain_only",
        action="store_true",
        help="pre-train --objectives and stop (one process per objective into one --out)",
    )
    ap.add_argument(
        "--stop_flops",
        type=float,
        default=None,
        help="run the budgets up to this many counted FLOPs (the schedules still span the "
        "preset's whole budget; a later run without it continues the same runs)",
    )
    ap.add_argument(
        "--seeds",
        type=_cli.positive_int,
        default=None,
        help="fine-tuning seeds (default: the preset's); 1 runs only seed 0's learning-rate "
        "sweep, which a later run with more seeds reuses",
    )
    ap.add_argument(
        "--allow_change",
        default="",
        help="comma-separated config keys a resumed pre-training may find changed (as train's "
        "--allow_change; recorded in its config_changes.jsonl), e.g. data.source when the corpus "
        "files were copied anew",
    )
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.allow_change:
        keys = _cli.each_once("--allow_change", [k for k in args.allow_change.split(",") if k])
        preset = {**preset, "allow_changes": tuple(keys)}
    if args.stop_flops is not None:
        first = preset["fractions"][0] * preset["budget_flops"]
        if not args.stop_flops >= first:
            ap.error(
                f"--stop_flops={args.stop_flops:g} lies below the first budget ({first:.3g} "
                "counted FLOPs); raise it"
            )
        preset = {**preset, "stop_fraction": args.stop_flops / preset["budget_flops"]}
    objectives = tuple(preset["variants"])
    if args.objectives:
        objectives = tuple(
            _cli.names("--objectives", args.objectives, objectives, "models of the preset")
        )
    log = lambda m: print(m, file=sys.stderr, flush=True)
    if args.report_only:
        done = os.path.join(args.out, "results.json")
        here = os.path.isdir(os.path.join(args.out, "pretrain")) and os.path.isdir(
            os.path.join(args.out, "tokenizer")
        )
        if not here and not os.path.isfile(done):
            ap.error(f"--report_only: --out {args.out} holds no sweep yet; run without it")
        _cli.directory("--glue_dir", args.glue_dir, sample_efficiency.GLUE_HELP)
        if here:
            # Read from the folder itself: the runs' plan, what they have saved so far, and
            # every fine-tuning that has finished, whichever process ran it.
            sample_efficiency.check_inputs(args.corpus, args.glue_dir)
            if not args.objectives:  # the models this folder has pre-trained
                ran = [
                    n for n in objectives if os.path.isdir(os.path.join(args.out, "pretrain", n))
                ]
                objectives = tuple(ran) or objectives
            results = sample_efficiency.run(
                preset,
                args.out,
                objectives=objectives,
                seeds=args.seeds,
                corpus=args.corpus,
                glue_dir=args.glue_dir,
                log=lambda m: None,
                until="collect",
            )
        else:
            with _cli.failures(done, also=(OSError, ValueError)), open(done) as f:
                results = json.load(f)
        results["probe"] = probes(results, preset, args.out, args.glue_dir, log)
    else:
        sample_efficiency.check_inputs(args.corpus, args.glue_dir)
        common = dict(
            objectives=objectives,
            seeds=args.seeds,
            corpus=args.corpus,
            glue_dir=args.glue_dir,
            log=log,
        )
        # Pre-training (or finding it done), then the probe at every checkpoint: minutes
        # against the fine-tunings' hours, and the low-noise reading, so it comes first.
        # A run that refuses to resume (its settings or corpus changed), or a workdir another
        # process holds: one line, as for a bad flag.
        with _cli.failures(f"--out {args.out}"):
            pretrained = sample_efficiency.run(preset, args.out, until="pretrain", **common)
        probe_rows = probes(pretrained, preset, args.out, args.glue_dir, log)
        if args.pretrain_only:
            for p in pretrained["pretrain"]:
                log(f"{p['objective']}: checkpoints {p['steps']}, {p['seconds']:.0f}s")
            return
        # What --report_only reads until the first fine-tuning writes its own.
        partial = os.path.join(args.out, "results.partial.json")
        sample_efficiency._write_json(partial, {**pretrained, "probe": probe_rows})
        with _cli.failures(f"--out {args.out}"):
            results = sample_efficiency.run(preset, args.out, **common)
        results["probe"] = probe_rows
        sample_efficiency._write_json(os.path.join(args.out, "results.json"), results)
    print(json.dumps(report(results, args.out), indent=1))


if __name__ == "__main__":
    _cli.run(main)
