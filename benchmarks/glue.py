r"""GLUE dev scores fine-tuned from a pre-training workdir and from random init, as a table.

    python benchmarks/glue.py --workdir=runs/small --data_dir=glue_data --seeds=3 \
        --out=runs/glue-bench

For each task (SST-2, MRPC, STS-B, CoLA, RTE by default) and each of --seeds seeds, fine-tunes
configs/glue.py twice: from the workdir's newest checkpoint (or step STEP's, with
--workdir=WORKDIR@STEP), and from random weights of the same shape with the same tokenizer (the
baseline that shows what pre-training bought). Prints a
markdown table of the headline dev metric (Matthews correlation for CoLA, Spearman for STS-B,
accuracy otherwise; the ELECTRA paper's choice), mean +- standard deviation over seeds, and
writes every run's eval_results.json under --out plus all of them in --out/glue_benchmark.json.

On CPU cap the training sets, e.g. --max_train_examples=2000 --tasks=RTE,MRPC; the ELECTRA paper
reports medians of 10 seeds for the small GLUE tasks, whose dev scores vary by points per seed.
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402
from electra_jax.finetune import tasks  # noqa: E402
from electra_jax.store import checkpoint_steps, jsonio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TASKS = "SST-2,MRPC,STS-B,CoLA,RTE"
# The model fields a random-init run copies from the pre-training run's config.json.
_SHAPE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "embedding_size",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
)


def glue_config(task: str, seed: int, data_dir: str, fields: dict | None = None):
    """configs/glue.py for `task` and `seed` with `fields` (configs/glue.py's top-level keys)
    set; the init is chosen by `with_init`."""
    config = runpy.run_path(os.path.join(ROOT, "configs", "glue.py"))["get_config"]()
    config.task, config.data_dir, config.seed = task, data_dir, seed
    for key, value in (fields or {}).items():
        config[key] = value
    return config


def with_init(config, init: str, workdir: str, pretrain_config: dict):
    """Sets where `config` starts: init 'pretrained' fine-tunes `workdir` (any init_from path,
    e.g. 'WORKDIR@STEP'); 'random' the same network shape and tokenizer, untrained (`workdir`
    then names the pre-training workdir whose tokenizer/ is used; pretrain_config is its
    config.json)."""
    if init == "pretrained":
        config.init_from = workdir
    else:  # the same network and tokenizer, untrained
        config.tokenizer = os.path.join(checkpoint_steps.split_step(workdir)[0], "tokenizer")
        for key in _SHAPE_FIELDS:
            config.model[key] = pretrain_config["model"][key]
    return config


def run_config(args, task: str, seed: int, init: str, pretrain_config: dict):
    """configs/glue.py for one run; init is 'pretrained' or 'random'."""
    fields = {"max_train_examples": args.max_train_examples}
    if args.num_epochs:
        fields["num_epochs"] = args.num_epochs
    if args.seq_length:
        fields["seq_length"] = args.seq_length
    fields["log_every_steps"] = args.log_every_steps
    config = glue_config(task, seed, args.data_dir, fields)
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or key not in config:
            raise ValueError(f"{item!r}: give KEY=VALUE, KEY a key of configs/glue.py")
        current = config[key]
        if isinstance(current, bool):
            config[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(current, str):
            config[key] = value
        else:
            try:
                config[key] = type(current)(value)
            except (TypeError, ValueError):
                raise ValueError(f"{item!r}: {key} takes {type(current).__name__} values") from None
    return with_init(config, init, args.workdir, pretrain_config)


def summary(values: list[float]) -> str:
    """'mean +- std' in points (x100), or the single value."""
    pts = [100 * v for v in values]
    if len(pts) == 1:
        return f"{pts[0]:.1f}"
    return f"{statistics.mean(pts):.1f} +- {statistics.stdev(pts):.1f}"


def table(results: list[dict], inits: list[str]) -> str:
    """Markdown: one row per task, one column per init, the headline metric over seeds."""
    head = "| task | metric | " + " | ".join(f"{i} init" for i in inits) + " | seeds | steps |"
    lines = [head, "|" + "---|" * (4 + len(inits))]
    for task in dict.fromkeys(r["task"] for r in results):
        rows = [r for r in results if r["task"] == task]
        cells = [summary([r["score"] for r in rows if r["init"] == i]) for i in inits]
        seeds = len({r["seed"] for r in rows})
        lines.append(
            f"| {task} | {rows[0]['score_metric']} | "
            + " | ".join(cells)
            + f" | {seeds} | {rows[0]['steps']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workdir",
        required=True,
        help="a pre-training workdir (config.json, ...); WORKDIR@STEP: its checkpoint STEP",
    )
    ap.add_argument("--data_dir", required=True, help="GLUE's root: one folder of TSVs per task")
    ap.add_argument("--out", required=True, help="where each run's workdir goes")
    ap.add_argument("--tasks", default=DEFAULT_TASKS)
    ap.add_argument("--seeds", type=_cli.positive_int, default=3)
    ap.add_argument("--inits", default="pretrained,random")
    ap.add_argument(
        "--max_train_examples", type=_cli.natural_int, default=0, help="0: the whole training set"
    )
    ap.add_argument(
        "--num_epochs", type=_cli.natural_float, default=0.0, help="0: the task's (3, or 10)"
    )
    ap.add_argument("--seq_length", type=_cli.natural_int, default=0, help="0: glue.py's 128")
    ap.add_argument("--log_every_steps", type=_cli.positive_int, default=100)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configs/glue.py field in every run, e.g. --set learning_rate=2e-4",
    )
    args = ap.parse_args()
    from electra_jax.finetune import checks

    workdir, step = checkpoint_steps.split_step(args.workdir)
    _cli.directory("--workdir", workdir, "a pre-training workdir (electra_jax.train's)")
    record = os.path.join(workdir, "config.json")
    if not os.path.isfile(record):
        ap.error(f"--workdir {workdir} has no config.json; give a pre-training workdir")
    if step is not None and step not in (steps := checkpoint_steps.saved_steps(workdir)):
        ap.error(
            f"--workdir {args.workdir}: {checkpoint_steps.checkpoint_dir(workdir)} has no "
            f"checkpoint of step {step}; it has {', '.join(map(str, steps)) or 'none'}"
        )
    _cli.directory("--data_dir", args.data_dir, "GLUE's root: one folder of TSVs per task")
    with _cli.failures(record, also=(OSError, ValueError)), open(record) as f:
        pretrain_config = json.load(f)
    if isinstance(pretrain_config, dict) and "family" in pretrain_config:
        ap.error(
            f"--workdir {workdir} is a fine-tuning workdir (family "
            f"{pretrain_config['family']!r}); give the pre-training workdir it started from"
        )
    inits = _cli.names("--inits", args.inits, ("pretrained", "random"), "inits")
    task_names = _cli.glue_tasks("--tasks", args.tasks)
    _cli.settings("--set", args.set)
    # Every run's config is checked, and every task's files found, before the first run: a bad
    # setting or a missing file of the last task must not wait for the others to be trained.
    for task in task_names:
        for init in inits:
            with _cli.failures("--set", also=(ValueError,)):
                try:
                    checks.check_config(run_config(args, task, 0, init, pretrain_config))
                except (KeyError, TypeError) as e:  # the record lacks a model field
                    ap.error(
                        f"--workdir {record} is not a pre-training run's record (no model.{e})"
                    )
    for task in task_names:
        with _cli.failures("--data_dir"):
            tasks.check_tsv_files(tasks.get_task(task), args.data_dir)
    # Here, after every check: a refusal is not kept waiting for jax, flax and orbax.
    from electra_jax.finetune import loop

    results = []
    for task in task_names:
        for seed in range(args.seeds):
            for init in inits:
                workdir = os.path.join(args.out, f"{task}-{init}-seed{seed}")
                started = time.time()
                out = loop.finetune(run_config(args, task, seed, init, pretrain_config), workdir)
                out = dict(out, init=init, wall_sec=time.time() - started)
                results.append(out)
                print(
                    f"{task} {init} seed {seed}: {out['score_metric']} {out['score']:.4f} "
                    f"({out['steps']} steps, {out['wall_sec']:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
    os.makedirs(args.out, exist_ok=True)
    jsonio.write_json(
        os.path.join(args.out, "glue_benchmark.json"),
        {"workdir": args.workdir, "args": vars(args), "runs": results},
    )
    print(table(results, inits))


if __name__ == "__main__":
    _cli.run(main)
