r"""Pre-trains ELECTRA-Small on the carried corpus, then fine-tunes GLUE from it and random init.

    python benchmarks/gpu_quality.py --data=.gpu_data --out=$OUT       # the GPU machine
    python benchmarks/gpu_quality.py --data=.gpu_data --out=/tmp/q --cpu --parallel=2  # tiny

The quality part of benchmarks/gpu.sh. Reads what benchmarks/gpu_data.py prepared (tokenizer,
shards, GLUE files: nothing is tokenized for pre-training here), stages the corpus at the path
the shards' content key names, and runs the command-line tools only:

  1. `python -m electra_jax.train --config=configs/gpu_quality.py` (the recipe; --config) for
     train.num_steps (--steps; 0: the config's), in bfloat16, with held-out evaluation; at
     --pretrain_seconds it is sent SIGTERM, saves and stops, and fine-tuning starts from there;
  2. `python -m electra_jax.finetune --config=configs/glue.py` on each of --tasks, seed 0, from
     the pre-trained workdir and from random weights of the same shape with the same tokenizer,
     --parallel runs at a time on the one device (each takes 0.8/parallel of its memory), until
     --finetune_seconds, with the recipe file's FINETUNE fields (caps on big training sets).

OUT/h200_quality.json is rewritten (atomically) as each piece is known, so a run cut short
still holds what it measured: `pretrain_flops` (counted FLOPs per step x steps done),
`pretrain_seconds` (the train command's wall time, compile and evaluations included), `tokens`,
`disc_auc` (the last held-out reading), `eval` (every held-out reading), and `electra` and
`random_init`: each task's dev score x 100 (accuracy; Matthews correlation for CoLA, Spearman
for STS-B) and their `average` once every task has one; `gain` is electra's average minus
random init's. OUT/pretrain_metrics.jsonl is the pre-training's metrics.jsonl. Logs stay in
--workdir (default: a new folder in /tmp); failures print their last lines.

--cpu shrinks everything to seconds on a CPU (a 2-layer, 64-wide model, 8 steps, 32 training
examples per task) to test the plumbing; its scores mean nothing.
"""

from __future__ import annotations

import os

# This process plans and watches; jax (the FLOP count, the content key) stays on the CPU so
# that the accelerator's memory is left to the commands it starts.
_CHILD_ENV = dict(os.environ)
os.environ["JAX_PLATFORMS"] = "cpu"

import contextlib  # noqa: E402
import json  # noqa: E402
import runpy  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli, gpu_data  # noqa: E402

ROOT = gpu_data.ROOT
INITS = ("electra", "random_init")
# --cpu: tests/micro.py's model on the prepared rows, and a handful of fine-tuning examples.
CPU_PRETRAIN = {
    "model.hidden_size": 64,
    "model.num_layers": 2,
    "model.num_heads": 2,
    "model.intermediate_size": 128,
    "model.embedding_size": 32,
    "train.batch_size": 8,
    "data.heldout_examples": 32,
    "log.every_steps": 4,
    "train.steps_per_call": 1,  # a single step compiles several times faster on a CPU
}
CPU_STEPS = 8
CPU_FINETUNE = {"max_train_examples": 32, "num_epochs": 1.0, "seq_length": 64}
# The held-out readings kept in the summary (metrics.jsonl has them all).
EVAL_KEYS = ("disc_auc", "disc_auc_frequent", "disc_loss_gain", "collapse_cosine", "gen_accuracy")


class Summary:
    """OUT/h200_quality.json, rewritten whole after every change."""

    def __init__(self, path: str, fields: dict):
        self.path, self.data = path, fields
        self.save()

    def update(self, **fields) -> None:
        self.data.update(fields)
        self.save()

    def save(self) -> None:
        gpu_data.write_json(self.path, self.data)


def pretrain_overrides(config, manifest: dict, data_dir: str, source: str, steps: int, cpu: bool):
    """The flags that point configs/gpu_quality.py at the carried data, and size the run."""
    overrides = dict(CPU_PRETRAIN) if cpu else {}
    overrides.update(
        {
            "data.source": source,
            "data.cache_dir": os.path.join(data_dir, "shards"),
            "data.tokenizer": os.path.join(data_dir, "tokenizer"),
            "data.vocab_size": manifest["vocab_size"],
            "data.seq_length": manifest["seq_length"],
        }
    )
    steps = steps or (CPU_STEPS if cpu else int(config.train.num_steps))
    share = steps / config.train.num_steps  # warm-up and evaluation keep their share
    log_every = int(overrides.get("log.every_steps", config.log.every_steps))
    overrides["train.num_steps"] = steps
    overrides["train.warmup_steps"] = max(1, round(config.train.warmup_steps * share))
    every = round(config.eval.every_steps * share / log_every) * log_every
    overrides["eval.every_steps"] = max(log_every, every)
    return overrides


