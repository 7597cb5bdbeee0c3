r"""Which pre-training recipe keeps the discriminator off the prior at small compute.

    python -m benchmarks.studies.recipe_study.recipe_study --out=runs/recipe \
        --settings=default,lr3e-4 --seeds=0,1
    python -m benchmarks.studies.recipe_study.recipe_study --out=runs/all \
        --join=runs/recipe,runs/recipe2  # one report

Pre-trains configs/tiny.py (the default first run: 4 x 128 discriminator, 600 steps of 32 x 128
tokens on the builtin corpus) once per setting and seed, each setting a set of config overrides
(SETTINGS below), all on the same tokenizer, prepared rows and held-out slice, and reads the
held-out evaluation (docs/evaluation.md) they log every 60 steps: the discriminator's AUC, its
AUC over frequent pieces (the reading of context), its loss against the prior's entropy, and the
collapse cosine of its states. `--base=small-data` runs the small-data preset's model and corpus
instead (benchmarks/studies/sample_efficiency/, preset small-data-cpu: the shared corpus plus the
GLUE tasks' training sentences, 2 x 128, 64 tokens), `--base=sweep` the compute sweep's ELECTRA run
(benchmarks/studies/compute_sweep/: tiny.py's shape on that corpus, 10,378 steps to 3e14 counted
FLOPs, read every 1,036 steps), `--steps` changes the number of steps and `--stop_after` ends each
run early with its schedule unchanged (the first part of a long run).

It writes OUT/results.json (every evaluation row of every run, with the counted FLOPs per step),
OUT/table.md (per setting: the final readings as mean +- std over seeds, the targets met, and
the largest fall of the 3-evaluation moving average of AUC below its running maximum) and
OUT/recipe_study.png (AUC, frequent AUC, loss gain and cosine against counted FLOPs, a band over
seeds per setting). Rerunning with the same --out skips the runs that finished.
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import time

from benchmarks import _cli
from benchmarks.studies.compute_sweep import compute_sweep
from benchmarks.studies.sample_efficiency import sample_efficiency

# electra_jax's pretraining and checkpointing modules import jax (seconds): the functions that
# use them import them, so that a refusal of a bad flag is not kept waiting.

# benchmarks/studies/recipe_study/recipe_study.py: the repository is three folders up.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The paper's learning rate and zero-initialised head, under every setting.
PAPER = {"train.learning_rate": 1e-3, "train.rtd_prior_init": False}

# Each setting: config overrides on top of the base config ('section.key': value).
SETTINGS: dict[str, dict] = {
    "default": {},
    "lr3e-4": {"train.learning_rate": 3e-4},
    "lr1e-4": {"train.learning_rate": 1e-4},
    "lr3e-4-mask0.3-T2": {
        "train.learning_rate": 3e-4,
        "objective.mask_prob": 0.3,
        "objective.temperature": 2.0,
    },
    # A temperature that starts high and comes down to 1 over the run (Fast-ELECTRA's idea).
    "Tsched3": {"objective.temperature_start": 3.0, "objective.temperature_steps": 600},
    "lr3e-4-Tsched3": {
        "train.learning_rate": 3e-4,
        "objective.temperature_start": 3.0,
        "objective.temperature_steps": 600,
    },
    # Embedding sharing: the generator's MLM gradient reaches the discriminator's embeddings
    # ('electra'), only through stop_gradient deltas ('gdes'), or not at all ('none').
    "share-none": {"model.embedding_sharing": "none"},
    "share-gdes": {"model.embedding_sharing": "gdes"},
    "lr3e-4-share-none": {"train.learning_rate": 3e-4, "model.embedding_sharing": "none"},
    # A discriminator at a learning rate that keeps its states apart, a generator at one that
    # lets it learn (train.generator_lr_scale: the generator's rate over the discriminator's).
    "lr1e-4-glr10": {"train.learning_rate": 1e-4, "train.generator_lr_scale": 10.0},
    "lr2e-4-glr5": {"train.learning_rate": 2e-4, "train.generator_lr_scale": 5.0},
    "lr1e-4-glr10-dmlm1": {
        "train.learning_rate": 1e-4,
        "train.generator_lr_scale": 10.0,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_mlm_steps": 600,
    },
    "lr2e-4-glr5-dmlm1": {
        "train.learning_rate": 2e-4,
        "train.generator_lr_scale": 5.0,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_mlm_steps": 600,
    },
    "lr1e-4-glr10-dmlm3": {
        "train.learning_rate": 1e-4,
        "train.generator_lr_scale": 10.0,
        "objective.disc_mlm_weight": 3.0,
        "objective.disc_mlm_steps": 600,
    },
    # The discriminator's MLM term dominant at first (20 x ~7 nats against 50 x ~0.4).
    "lr3e-4-glr3-dmlm20": {
        "train.learning_rate": 3e-4,
        "train.generator_lr_scale": 3.0,
        "objective.disc_mlm_weight": 20.0,
        "objective.disc_mlm_steps": 600,
    },
    # The replaced-token head starts at the prior's logit (train.rtd_prior_init).
    "prior": {"train.rtd_prior_init": True},
    "lr3e-4-prior": {"train.learning_rate": 3e-4, "train.rtd_prior_init": True},
    "lr3e-4-glr3-prior": {
        "train.learning_rate": 3e-4,
        "train.generator_lr_scale": 3.0,
        "train.rtd_prior_init": True,
    },
    "lr1e-4-prior": {"train.learning_rate": 1e-4, "train.rtd_prior_init": True},
    "lr2e-4-prior": {"train.learning_rate": 2e-4, "train.rtd_prior_init": True},
    # A discriminator that learns faster than its generator (generator_lr_scale below 1): for
    # the long runs (--base=sweep), where the generator catches up with the low rates above.
    "lr1e-4-glr0.1-prior": {
        "train.learning_rate": 1e-4,
        "train.generator_lr_scale": 0.1,
        "train.rtd_prior_init": True,
    },
    # The same with the generator's own embeddings: shared ones learn at the discriminator's
    # rate, and through them (the MLM head reads them too) the generator learns the unigram.
    "lr1e-4-glr0.1-prior-share-none": compute_sweep.SLOW_GENERATOR,
    "lr2.5e-5-glr0.25-prior": {
        "train.learning_rate": 2.5e-5,
        "train.generator_lr_scale": 0.25,
        "train.rtd_prior_init": True,
    },
    # Replacements from the corpus's unigram distribution in every slot (objective.unigram_share):
    # none can be told by its rarity, so the discriminator learns context or nothing; the
    # generator still trains (its MLM loss), unused. At the tiny recipe's rate, and higher.
    "lr1e-4-prior-uni1": {
        "train.learning_rate": 1e-4,
        "train.rtd_prior_init": True,
        "objective.unigram_share": 1.0,
    },
    "lr1e-3-prior-uni1": {
        "train.learning_rate": 1e-3,
        "train.rtd_prior_init": True,
        "objective.unigram_share": 1.0,
    },
    "lr2.5e-5-prior-uni1": {
        "train.learning_rate": 2.5e-5,
        "train.rtd_prior_init": True,
        "objective.unigram_share": 1.0,
    },
    # Lower still: the generator learns the unigram later, so the fall may start later.
    "lr5e-5-prior": {"train.learning_rate": 5e-5, "train.rtd_prior_init": True},
    "lr2.5e-5-prior": {"train.learning_rate": 2.5e-5, "train.rtd_prior_init": True},
    # BERT's MLM alone on the discriminator-sized network: does it learn at these rates?
    "mlm-lr1e-3": {"objective.name": "mlm"},
    "mlm-lr3e-4": {"objective.name": "mlm", "train.learning_rate": 3e-4},
    # The discriminator also predicts the masked tokens, a term that fades out over the run.
    "dmlm1": {"objective.disc_mlm_weight": 1.0, "objective.disc_mlm_steps": 600},
    "lr3e-4-dmlm1": {
        "train.learning_rate": 3e-4,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_mlm_steps": 600,
    },
    # The same term kept for the whole run at MLM's own rate (the only objective whose probe
    # moves at the sweep's budgets), with the replaced-token loss at a smaller weight: does
    # detection on top of the MLM signal add to it, at the same counted FLOPs?
    "lr1e-3-prior-dmlm1c-dw10": {
        "train.rtd_prior_init": True,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_weight": 10.0,
    },
    "lr1e-3-prior-dmlm1c-dw1": {
        "train.rtd_prior_init": True,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_weight": 1.0,
    },
    # ELECTRA plus BERT's MLM on the discriminator (objective 'electra_mlm': a second pass over
    # the masked ids), at MLM's rate, the replaced-token weight at 10 (DeBERTa-v3's) and 50.
    "emlm-lr1e-3-prior-dw10": {
        "objective.name": "electra_mlm",
        "train.rtd_prior_init": True,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_weight": 10.0,
    },
    "emlm-lr1e-3-prior-dw50": {
        "objective.name": "electra_mlm",
        "train.rtd_prior_init": True,
        "objective.disc_mlm_weight": 1.0,
    },
    "lr3e-4-dmlm1-Tsched3": {
        "train.learning_rate": 3e-4,
        "objective.disc_mlm_weight": 1.0,
        "objective.disc_mlm_steps": 600,
        "objective.temperature_start": 3.0,
        "objective.temperature_steps": 600,
    },
}

# The default run's targets (the readings at the last step).
TARGETS = {
    "disc_auc": (">=", 0.80),
    "disc_auc_frequent": (">=", 0.70),
    "disc_loss_gain": (">=", 0.10),
    "collapse_cosine": ("<=", 0.60),
}
SHOWN = compute_sweep.READINGS


def base_config(base: str, out: str, corpus: str | None = None, glue_dir: str | None = None):
    """The base config of the study (tiny.py, or the small-data preset's model) with the shared
    tokenizer and prepared rows of OUT/shared, made by the first run. The bases 'small-data' and
    'sweep' pre-train on the corpus glob `corpus` and the GLUE training sentences in `glue_dir`
    ('tiny' on the builtin corpus)."""
    if base == "sweep":
        return _sweep_config(out, corpus, glue_dir)
    config = runpy.run_path(os.path.join(ROOT, "configs", "tiny.py"))["get_config"]()
    # Every setting is measured against the paper's recipe on tiny.py's shape, which tiny.py ran
    # before it took this study's winner (lr2.5e-5-prior): the settings' names stay true.
    apply(config, PAPER)
    if base == "small-data":
        preset = sample_efficiency.PRESETS["small-data-cpu"]
        corpus = sample_efficiency.in_domain_corpus(
            corpus, glue_dir, preset["tasks"], os.path.join(out, "corpus")
        )
        apply(config, {**preset["pretrain"], "data.source": f"text:{corpus}"})
        apply(config, {"data.heldout_examples": 512, "train.num_steps": 1900})
        apply(config, {"train.warmup_steps": 95, "checkpoint.every_steps": 1900})
    with config.unlocked():
        config.data.cache_dir = os.path.join(out, "shared", "cache")
        config.checkpoint.keep = 1
    return config


def _sweep_config(out: str, corpus: str, glue_dir: str):
    """The compute sweep's ELECTRA run (benchmarks/studies/compute_sweep/, preset cpu: tiny.py's
    shape on the in-domain corpus, a vocabulary of 8192, 3e14 counted FLOPs in 10,378 steps) under
    the paper's recipe, read every 1,036 steps; its corpus, tokenizer and prepared rows in OUT,
    made as the sweep makes its own (the same text and seed: the same pieces and rows)."""
    from electra_jax.data import shards

    preset = compute_sweep.PRESETS["cpu"]
    corpus = sample_efficiency.in_domain_corpus(corpus, glue_dir, preset["tasks"], out)
    config = sample_efficiency.pretrain_config(preset, "electra", corpus, out)
    sample_efficiency.plan(config, preset)
    tokenizer = os.path.join(out, "tokenizer")
    shards.ensure_tokenizer(config.data, tokenizer, config.seed)
    apply(config, PAPER)
    apply(config, {"data.tokenizer": tokenizer, "eval.every_steps": 2 * config.log.every_steps})
    apply(config, {"checkpoint.every_steps": config.train.num_steps, "checkpoint.keep": 2})
    return config


def own_budget(config) -> None:
    """On the sweep's base, a setting with an objective other than 'electra' gets the schedule
    of its own 3e14 counted FLOPs (steps, warm-up 10%), as compute_sweep gives MLM its own:
    'electra_mlm''s second pass makes its step 1.9x ELECTRA's, so its run is 5,421 steps and
    its warm-up ends at step 542, not 1,037. The readings stay every 1,036 steps. ('electra'
    with its discriminator MLM term keeps ELECTRA's 10,378 steps, as those runs were measured.)"""
    every = config.eval.every_steps
    sample_efficiency.plan(config, compute_sweep.PRESETS["cpu"])
    apply(config, {"eval.every_steps": every, "checkpoint.keep": 2})


def apply(config, overrides: dict) -> None:
    """Sets 'section.key' overrides on a ConfigDict (an unknown key is an error)."""
    for key, value in overrides.items():
        section, name = key.split(".")
        if name not in config[section]:
            raise KeyError(f"{key} is not a config key")
        with config.unlocked():
            config[section][name] = value


def _finished(workdir: str, num_steps: int) -> bool:
    from electra_jax.pretraining import metrics

    rows = metrics.read_rows(os.path.join(workdir, "metrics.jsonl"))
    return bool(rows) and rows[-1]["step"] >= num_steps


def run_one(config, workdir: str, stop_after: int = 0) -> dict:
    """Trains (or finds finished) one run, to `stop_after` when given (the schedule stays the
    whole run's); returns its held-out rows and counted FLOPs."""
    from electra_jax.pretraining import metrics, program, runner, scoring

    last = stop_after or config.train.num_steps
    if not _finished(workdir, last):
        t0 = time.time()
        row = runner.train(config, workdir, stop_after=stop_after or None)
        seconds = time.time() - t0
        if "preempted_at" in row:  # SIGTERM / Ctrl-C: the run saved; the study stops too
            sys.exit(f"stopped at step {row['preempted_at']} of {workdir}; rerun to continue")
    else:
        seconds = None
    spec, _, _, _, slots = program.build(config, config.data.vocab_size)
    flops = metrics.count_flops(
        spec, config.train.batch_size, config.data.seq_length, slots, config.objective.name
    )["total"]
    rows = scoring.read_rows(workdir)
    # A run stopped by a signal saves and returns: it is reported once it has finished.
    finished = _finished(workdir, last)
    return {"flops_per_step": flops, "rows": rows, "seconds": seconds, "finished": finished}


def fallback(values: list[float]) -> float:
    """The largest fall of the 3-point moving average below its running maximum (0: none)."""
    smooth = [statistics.fmean(values[max(0, i - 2) : i + 1]) for i in range(len(values))]
    worst, best = 0.0, float("-inf")
    for v in smooth:
        best = max(best, v)
        worst = max(worst, best - v)
    return worst


def _final(run: dict, key: str):
    from electra_jax.pretraining import scoring

    return run["rows"][-1].get(scoring.PREFIX + key)


def table(results: dict) -> str:
    from electra_jax.pretraining import scoring

    lines = [
        "| setting | seeds | " + " | ".join(SHOWN) + " | AUC fall | targets met |",
        "|---" * (len(SHOWN) + 4) + "|",
    ]
    for name, runs in results["settings"].items():
        runs = [r for r in runs.values() if r["rows"] and r.get("finished", True)]
        if not runs:
            continue
        cells = []
        for key in SHOWN:
            values = [_final(r, key) for r in runs if _final(r, key) is not None]
            if not values:
                cells.append("-")
                continue
            mean = statistics.fmean(values)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{mean:.3f} +- {std:.3f}")
        aucs = [[r.get(scoring.PREFIX + "disc_auc") for r in run["rows"]] for run in runs]
        falls = [fallback(a) for a in aucs if None not in a] or [float("nan")]
        met = []
        for key, (op, bound) in TARGETS.items():
            values = [_final(r, key) for r in runs]
            ok = all(v is not None and (v >= bound if op == ">=" else v <= bound) for v in values)
            met.append(key if ok else "")
        shown = ", ".join(m for m in met if m) or "none"
        lines.append(
            f"| {name} | {len(runs)} | " + " | ".join(cells) + f" | {max(falls):.3f} | {shown} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str, only: list[str] | None = None) -> None:
    """The four readings against counted FLOPs, a line per setting (those in `only` if given)."""
    import matplotlib

    from electra_jax.pretraining import scoring

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("disc_auc", "disc_auc_frequent", "disc_loss_gain", "collapse_cosine")
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4))
    for name, runs in results["settings"].items():
        runs = [r for r in runs.values() if r["rows"] and r.get("finished", True)]
        if not runs or (only and name not in only):
            continue
        for ax, key in zip(axes, keys, strict=True):
            steps = [row["step"] for row in runs[0]["rows"]]
            series = [[row.get(scoring.PREFIX + key) for row in r["rows"]] for r in runs]
            if any(None in s for s in series):
                continue  # a reading this objective does not have (MLM: no discriminator)
            n = min(len(s) for s in series)
            x = [s * runs[0]["flops_per_step"] for s in steps[:n]]
            cols = [[s[i] for s in series] for i in range(n)]
            mean = [statistics.fmean(c) for c in cols]
            (line,) = ax.plot(x, mean, label=name)
            ax.fill_between(
                x, [min(c) for c in cols], [max(c) for c in cols], alpha=0.2, color=line.get_color()
            )
    drawn = _cli.drew(fig)  # before the targets' reference lines
    for ax, key in zip(axes, keys, strict=True):
        ax.set_title(f"held-out {key}")
        ax.set_xlabel("counted pre-training FLOPs")
        if key in TARGETS:
            ax.axhline(TARGETS[key][1], color="grey", linestyle=":")
    _cli.legend(axes[0], fontsize=7)
    fig.tight_layout()
    _cli.save_figure(fig, path, drawn=drawn, dpi=110)


