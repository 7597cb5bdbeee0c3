r"""The ELECTRA paper's Table 5 at equal pre-training compute: which objective learns most per FLOP.

    python -m benchmarks.studies.sample_efficiency.sample_efficiency --preset=cpu \
        --out=runs/sample-efficiency

For each objective (electra, electra_15, mlm, replaced_mlm, all_tokens_mlm) pre-trains the same
discriminator on the same prepared corpus (one tokenizer, one data cache) until the same counted
pre-training FLOPs (`metrics.count_flops` for that objective: MLM has no generator, so it gets
more steps), saving a checkpoint at each fraction of the budget within that one run (the
schedule's warm-up and linear decay run to the objective's own full-budget step count). Then
fine-tunes every (objective, budget) checkpoint, and a random-init network of the same shape as
the floor, on each GLUE task x seed (benchmarks/glue.py's configs), and prints:

  1. Table 5: one row per objective at the full budget, a column per task and the average
     (headline dev metric x 100: accuracy, Matthews corr. for CoLA, Spearman for STS-B),
     mean +- std over seeds (the average is taken per seed, then over seeds);
  2. the average per objective per budget, with its steps and pre-training FLOPs.

`--objectives=electra,adversarial,two_stage,mlm` puts the paper's Figure 3 (right) on one plot:
Adversarial ELECTRA trains the generator to fool the discriminator by REINFORCE with a learned
baseline (objective.name='adversarial'; the preset's generator, no maximum-likelihood warm start,
as the paper states none); Two-Stage ELECTRA trains a generator as wide as the discriminator (so
it gets fewer steps for the same FLOPs) alone for the first half of its steps, then the
discriminator started from it.

It writes OUT/results.json (every run), OUT/table.md (both tables) and OUT/sample_efficiency.png
(average dev score against pre-training FLOPs, log x, a line per objective, random init dashed).
Rerunning with the same --out continues: finished pre-training steps and fine-tuning runs (their
eval_results.json) are skipped, an interrupted pre-training run resumes from its checkpoint.

`--preset=small-data-cpu` is the user story of a small labelled set and a small budget, on 2 CPU
cores in an hour: it pre-trains `electra` and `mlm` on the shared corpus plus the tasks' own
training sentences (labels dropped; OUT/corpus/), fine-tunes on the GLUE training sets (SST-2 and
CoLA capped at 4000 examples) with the better of two learning rates on seed 0 for every model
(random init included), and also writes OUT/summary.json: the average dev score x100 of each
model over 3 seeds, their std, the pre-training FLOPs and the wall seconds.

Presets (PRESETS below): `cpu` took 41 minutes on 2 CPU cores (a 2-layer, 128-wide model, 4-7
minutes of pre-training per objective, fine-tuning capped to 600 examples of 64 tokens; at this
compute the scores stay near random init's, see NOTES.md); `gpu` is ELECTRA-Small
at 128 tokens at the compute of the paper's ELECTRA-Small run (untested here; about half a
GPU-day per objective: run objectives as separate jobs into one --out, then once more with all
of them, which finds everything done and reports the whole table).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import statistics
import sys
import time

from benchmarks import _cli, glue
from electra_jax.finetune import tasks as glue_tasks
from electra_jax.objectives.catalog import OBJECTIVES as ALL_OBJECTIVES
from electra_jax.store import checkpoint_steps

# electra_jax's pretraining and checkpointing modules import jax (seconds): the functions that
# use them import them, so that a refusal of a bad flag is not kept waiting.

# benchmarks/studies/sample_efficiency/sample_efficiency.py: the repository is three folders up.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
OBJECTIVES = ("electra", "electra_15", "mlm", "replaced_mlm", "all_tokens_mlm")
TASKS = ("SST-2", "MRPC", "STS-B", "CoLA", "RTE")
UNTIL = ("plan", "pretrain", "collect", "report")  # how far `run` goes
# The inputs a user supplies (the repository holds neither): what to give, where to read more.
CORPUS_HELP = 'the pre-training text, a glob of its files (benchmarks/README.md, "Inputs")'
GLUE_HELP = 'GLUE\'s folder: <TASK>/{train,dev}.tsv (benchmarks/README.md, "Inputs")'
RANDOM = "random_init"

# Each preset: `pretrain` overrides configs/<base>.py ('data.x' / 'model.x' / 'train.x' keys),
# the budget in counted pre-training FLOPs, the fractions of it checkpointed and fine-tuned,
# and `finetune` overrides configs/glue.py's top-level fields.
PRESETS = {
    "cpu": {
        "base": "tiny",
        "pretrain": {
            "data.vocab_size": 4096,
            "data.seq_length": 64,
            "model.hidden_size": 128,  # discriminator 128 wide, 2 layers; generator 32 wide
            "model.num_layers": 2,
            "model.num_heads": 2,
            "model.intermediate_size": 512,
            "model.embedding_size": 128,
            "train.batch_size": 32,
            "train.learning_rate": 1e-3,
            "train.rtd_prior_init": False,  # the paper's head, not tiny.py's small-compute one
            "train.adam_bias_correction": True,  # a few thousand steps: as configs/tiny.py
        },
        "warmup_fraction": 0.1,  # of each objective's own full-budget steps
        # electra 6.8 GFLOP/step: ~3.5K steps of 32 x 64 tokens (~9 min on one core); mlm ~3.9K,
        # replaced_mlm ~3.2K, all_tokens_mlm (an MLM head at every token) ~1.8K.
        "budget_flops": 2.4e13,
        "fractions": (0.25, 1.0),
        "finetune": {
            "max_train_examples": 600,  # the same fixed subset for every seed and model
            "seq_length": 64,
            "num_epochs": 3.0,  # ~56 steps: ~7 s a run, compilation cached
            "double_unordered": False,  # no doubled MRPC / STS-B sets: time goes to seeds
            "batch_size": 32,
            "learning_rate": 1e-3,
            "layer_decay": 0.9,
            "adam_bias_correction": True,  # ~60 steps: uncorrected Adam barely moves
            "eval_batch_size": 256,
            "log_every_steps": 1000,
        },
        "tasks": TASKS,
        "seeds": 3,
    },
    # The user story of the paper's promise: a small labelled set and a small budget. Pre-trains
    # on the general corpus plus the tasks' own training sentences (in-domain text, labels
    # dropped), then fine-tunes on the GLUE training sets (SST-2 capped); the learning rate of
    # each model and task is the better of a two-point sweep on seed 0 (the same rule for every
    # objective and for random init). Sized for 2 CPU cores in an hour, end to end.
    "small-data-cpu": {
        "base": "tiny",
        "in_domain": True,
        "objectives": ("electra", "mlm"),
        "pretrain": {
            "data.vocab_size": 8192,
            "data.seq_length": 64,
            "data.tokenizer_sample_sentences": 300_000,
            "model.hidden_size": 128,  # discriminator 2 x 128, generator 32 wide
            "model.num_layers": 2,
            "model.num_heads": 2,
            "model.intermediate_size": 512,
            "model.embedding_size": 128,
            "train.batch_size": 64,
            "train.learning_rate": 2e-3,
            "train.rtd_prior_init": False,
            "train.adam_bias_correction": True,  # a few thousand steps: as configs/tiny.py
        },
        # ELECTRA with configs/tiny.py's small-compute recipe (benchmarks/RESULTS.md, "Recipe
        # study": at 2e-3 its discriminator falls back to the prior with collapsed states); MLM
        # keeps the rate above.
        "variants": {
            "electra": {
                "objective": "electra",
                "overrides": {"train.learning_rate": 2.5e-5, "train.rtd_prior_init": True},
            },
        },
        "warmup_fraction": 0.05,
        # electra 1.5e10 FLOPs/step: ~1.9K steps of 64 x 64 tokens (~8 min); mlm ~2.1K.
        "budget_flops": 3.0e13,
        "fractions": (1.0,),
        "finetune": {
            "seq_length": 64,
            "num_epochs": 2.0,
            "double_unordered": False,
            "batch_size": 32,
            "adam_bias_correction": True,  # a few hundred steps: uncorrected Adam barely moves
            "eval_batch_size": 256,
            "log_every_steps": 1000,
        },
        "finetune_tasks": {
            "SST-2": {"max_train_examples": 4000},
            "CoLA": {"max_train_examples": 4000},
            "RTE": {"num_epochs": 3.0},
        },
        "learning_rates": (3e-4, 1e-3),
        "tasks": TASKS,
        "seeds": 3,
    },
    # ELECTRA-Small (configs/small.py: 12 x 256, generator 1/4, 128 tokens, batch 128) at the
    # compute of the paper's Small run: 1e18 counted FLOPs is ~870K electra steps (1.15e12 each;
    # mlm ~940K, all_tokens_mlm ~650K), checkpointed at 1/8 .. 1, full GLUE training sets.
    # Untested here. At the 10-30 steps/s expected of one H100/H200 (benchmarks/notes/gpu.md) that
    # is about half a GPU-day per objective: run objectives as separate jobs (--objectives) into
    # one --out, or lower budget_flops.
    "gpu": {
        "base": "small",
        "pretrain": {
            "train.learning_rate": 5e-4,
            "model.dtype": "bfloat16",
        },
        "warmup_fraction": 0.02,
        "budget_flops": 1.0e18,
        "fractions": (0.125, 0.25, 0.5, 1.0),
        "finetune": {
            "seq_length": 128,
            "learning_rate": 3e-4,  # the paper's for Small
            "log_every_steps": 500,
        },
        "tasks": TASKS,
        "seeds": 3,
    },
}


# ----------------------------------------------------------------------------------- corpus

# Lines per document of the tasks' text: a blank line ends one, so examples pack a few related
# lines (a pair's two sentences stay together) and never run across the whole file.
_TASK_DOCUMENT_LINES = 16


def in_domain_corpus(corpus_glob: str, glue_dir: str, tasks, out: str) -> str:
    """OUT/corpus/: the general corpus (links to its files) and the tasks' training sentences with
    their labels dropped (one `task-<TASK>.txt` each; a pair's sentences on consecutive lines),
    the text a user with a small labelled set has. Returns the glob over both (for `text:`).

    Only training sentences are used: the dev sets that score the runs are never pre-trained on.
    """
    import glob

    folder = os.path.join(out, "corpus")
    os.makedirs(folder, exist_ok=True)
    for i, path in enumerate(sorted(glob.glob(corpus_glob, recursive=True))):
        link = os.path.join(folder, f"general-{i:03d}-{os.path.basename(path)}")
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
    for name in tasks:
        task = glue_tasks.get_task(name)
        examples = glue_tasks.load_split(task, glue_tasks.TRAIN, os.path.join(glue_dir, name))
        lines = [t for e in examples for t in (e.text_a, e.text_b) if t]
        documents = [
            "\n".join(lines[i : i + _TASK_DOCUMENT_LINES])
            for i in range(0, len(lines), _TASK_DOCUMENT_LINES)
        ]
        path = os.path.join(folder, f"task-{task.name}.txt")
        text = "\n\n".join(documents) + "\n"
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    # Left as it is: a rewrite would change its time, and a pre-training run
                    # of this --out (another objective's process) refuses to resume on a corpus
                    # file retimed under it.
                    continue
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return f"{folder}/*.txt"


# ----------------------------------------------------------------------------------- budgets


def budget_steps(budget_flops: float, flops_per_step: float, fractions) -> list[int]:
    """Steps at which the run has spent each fraction of the budget: round(f x budget / step
    FLOPs), at least 1; [len(fractions)] ascending ints (the last is the run's num_steps when
    the fractions end at 1). Raises ValueError for fractions that are not increasing in (0, 1]
    or budgets so close that two round to the same step."""
    fractions = list(fractions)
    if not fractions or any(not 0 < f <= 1 for f in fractions) or fractions != sorted(fractions):
        raise ValueError(f"fractions {fractions} must increase within (0, 1]")
    steps = [max(1, round(f * budget_flops / flops_per_step)) for f in fractions]
    if len(set(steps)) != len(steps):
        raise ValueError(
            f"budget {budget_flops:.3g} FLOPs at {flops_per_step:.3g} per step gives steps "
            f"{steps}: raise the budget or space the fractions"
        )
    return steps


def variant(preset: dict, name: str) -> tuple[str, dict]:
    """(objective, config overrides) of the model called `name`: one of the preset's `variants`
    (e.g. the generator-size study's ELECTRA with each generator width), else the objective
    of that name with the preset's own settings."""
    found = preset.get("variants", {}).get(name)
    if found is None:
        return name, {}
    return found["objective"], found["overrides"]


def pretrain_config(preset: dict, name: str, corpus: str, out: str):
    """configs/<base>.py with the preset's fields, model `name` (an objective or one of the
    preset's variants), the shared corpus, tokenizer and data cache; num_steps and the schedule
    are set by `plan`."""
    config = runpy.run_path(os.path.join(ROOT, "configs", f"{preset['base']}.py"))["get_config"]()
    name, overrides = variant(preset, name)
    for key, value in {**preset["pretrain"], **overrides}.items():
        section, field = key.split(".")
        config[section][field] = value
    config.objective.name = name
    if name == "two_stage":
        # The second stage starts the discriminator from the generator: the same size. Its
        # heads and feed-forward width must then be the generator's (hidden / 64, 4 x hidden),
        # which validate checks.
        config.generator.hidden_fraction, config.generator.layers_fraction = 1.0, 1.0
    config.data.source = f"text:{corpus}"
    config.data.cache_dir = os.path.join(out, "data")
    return config


def plan(config, preset: dict) -> dict:
    """The objective's counted FLOPs per step and its budget steps (the preset's fractions of
    its `budget_flops`, or of its `budget_steps` where it gives those: equal steps instead of
    equal compute); sets config's num_steps, warm-up and checkpoint cadence (a checkpoint at
    each budget step, all kept)."""
    from electra_jax.pretraining import metrics, program

    name = config.objective.name
    spec, _, _, _, num_slots = program.build(config, config.data.vocab_size)
    per_step = metrics.count_flops(
        spec, config.train.batch_size, config.data.seq_length, num_slots, name
    )["total"]
    if "budget_steps" in preset:
        steps = budget_steps(preset["budget_steps"], 1, preset["fractions"])
    else:
        steps = budget_steps(preset["budget_flops"], per_step, preset["fractions"])
    # The schedules span the whole budget even where this run stops short of it, so that a
    # later run with a higher stop_fraction continues the same run.
    config.train.num_steps = steps[-1]
    if name == "two_stage":  # the paper's two halves: the generator, then the discriminator
        config.objective.two_stage_steps = max(1, steps[-1] // 2)
    config.train.warmup_steps = max(1, int(preset["warmup_fraction"] * steps[-1]))
    # The loop saves at every_steps multiples and at stop_after; `pretrain` stops at each budget.
    config.checkpoint.every_steps = steps[-1]
    # Every budget's checkpoint, and room for those that interruptions save between two.
    config.checkpoint.keep = len(steps) + 4
    config.log.every_steps = max(1, steps[-1] // 20)
    # Held-out readings (docs/evaluation.md) every 5 rows and at the last step.
    config.eval.every_steps = 5 * config.log.every_steps
    # Schedules of the recipe given as fractions of the run (e.g. the temperature's), in steps.
    for key, fraction in preset.get("schedule_fractions", {}).items():
        section, field = key.split(".")
        config[section][field] = max(1, round(fraction * steps[-1]))
    kept = steps[: len(run_fractions(preset))]
    return {"objective": name, "flops_per_step": per_step, "steps": kept, "run_steps": steps[-1]}


def run_fractions(preset: dict) -> list[float]:
    """The preset's fractions up to its `stop_fraction` (default 1: all of them): the budgets
    this run pre-trains and fine-tunes; those above wait for a later run into the same --out.
    Raises ValueError when the stop lies below the first fraction."""
    stop = preset.get("stop_fraction", 1.0)
    kept = [f for f in preset["fractions"] if f <= stop * (1 + 1e-9)]
    if not kept:
        raise ValueError(
            f"stop_fraction {stop:g} lies below the first budget's fraction "
            f"{preset['fractions'][0]:g}: nothing to run"
        )
    return kept


def headline(results: dict) -> str:
    """The largest budget the results reach, in words: 'N pre-training steps each' or 'X
    counted pre-training FLOPs'."""
    last = results["fractions"][-1]
    if results.get("budget_steps"):
        return f"{round(results['budget_steps'] * last)} pre-training steps each"
    return f"{results['budget_flops'] * last:.3g} counted pre-training FLOPs"


def seconds_spent(workdir: str) -> float:
    """The seconds `pretrain` has spent on this workdir so far, over all its calls."""
    path = os.path.join(workdir, "pretrain_seconds.json")
    if not os.path.isfile(path):
        return 0.0
    with open(path) as f:
        return float(json.load(f))


def pretrain(config, workdir: str, steps: list[int], log=print, allow_changes=()) -> float:
    """Trains to each budget step in turn (stop_after: one schedule, a checkpoint at each);
    skips steps already saved. Returns the seconds spent on this workdir over all calls (kept
    in WORKDIR/pretrain_seconds.json, so a resumed benchmark still reports the whole).
    `allow_changes`: config keys a resumed run may find changed (runner.train's)."""
    from electra_jax.pretraining import runner

    path = os.path.join(workdir, "pretrain_seconds.json")
    spent = seconds_spent(workdir)
    for step in steps:
        saved = checkpoint_steps.saved_steps(workdir)
        if step in saved or max(saved, default=0) > step:
            continue
        log(f"pre-training {config.objective.name} to step {step} of {steps[-1]}")
        started = time.time()
        row = runner.train(config, workdir, stop_after=step, allow_changes=tuple(allow_changes))
        spent += time.time() - started
        _write_json(path, spent)  # whole or as it was: a kill mid-write loses no seconds
        if "preempted_at" in row:
            # SIGTERM / Ctrl-C: the run saved its step; the benchmark stops with it instead of
            # going on to the next budget, and the same command continues from that checkpoint.
            raise SystemExit(
                f"pre-training of {workdir} stopped at step {row['preempted_at']} by a signal; "
                "run the same command to continue"
            )
    return spent


# ----------------------------------------------------------------------------------- fine-tuning


def finetune(config, workdir: str) -> dict:
    """One fine-tuning run, or its stored results when it already finished."""
    done = finished(workdir)
    if done is not None:
        return done
    from electra_jax.finetune import loop as finetune_loop

    result = finetune_loop.finetune(config, workdir)
    if "stopped_at" in result:
        # SIGTERM / Ctrl-C: the run saved its step; the benchmark stops with it, and the same
        # command resumes that run from its checkpoint.
        raise SystemExit(
            f"fine-tuning in {workdir} stopped at step {result['stopped_at']} of "
            f"{result['steps']} by a signal; run the same command to continue"
        )
    return result


def finished(workdir: str) -> dict | None:
    """A fine-tuning run's stored results (its eval_results.json), None while it has none."""
    path = os.path.join(workdir, "eval_results.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------- report


def _points(values: list[float]) -> str:
    return glue.summary(values) if values else "-"


def per_seed_average(runs: list[dict], task_names) -> list[float]:
    """The average over tasks of each seed that has every task: [seeds] floats (0-1 scale)."""
    by_seed: dict[int, dict[str, float]] = {}
    for r in runs:
        by_seed.setdefault(r["seed"], {})[r["task"]] = r["score"]
    return [
        statistics.mean(scores[t] for t in task_names)
        for _, scores in sorted(by_seed.items())
        if all(t in scores for t in task_names)
    ]


def tables(results: dict) -> str:
    """Markdown: Table 5 at the full budget (plus random init), then the average per budget."""
    task_names = results["tasks"]
    runs = results["finetune"]
    head = "| objective | " + " | ".join(task_names) + " | average |"
    lines = [
        f"Dev scores (x100) at the largest budget run, {headline(results)}, mean +- std over seeds",
        "",
        head,
        "|" + "---|" * (len(task_names) + 2),
    ]
    rows = [(p["objective"], p["steps"][-1]) for p in results["pretrain"]] + [(RANDOM, 0)]
    for name, step in rows:
        mine = [r for r in runs if r["objective"] == name and r["step"] == step]
        cells = [_points([r["score"] for r in mine if r["task"] == t]) for t in task_names]
        cells.append(_points(per_seed_average(mine, task_names)))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| objective | budget | steps | pre-training FLOPs | average |",
        "|---|---|---|---|---|",
    ]
    for p in results["pretrain"]:
        for fraction, step in zip(results["fractions"], p["steps"], strict=True):
            mine = [r for r in runs if r["objective"] == p["objective"] and r["step"] == step]
            lines.append(
                f"| {p['objective']} | {fraction:g} | {step} | "
                f"{step * p['flops_per_step']:.3g} | "
                f"{_points(per_seed_average(mine, task_names))} |"
            )
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """PNG: average dev score (x100) against pre-training FLOPs, log x, a line per objective
    (error bars: std over seeds), random init as a dashed horizontal line; with one budget,
    bars per task instead (plot_bars)."""
    if len(results["fractions"]) == 1:
        plot_bars(results, path)
        return
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    task_names, runs = results["tasks"], results["finetune"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in results["pretrain"]:
        xs, ys, errs = [], [], []
        for step in p["steps"]:
            avg = per_seed_average(
                [r for r in runs if r["objective"] == p["objective"] and r["step"] == step],
                task_names,
            )
            if avg:
                xs.append(step * p["flops_per_step"])
                ys.append(100 * statistics.mean(avg))
                errs.append(100 * statistics.stdev(avg) if len(avg) > 1 else 0.0)
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=p["objective"])
    floor = per_seed_average([r for r in runs if r["objective"] == RANDOM], task_names)
    if floor:
        ax.axhline(100 * statistics.mean(floor), color="gray", linestyle="--", label="random init")
    ax.set_xscale("log")
    ax.set_xlabel("pre-training FLOPs (counted)")
    ax.set_ylabel(f"average dev score x100 ({', '.join(task_names)})")
    ax.grid(True, which="both", alpha=0.3)
    _cli.legend(ax)
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=120)


def plot_bars(results: dict, path: str) -> None:
    """PNG: dev score (x100) per task and their average, a bar per model (each objective at the
    full budget, random init), error bars the std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task_names, runs = results["tasks"], results["finetune"]
    models = [(p["objective"], p["steps"][-1]) for p in results["pretrain"]] + [(RANDOM, 0)]
    groups = [*task_names, "average"]
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, step) in enumerate(models):
        mine = [r for r in runs if r["objective"] == name and r["step"] == step]
        values = [[r["score"] for r in mine if r["task"] == t] for t in task_names]
        values.append(per_seed_average(mine, task_names))
        means = [100 * statistics.mean(v) if v else 0.0 for v in values]
        errs = [100 * statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
        xs = [g + (i - (len(models) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=name.replace("_", " "))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("dev score x100 (accuracy; MCC for CoLA; Spearman for STS-B)")
    ax.set_title(f"fine-tuned after {headline(results)}")
    ax.grid(True, axis="y", alpha=0.3)
    _cli.legend(ax)
    fig.tight_layout()
    _cli.save_figure(fig, path, dpi=120)


# ----------------------------------------------------------------------------------- run


@contextlib.contextmanager
def _cached_compilations(directory: str):
    """JAX's persistent compilation cache, for every program however fast it compiled: the
    fine-tuning runs of one task compile the same train and predict steps (seeds and
    checkpoints differ only in argument values), and each pre-training segment the same train
    step, so all but the first load them instead (~5 s saved a run on a CPU). The previous
    settings come back afterwards."""
    import jax

    settings = {
        "jax_compilation_cache_dir": directory,
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    before = {k: getattr(jax.config, k) for k in settings}
    for k, v in settings.items():
        jax.config.update(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)


def run(
    preset: dict,
    out: str,
    *,
    objectives=OBJECTIVES,
    tasks=None,
    seeds: int | None = None,
    corpus: str,
    glue_dir: str,
    log=None,
    until: str = "report",
) -> dict:
    """Pre-trains, fine-tunes and reports as the module docstring says; returns the results
    (also in OUT/results.json) with 'table' (markdown) and 'plot' (the PNG's path).

    until: "report" (all of it), "pretrain" (pre-train the objectives and return their records:
    no fine-tuning, no report, so that each objective's run can go in a process of its own into
    one `out`), "plan" (the same records without training: what a report of a sweep still
    pre-training reads) or "collect" (the plan plus every fine-tuning run that has finished in
    `out`, whichever process ran it; nothing is trained: what a report of a sweep split over
    processes, or cut short, reads)."""
    if until not in UNTIL:
        raise ValueError(f"until={until!r}: use one of {', '.join(UNTIL)}")
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    tasks = [glue_tasks.get_task(t).name for t in (tasks or preset["tasks"])]
    seeds = seeds or preset["seeds"]
    known = (*ALL_OBJECTIVES, *preset.get("variants", {}))
    for name in objectives:
        if name not in known:
            raise ValueError(f"objective {name!r}: use some of {', '.join(known)}")
    os.makedirs(out, exist_ok=True)
    with _cached_compilations(os.path.join(out, "jax_cache")):
        results = _run(preset, out, objectives, tasks, seeds, corpus, glue_dir, log, until)
    if until != "report":
        return results
    results["summary"] = summary(results)
    _write_json(os.path.join(out, "summary.json"), results["summary"])
    results["table"] = tables(results)
    results["plot"] = os.path.join(out, "sample_efficiency.png")
    plot(results, results["plot"])
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(results["table"] + "\n")
    _write_json(os.path.join(out, "results.json"), results)
    return results


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def work_seconds(results: dict) -> float:
    """The seconds the whole benchmark's work took: each pre-training (over all its calls) plus
    each fine-tuning run, the sweep's included, as each recorded them. A rerun that finds the
    work done reports the same figure; what lies between the runs (the report, the process
    start) is left out, a few seconds."""
    runs = {
        (r["objective"], r["step"], r["task"], r["seed"], r["learning_rate"]): r["elapsed_sec"]
        for r in results["finetune"] + results["sweep"]
    }
    return sum(p["seconds"] for p in results["pretrain"]) + sum(runs.values())


def summary(results: dict) -> dict:
    """The headline at the largest budget run: {"average": {model: mean over seeds of the
    average dev score over tasks, x100}, "std": {model: its std over seeds}, "pretrain_flops",
    "wall_seconds" (work_seconds)}, and "pretrain_steps" where the budget is in steps."""
    task_names, runs = results["tasks"], results["finetune"]
    last = results["fractions"][-1]
    rows = [(p["objective"], p["steps"][-1]) for p in results["pretrain"]] + [(RANDOM, 0)]
    average, std = {}, {}
    for name, step in rows:
        per_seed = per_seed_average(
            [r for r in runs if r["objective"] == name and r["step"] == step], task_names
        )
        if per_seed:
            average[name] = round(100 * statistics.mean(per_seed), 2)
            std[name] = round(100 * statistics.stdev(per_seed), 2) if len(per_seed) > 1 else 0.0
    out = {
        "average": average,
        "std": std,
        # The largest budget run (the whole budget unless the preset stops short of it).
        "pretrain_flops": results["budget_flops"] and results["budget_flops"] * last,
        "wall_seconds": round(work_seconds(results), 1),
    }
    if results.get("budget_steps"):
        out["pretrain_steps"] = round(results["budget_steps"] * last)
    return out


def _run(preset, out, objectives, tasks, seeds, corpus, glue_dir, log, until) -> dict:
    """Pre-training and fine-tuning, skipping what is done: the results without the report."""
    from electra_jax.data import shards

    if preset.get("in_domain"):
        corpus = in_domain_corpus(corpus, glue_dir, tasks, out)
    # One tokenizer for every objective, so they also share one prepared data cache.
    first = pretrain_config(preset, objectives[0], corpus, out)
    tokenizer_dir = os.path.join(out, "tokenizer")
    shards.ensure_tokenizer(first.data, tokenizer_dir, first.seed)

    results = {
        "preset": preset,
        "budget_flops": preset.get("budget_flops"),  # equal compute, or
        "budget_steps": preset.get("budget_steps"),  # equal steps
        "fractions": run_fractions(preset),  # those of this run (stop_fraction)
        "tasks": tasks,
        "seeds": seeds,
        "pretrain": [],
        "finetune": [],
        "sweep": [],  # with preset["learning_rates"]: seed 0 at each rate, the chosen one marked
    }
    # Pre-training first, so that every fine-tuning's compile cache and data are warm.
    workdirs = {}
    for name in objectives:
        config = pretrain_config(preset, name, corpus, out)
        config.data.tokenizer = tokenizer_dir
        info = {**plan(config, preset), "objective": name}  # a variant's name, not its objective
        workdirs[name] = os.path.join(out, "pretrain", name)
        if until in ("plan", "collect"):
            info["seconds"] = seconds_spent(workdirs[name])
        else:
            # preset["allow_changes"]: what the user let a resumed pre-training find changed
            # (compute_sweep --allow_change), e.g. a corpus copied anew with other file times.
            allow = preset.get("allow_changes", ())
            info["seconds"] = pretrain(config, workdirs[name], info["steps"], log, allow)
        info["config"] = config.to_dict()
        log(
            f"{name}: {info['flops_per_step']:.3g} FLOPs/step, checkpoints {info['steps']} "
            f"({info['seconds']:.0f}s of pre-training)"
        )
        results["pretrain"].append(info)
    if until not in ("report", "collect"):
        return results

    # The full budget first (every objective, then random init: the headline), then the
    # smaller budgets from the largest down, so that a sweep cut short has its most telling
    # readings; each run is independent of the others, so the order changes no number.
    by_budget = [
        [
            (p["objective"], p["steps"][i], f"{workdirs[p['objective']]}@{p['steps'][i]}")
            for p in results["pretrain"]
        ]
        for i in reversed(range(len(results["fractions"])))
    ]
    random_init = (RANDOM, 0, out)  # with_init's 'random' reads OUT/tokenizer
    starts = [*by_budget[0], random_init, *(s for budget in by_budget[1:] for s in budget)]
    pretrain_config_dict = results["pretrain"][0]["config"]
    rates = tuple(preset.get("learning_rates", ()))

    def one(name: str, step: int, init_from: str, task: str, seed: int, lr: float | None):
        run_name = f"{task}-seed{seed}" + (f"-lr{lr:g}" if lr is not None else "")
        where = os.path.join(out, "finetune", f"{name}-{step}", run_name)
        t0 = time.time()
        if until == "collect":
            r = finished(where)
            if r is None:
                return None
        else:
            fields = {**preset["finetune"], **preset.get("finetune_tasks", {}).get(task, {})}
            if lr is not None:
                fields["learning_rate"] = lr
            config = glue.glue_config(task, seed, os.path.join(glue_dir, task), fields)
            init = "random" if name == RANDOM else "pretrained"
            config = glue.with_init(config, init, init_from, pretrain_config_dict)
            r = finetune(config, where)
        log(
            f"{name}@{step} {task} seed {seed}{f' lr {lr:g}' if lr else ''}: "
            f"{r['score_metric']} {r['score']:.4f} ({time.time() - t0:.1f}s)"
        )
        return {
            "objective": name,
            "step": step,
            "task": task,
            "seed": seed,
            "learning_rate": r["learning_rate"],
            "score": r["score"],
            "score_metric": r["score_metric"],
            "elapsed_sec": r["elapsed_sec"],
        }

    partial = os.path.join(out, "results.partial.json")
    for name, step, init_from in starts:
        # What is done so far, for a report of a run cut short (compute_sweep --report_only).
        if until == "report":
            _write_json(partial, results)
        for task in tasks:
            lr = None
            if len(rates) > 1:
                # The sweep: seed 0 at every rate; the best on dev serves every seed. The same
                # rule for every objective and for random init.
                sweep = [one(name, step, init_from, task, 0, r) for r in rates]
                if None in sweep:  # collecting, and seed 0's sweep is not complete: no choice yet
                    results["sweep"].extend(dict(r, chosen=False) for r in sweep if r)
                    continue
                best = max(sweep, key=lambda row: row["score"])
                lr = rates[sweep.index(best)]
                results["sweep"].extend(dict(row, chosen=row is best) for row in sweep)
                results["finetune"].append(best)
                seeds_left = range(1, seeds)
            else:
                lr = rates[0] if rates else None
                seeds_left = range(seeds)
            for seed in seeds_left:
                row = one(name, step, init_from, task, seed, lr)
                if row is not None:
                    results["finetune"].append(row)
    if until == "report":
        _write_json(partial, results)
    return results


def check_inputs(corpus: str, glue_dir: str) -> None:
    """One line, before any run, when --corpus or --glue_dir is missing, --corpus matches no
    file or --glue_dir is no folder."""
    _cli.matches("--corpus", corpus, CORPUS_HELP)
    _cli.directory("--glue_dir", glue_dir, GLUE_HELP)


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="where every run goes; a rerun continues it")
    ap.add_argument("--objectives", default="", help="comma-separated; '' = the preset's")
    ap.add_argument("--tasks", default="", help="comma-separated; '' = the preset's")
    ap.add_argument("--seeds", type=_cli.natural_int, default=0, help="0 = the preset's")
    ap.add_argument("--corpus", help=CORPUS_HELP)
    ap.add_argument("--glue_dir", help=GLUE_HELP)
    args = ap.parse_args(argv)
    started = time.time()
    preset = PRESETS[args.preset]
    known = (*ALL_OBJECTIVES, *preset.get("variants", {}))
    objectives = args.objectives or ",".join(preset.get("objectives", OBJECTIVES))
    objectives = _cli.names("--objectives", objectives, known, "objectives")
    tasks = _cli.glue_tasks("--tasks", args.tasks) if args.tasks else None
    check_inputs(args.corpus, args.glue_dir)
    # A run that refuses to resume (its settings or corpus changed), or a workdir another
    # process holds: one line, as for a bad flag.
    with _cli.failures(f"--out {args.out}"):
        results = run(
            preset,
            args.out,
            objectives=objectives,
            tasks=tasks,
            seeds=args.seeds or None,
            corpus=args.corpus,
            glue_dir=args.glue_dir,
        )
    print(results["table"])
    print(f"\nplot: {results['plot']}  ({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    _cli.run(main)