def apply(config, overrides: dict):
    """`config` with 'section.key' overrides set (the values the flags give the command)."""
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = type(config[section][field])(value)
    return config


def check_prepared(config, data_dir: str) -> tuple[str, float]:
    """(the shards' folder, counted FLOPs per step) for `config`. Raises Refused when the
    carried shards are not the ones this config reads (its data fields changed)."""
    from electra_jax.data import shards, tokenizer
    from electra_jax.pretraining import dry_run

    tok = tokenizer.Tokenizer.load(config.data.tokenizer)
    key16 = shards.content_key(config.data, tok, config.seed)[:16]
    folder = os.path.join(config.data.cache_dir, key16)
    if not os.path.isfile(os.path.join(folder, shards.MANIFEST)):
        raise gpu_data.Refused(
            f"{data_dir} holds no shards for this config's data fields (key {key16}); rerun "
            "`python benchmarks/gpu_data.py` with the same recipe and carry the folder again"
        )
    return folder, dry_run.describe(config, compile=False)["flops_per_step"]


def device_name() -> str:
    """The GPU's name as nvidia-smi gives it (no jax start on the device), else 'cpu'."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    names = out.stdout.strip().splitlines()
    return names[0] if out.returncode == 0 and names else "cpu"


def child_env(**extra) -> dict:
    env = dict(_CHILD_ENV, PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_rows(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


def pretrain_readings(rows: list[dict], flops_per_step: float, tokens_per_step: int) -> dict:
    """The summary's pre-training fields from metrics.jsonl rows."""
    curve = [
        {"step": r["step"], **{k: r.get(f"eval/{k}") for k in EVAL_KEYS}}
        for r in rows
        if "eval/disc_auc" in r
    ]
    steps = rows[-1]["step"] if rows else 0
    return {
        "steps_done": steps,
        "tokens": steps * tokens_per_step,
        "pretrain_flops": steps * flops_per_step,
        "disc_auc": curve[-1]["disc_auc"] if curve else None,
        "eval": curve,
        "last_row": rows[-1] if rows else None,
    }