def joined(folders: list[str]) -> dict:
    """The runs of several studies' results.json as one (a later folder's run of a setting and
    seed replaces an earlier's); folders without results are skipped."""
    out = {"settings": {}, "base": None}
    for folder in folders:
        path = os.path.join(folder, "results.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            found = json.load(f)
        out["base"] = out["base"] or found.get("base")
        for name, runs in found["settings"].items():
            out["settings"].setdefault(name, {}).update(runs)
    return out


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main(argv=None) -> None:
    parser = _cli.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--base", choices=("tiny", "small-data", "sweep"), default="tiny")
    parser.add_argument(
        "--corpus", help="with --base=small-data or sweep: " + sample_efficiency.CORPUS_HELP
    )
    parser.add_argument(
        "--glue_dir", help="with --base=small-data or sweep: " + sample_efficiency.GLUE_HELP
    )
    parser.add_argument(
        "--stop_after",
        type=_cli.natural_int,
        default=0,
        help="end each run at this step, its schedule unchanged (0: at its last)",
    )
    parser.add_argument(
        "--steps", type=_cli.natural_int, default=0, help="train.num_steps (0: the base's)"
    )
    parser.add_argument(
        "--join", default="", help="OUT folders of earlier studies to report with this one"
    )
    parser.add_argument(
        "--plot_settings", default="", help="the settings drawn in the plot (default: all)"
    )
    args = parser.parse_args(argv)
    if args.join:
        folders = [*(f for f in args.join.split(",") if f), args.out]
        results = joined(_cli.each_once("--join", folders, key=os.path.realpath))
        os.makedirs(args.out, exist_ok=True)
        _write_json(os.path.join(args.out, "results.json"), results)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(table(results))
        only = _cli.each_once("--plot_settings", [n for n in args.plot_settings.split(",") if n])
        plot(results, os.path.join(args.out, "recipe_study.png"), only)
        print(table(results))
        return
    names = _cli.names("--settings", args.settings, tuple(SETTINGS), "settings")
    if not all(s.strip().isascii() and s.strip().isdigit() for s in args.seeds.split(",")):
        parser.error(f"argument --seeds: {args.seeds!r}: give whole numbers >= 0, e.g. 0,1")
    seeds = _cli.each_once("--seeds", [int(s) for s in args.seeds.split(",")])
    if args.base != "tiny":
        sample_efficiency.check_inputs(args.corpus, args.glue_dir)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results = {"settings": {}, "base": args.base}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    for name in names:
        for seed in seeds:
            config = base_config(args.base, args.out, args.corpus, args.glue_dir)
            apply(config, SETTINGS[name])
            if args.base == "sweep" and config.objective.name != "electra":
                own_budget(config)
            if args.steps:
                apply(config, {"train.num_steps": args.steps})
            with config.unlocked():
                config.seed = seed
            workdir = os.path.join(args.out, "runs", f"{name}-seed{seed}")
            print(f"== {name} seed {seed}: {SETTINGS[name]}", file=sys.stderr, flush=True)
            run = run_one(config, workdir, args.stop_after)
            run["overrides"] = SETTINGS[name]
            results["settings"].setdefault(name, {})[str(seed)] = run
            _write_json(path, results)
            with open(os.path.join(args.out, "table.md"), "w") as f:
                f.write(table(results))
    plot(results, os.path.join(args.out, "recipe_study.png"))
    print(table(results))


if __name__ == "__main__":
    _cli.run(main)