def pretrain(args, overrides: dict, summary: Summary, flops_per_step: float, tokens_per_step: int):
    """Runs the train command until it ends or --pretrain_seconds; returns its exit code."""
    workdir = os.path.join(args.workdir, "pretrain")
    cmd = [
        sys.executable,
        "-m",
        "electra_jax.train",
        f"--config={args.config}",
        f"--workdir={workdir}",
        *gpu_data.config_flags(overrides),
    ]
    print(" ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env())
    stopped = False
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    seen = 0
    while proc.poll() is None:
        if not stopped and time.time() - t0 > args.pretrain_seconds:
            print(f"pre-training reached --pretrain_seconds={args.pretrain_seconds}: SIGTERM")
            proc.send_signal(signal.SIGTERM)
            stopped = True
            grace = time.time()
        if stopped and time.time() - grace > 120:
            proc.kill()
        rows = read_rows(metrics_path)
        if len(rows) != seen:
            seen = len(rows)
            summary.update(
                **pretrain_readings(rows, flops_per_step, tokens_per_step),
                pretrain_seconds=round(time.time() - t0, 1),
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # a second between readings, but not after the run's end
    rows = read_rows(metrics_path)
    summary.update(
        **pretrain_readings(rows, flops_per_step, tokens_per_step),
        pretrain_seconds=round(time.time() - t0, 1),
        pretrain_exit_code=proc.returncode,
        pretrain_stopped_at_budget=stopped,
        pretrain_step_seconds=round(
            sum(
                (b["step"] - a["step"]) * tokens_per_step / b["tokens_per_sec"]
                for a, b in zip([{"step": 0}, *rows[:-1]], rows, strict=True)
                if b.get("tokens_per_sec")
            ),
            1,
        ),
    )
    if os.path.isfile(metrics_path):
        tmp = os.path.join(args.out, f".pretrain_metrics.jsonl.tmp{os.getpid()}")
        shutil.copyfile(metrics_path, tmp)
        os.replace(tmp, os.path.join(args.out, "pretrain_metrics.jsonl"))
    return proc.returncode


def finetune_jobs(args, recipe: dict, manifest: dict, pretrained: str | None) -> list[dict]:
    """One job per (task, init): its command line and workdir; random init copies the
    pre-training run's network shape and uses its tokenizer."""
    glue_model = runpy.run_path(os.path.join(ROOT, "configs", "glue.py"))["get_config"]().model
    with open(os.path.join(args.workdir, "pretrain", "config.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    random_fields = {f"model.{k}": model[k] for k in glue_model}
    random_fields["tokenizer"] = os.path.join(args.workdir, "pretrain", "tokenizer")
    random_fields["vocab_size"] = manifest["vocab_size"]
    jobs = []
    for task in args.tasks:
        for init in INITS:
            if init == "electra" and pretrained is None:
                continue
            fields = {"task": task, "data_dir": os.path.join(args.data, "glue", task)}
            fields.update(recipe.get("all", {}))
            fields.update(recipe.get(task, {}))
            fields.update(CPU_FINETUNE if args.cpu else {})
            fields.update({"init_from": pretrained} if init == "electra" else random_fields)
            workdir = os.path.join(args.workdir, "finetune", f"{init}-{task}")
            cmd = [
                sys.executable,
                "-m",
                "electra_jax.finetune",
                "--config=configs/glue.py",
                f"--workdir={workdir}",
                *gpu_data.config_flags(fields),
            ]
            jobs.append({"task": task, "init": init, "cmd": cmd, "workdir": workdir})
    return jobs


def _tail(path: str, lines: int = 6) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def scores(summary: Summary, tasks: list[str]) -> None:
    """Each init's average over all tasks, once every task has a score, and electra's gain."""
    averages = {}
    for init in INITS:
        table = summary.data[init]
        if all(t in table for t in tasks):
            table["average"] = round(sum(table[t] for t in tasks) / len(tasks), 2)
            averages[init] = table["average"]
    if len(averages) == 2:
        summary.data["gain"] = round(averages["electra"] - averages["random_init"], 2)
    summary.save()


def finetune(args, jobs: list[dict], summary: Summary) -> None:
    """Runs `jobs`, --parallel at a time, until --finetune_seconds; records each result."""
    # CUDA contexts and cuDNN workspaces sit outside the pools: leave a fifth of the memory.
    fraction = f"{min(0.75, 0.8 / args.parallel):.3f}"
    env = child_env(XLA_PYTHON_CLIENT_MEM_FRACTION=fraction)
    runs = summary.data["finetune"]

    def record(job: dict, status: str, **fields) -> None:
        runs.setdefault(job["init"], {})[job["task"]] = {"status": status, **fields}
        summary.save()

    def finish(job: dict, code: int | None) -> None:
        seconds = round(time.time() - job["start"], 1)
        path = os.path.join(job["workdir"], "eval_results.json")
        if code == 0 and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                result = json.load(f)
            points = round(100 * result["score"], 2)
            summary.data[job["init"]][job["task"]] = points
            record(
                job,
                "done",
                score=points,
                score_metric=result["score_metric"],
                num_train_examples=result["num_train_examples"],
                steps=result["steps"],
                seconds=seconds,
            )
            print(f"{job['init']} {job['task']}: {points} ({result['score_metric']}, {seconds}s)")
        else:
            status = "timed out (--finetune_seconds)" if code is None else f"exit {code}"
            record(job, status, seconds=seconds)
            print(f"{job['init']} {job['task']}: {status}; {job['log']} ends:\n{_tail(job['log'])}")
        scores(summary, args.tasks)

    t0, waiting, running = time.time(), list(jobs), []
    while waiting or running:
        while waiting and len(running) < args.parallel:
            job = waiting.pop(0)
            os.makedirs(os.path.dirname(job["workdir"]), exist_ok=True)
            job["log"] = job["workdir"] + ".log"
            with open(job["log"], "w") as log:
                job["proc"] = subprocess.Popen(
                    job["cmd"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            job["start"] = time.time()
            running.append(job)
            record(job, "running")
        # A finished job's slot is filled within 0.2 s: device time is the budget.
        time.sleep(0.2)
        over = time.time() - t0 > args.finetune_seconds
        for job in list(running):
            code = job["proc"].poll()
            if code is None and not over:
                continue
            if code is None:
                stop(job["proc"], grace=10)
            running.remove(job)
            finish(job, code)
        if over:
            for job in waiting:
                record(job, "not started (--finetune_seconds)")
            waiting = []


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(ROOT, ".gpu_data"))
    ap.add_argument("--out", required=True, help="h200_quality.json and the metrics go here")
    ap.add_argument("--workdir", default="", help="runs and logs; default: a new /tmp folder")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "gpu_quality.py"))
    ap.add_argument(
        "--steps", type=_cli.natural_int, default=0, help="train.num_steps; 0: the config's"
    )
    ap.add_argument("--pretrain_seconds", type=_cli.positive_float, default=240.0)
    ap.add_argument("--finetune_seconds", type=_cli.positive_float, default=120.0)
    ap.add_argument(
        "--parallel", type=_cli.positive_int, default=10, help="fine-tuning runs at a time"
    )
    ap.add_argument("--tasks", default=",".join(gpu_data.TASKS))
    ap.add_argument("--cpu", action="store_true", help="tiny shapes, to test the plumbing")
    args = ap.parse_args(argv)
    args.tasks = _cli.glue_tasks("--tasks", args.tasks)
    try:
        run(args)
    except gpu_data.Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def run(args) -> None:
    args.data = os.path.abspath(args.data)
    manifest = gpu_data.read_manifest(args.data)
    missing = [t for t in args.tasks if t not in manifest["tasks"]]
    if missing:
        raise gpu_data.Refused(f"{args.data} holds no GLUE files for {', '.join(missing)}")
    if not os.path.isfile(args.config):
        raise gpu_data.Refused(f"--config {args.config} is not a file")
    if args.workdir and os.path.isdir(args.workdir) and os.listdir(args.workdir):
        raise gpu_data.Refused(f"--workdir {args.workdir} is not empty; give a new folder")
    source = gpu_data.stage(
        os.path.join(args.data, "corpus"), manifest["corpus_files"], manifest["staged_at"]
    )
    module = runpy.run_path(args.config)
    config = module["get_config"]()
    overrides = pretrain_overrides(config, manifest, args.data, source, args.steps, args.cpu)
    config = apply(config, overrides)
    shards, flops_per_step = check_prepared(config, args.data)
    os.makedirs(args.out, exist_ok=True)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="electra_jax_gpu_quality-")
    os.makedirs(args.workdir, exist_ok=True)
    import jax

    summary = Summary(
        os.path.join(args.out, "h200_quality.json"),
        {
            "status": "pre-training",
            "config": os.path.relpath(os.path.abspath(args.config), ROOT),
            "overrides": overrides,
            "finetune_fields": module.get("FINETUNE", {}),
            "cpu_shapes": args.cpu,
            "jax": jax.__version__,
            "device": device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "data": {k: manifest[k] for k in ("corpus", "vocab_size", "seq_length", "prepared")},
            "shards": os.path.relpath(shards, args.data),
            "batch_size": int(config.train.batch_size),
            "steps_planned": int(config.train.num_steps),
            "flops_per_step": flops_per_step,
            "pretrain_flops": 0,
            "pretrain_seconds": None,
            "tokens": 0,
            "disc_auc": None,
            "electra": {},
            "random_init": {},
            "finetune": {},
            "workdir": args.workdir,
        },
    )
    print(f"gpu_quality: workdir {args.workdir}; {overrides['train.num_steps']} steps", flush=True)
    tokens_per_step = int(config.train.batch_size) * int(config.data.seq_length)
    code = pretrain(args, overrides, summary, flops_per_step, tokens_per_step)
    checkpoints = os.path.join(args.workdir, "pretrain", "checkpoints")
    saved = os.path.isdir(checkpoints) and any(n.isdigit() for n in os.listdir(checkpoints))
    if not os.path.isfile(os.path.join(args.workdir, "pretrain", "config.json")):
        summary.update(status=f"pre-training failed before it started (exit {code})")
        sys.exit(1)
    summary.update(status="fine-tuning")
    pretrained = os.path.join(args.workdir, "pretrain") if saved else None
    jobs = finetune_jobs(args, module.get("FINETUNE", {}), manifest, pretrained)
    finetune(args, jobs, summary)
    runs = [r for init in summary.data["finetune"].values() for r in init.values()]
    done = all(r.get("status") == "done" for r in runs)
    summary.update(status="done" if done and saved else "incomplete")
    print(json.dumps({k: summary.data.get(k) for k in ("status", "disc_auc", "gain")}))


if __name__ == "__main__":
    _cli.run(main)
