"""python tests/hostile_inputs.py [--keep=DIR]: bad input, tried as a hostile new user would.

Trains a micro run once, then tries about 110 hostile inputs against the command-line tools (train,
prepare, finetune, export, goodput, the launchers) and the Python API (electra_jax.load), two at a
time, and prints a table:
the case, the exit code, the last line of stderr, and the verdict. A case passes when the command
ends as it should (one `error: ...` line and exit 2 for bad input; one line and exit 1 for a
diverged run; exit 0 where the input is legitimate), never with a traceback, within its timeout,
with the note it must print where it has one (`says`), and when everything it was given
(checkpoints, config.json, a user's files) is left as it was.
Exit status 1 when any case fails. tests/test_hostile_inputs.py runs it (a slow test).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: tests/ is on sys.path, not the repository
    sys.path.insert(0, str(ROOT))
from tests import command_server  # noqa: E402  (the commands, forked from a warm interpreter)

_TEXT = (
    "the a of and to in is was for on that with as it by at from his her they this which be are "
    "have had not one all were we when there can an their who would been more will so if river "
    "house tree city king ship road garden letter winter summer morning evening people walked "
    "spoke wrote built carried found opened closed watched followed remembered"
)
WORDS = tuple(_TEXT.split())


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # tiny models: compile time dominates
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(argv: list, timeout: float = 240) -> tuple[int, str, float]:
    """(exit code, stderr, seconds); exit code 124 when the timeout ran out."""
    started = time.time()
    try:
        out = command_server.run(argv, ROOT, _env(), timeout=timeout)
        return out.returncode, out.stderr, time.time() - started
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, err, time.time() - started


def _snapshot(path: pathlib.Path) -> dict:
    """{relative path: sha256 of a file, or 'dir'} under path (a file: itself)."""
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(path.rglob("*")):
        if p.name == ".lock":  # names each run that held the workdir: rewritten by every run
            continue
        rel = str(p.relative_to(path))
        if p.is_dir():
            out[rel] = "dir"
        elif not p.is_file():  # a FIFO a case put there: reading it would wait for a writer
            out[rel] = "special"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ------------------------------------------------------------------------------------- fixtures


@dataclasses.dataclass
class Context:
    """What the cases start from: a corpus, a micro config, a trained workdir, GLUE files (built
    once, shared read-only), and `root`, the folder where this process's cases make their own."""

    root: pathlib.Path
    corpus: pathlib.Path
    config: pathlib.Path
    workdir: pathlib.Path  # trained: checkpoints 3 and 6, never modified by a case
    export: pathlib.Path  # its Hugging Face export
    sst2: pathlib.Path
    _count: itertools.count = dataclasses.field(default_factory=itertools.count)

    def copy(self, name: str) -> pathlib.Path:
        """A private copy of the trained workdir for a case that damages it."""
        dst = self.fresh(name)
        shutil.copytree(self.workdir, dst, symlinks=True)
        return dst

    def fresh(self, name: str) -> pathlib.Path:
        """A new path of its own (the cases run on threads: next() of a count is atomic)."""
        return self.root / f"{name}-{next(self._count)}"


SYLLABLES = ("ka", "lo", "mi", "ter", "san", "vo", "ble", "dra", "pen", "qui", "ros", "tal", "un")


def _write_corpus(path: pathlib.Path) -> None:
    """Common words and made-up ones: enough distinct text for a 300-piece vocabulary."""
    rng = random.Random(0)
    made_up = ["".join(rng.choices(SYLLABLES, k=rng.randint(2, 4))) for _ in range(3000)]
    lines = []
    for i in range(6000):
        words = [rng.choice(WORDS if rng.random() < 0.6 else made_up) for _ in range(12)]
        lines.append(" ".join(words).capitalize() + ".")
        if i % 9 == 8:
            lines.append("")  # a blank line ends a document
    path.write_text("\n".join(lines) + "\n")


def _write_glue(root: pathlib.Path) -> pathlib.Path:
    rng = random.Random(1)
    sst2 = root / "SST-2"
    sst2.mkdir(parents=True)
    for name, n in (("train.tsv", 24), ("dev.tsv", 8)):
        rows = [f"{' '.join(rng.choice(WORDS) for _ in range(6))}\t{i % 2}" for i in range(n)]
        (sst2 / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return sst2


def _stsb(root: pathlib.Path, score: str) -> pathlib.Path:
    """STS-B files whose third training row has `score`."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="STS-B-", dir=root))
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    )
    for name in ("train.tsv", "dev.tsv"):
        rows = [
            f"{i}\tg\tf\t2012\t{i}\tnone\tnone\tthe river ran\tthe king spoke\t"
            f"{score if (name == 'train.tsv' and i == 2) else '2.5'}"
            for i in range(6)
        ]
        (d / name).write_text(header + "\n" + "\n".join(rows) + "\n")
    return d


MICRO = """import sys

sys.path.insert(0, {root!r})
from tests.micro import micro_config  # noqa: E402


def get_config():
    config = micro_config()
    config.data.source = {source!r}
    config.log.every_steps = 3
    return config
"""


def make_context(root: pathlib.Path) -> Context:
    """Builds what the cases start from in `root` (a minute or two: the micro run trains)."""
    corpus = root / "corpus.txt"
    _write_corpus(corpus)
    config = root / "micro.py"
    config.write_text(MICRO.format(root=str(ROOT), source=f"text:{corpus}"))
    workdir = root / "trained"
    code, err, _ = _run(TRAIN + [f"--config={config}", f"--workdir={workdir}"], timeout=600)
    if code != 0:
        raise RuntimeError(f"training the micro run failed:\n{err[-3000:]}")
    code, err, _ = _run(EXPORT + [f"--workdir={workdir}", f"--out={root / 'export'}"])
    if code != 0:
        raise RuntimeError(f"exporting the micro run failed:\n{err[-3000:]}")
    _write_glue(root)
    return context_at(root, scratch=root)


def context_at(built: pathlib.Path, scratch: pathlib.Path) -> Context:
    """The Context of a folder make_context built (perhaps in another process), whose cases
    make their own files in `scratch`: one per process, so that two never pick the same name."""
    return Context(
        scratch,
        built / "corpus.txt",
        built / "micro.py",
        built / "trained",
        built / "export",
        built / "SST-2",
    )


# ---------------------------------------------------------------------------------------- cases

PY = [sys.executable]
TRAIN = PY + ["-m", "electra_jax.train"]
PREPARE = PY + ["-m", "electra_jax.prepare"]
FINETUNE = PY + ["-m", "electra_jax.finetune"]
EXPORT = PY + ["-m", "electra_jax.export"]
EVALUATE = PY + ["-m", "electra_jax.evaluate"]


@dataclasses.dataclass
class Case:
    """argv(ctx) -> (argv, paths that must not change); expect 'error', 'diverged' or 'ok'."""

    name: str
    argv: Callable[[Context], tuple[list, list]]
    expect: str = "error"
    contains: str = ""  # a phrase the last line must hold
    timeout: float = 240
    after: Callable[[Context, list], str] | None = None  # extra check: '' or what went wrong
    says: str = ""  # a phrase some line of stderr must hold (a note before the last line)


def _train(ctx: Context, workdir, *overrides) -> list:
    return TRAIN + [f"--config={ctx.config}", f"--workdir={workdir}", *overrides]


def train_setting(name: str, override: str, contains: str, *more: str) -> Case:
    return Case(
        name,
        lambda ctx: (_train(ctx, ctx.fresh("w"), override) + list(more), []),
        contains=contains,
    )


def _hf_folder(ctx: Context) -> pathlib.Path:
    path = ctx.fresh("hf-model")
    shutil.copytree(ctx.export / "discriminator", path)
    return path


def _foreign_folder(ctx: Context) -> pathlib.Path:
    path = ctx.fresh("mine")
    (path / "sub").mkdir(parents=True)
    (path / "important.txt").write_text("a user's file")
    (path / "sub" / "notes.txt").write_text("more")
    return path


def _resume_other_setting(ctx: Context):
    w = ctx.copy("resume")
    return _train(ctx, w, "--config.train.adam_bias_correction=False"), [w]


def _resume_on_devices_that_cannot_split_the_batch(ctx: Context):
    """The run's batch of 8 on 3 devices: the resume could not go on exactly."""
    w = ctx.copy("layout")
    env = ["env", "XLA_FLAGS=--xla_force_host_platform_device_count=3"]
    return env + _train(ctx, w, "--config.train.num_steps=9"), [w]


def _resume_without_config_other_model(ctx: Context):
    w = ctx.copy("noconfig")
    (w / "config.json").unlink()
    return _train(ctx, w, "--config.model.num_layers=3", "--allow_change=config.json"), [w]


def _resume_without_config(ctx: Context):
    w = ctx.copy("noconfig")
    (w / "config.json").unlink()
    return _train(ctx, w), [w]


def _foreign_config_beside(entry: str):
    """Another program's config.json beside a checkpoints/ or tokenizer/ folder."""

    def argv(ctx: Context):
        path = ctx.fresh("other-program")
        (path / entry).mkdir(parents=True)
        (path / entry / "state.bin").write_bytes(b"theirs")
        (path / "config.json").write_text(json.dumps({"learning_rate": 0.1, "model": {}}))
        return _train(ctx, path), [path]

    return argv


def _linked(name: str):
    """The trained run's copy whose `name` is a link to a user's file outside it."""

    def argv(ctx: Context):
        w = ctx.copy("linked")
        outside = ctx.fresh("outside.txt")
        outside.write_text("a user's file")
        if (w / name).exists() or (w / name).is_symlink():
            (w / name).unlink()
        (w / name).symlink_to(outside)
        return _train(ctx, w), [outside]

    return argv


def _export_over_a_handed_list(ctx: Context):
    """An export.json of ours that lists a user's files, beside them: none may go."""
    out = ctx.fresh("handed")
    out.mkdir()
    (out / "important.txt").write_text("a user's file")
    manifest = {"format": "electra_jax.export", "version": 2, "files": ["important.txt"]}
    (out / "export.json").write_text(json.dumps(manifest))
    return EXPORT + [f"--workdir={ctx.workdir}", f"--out={out}"], [out / "important.txt"]


def _resume_other_source(ctx: Context):
    w = ctx.copy("source")
    other = ctx.root / "other.txt"
    if not other.exists():
        shutil.copy(ctx.corpus, other)
    return _train(ctx, w, f"--config.data.source=text:{other}"), [w]


def _config_json_list(ctx: Context):
    w = ctx.copy("jsonlist")
    (w / "config.json").write_text("[1, 2, 3]")
    return _train(ctx, w), [w]


def _checkpoints_a_file(ctx: Context):
    w = ctx.copy("ckptfile")
    shutil.rmtree(w / "checkpoints")
    (w / "checkpoints").write_text("not a folder")
    return _train(ctx, w), [w]


def _cache_dir_a_file(ctx: Context):
    f = ctx.fresh("cachefile")
    f.write_text("x")
    return _train(ctx, ctx.fresh("w"), f"--config.data.cache_dir={f}"), [f]


def _held(ctx: Context):
    """The trained run's copy, held by a process that claimed it (as a running train does)."""
    w = ctx.copy("held")
    code = (
        "import sys\nfrom electra_jax.run import workdir\n"
        f"workdir.claim({str(w)!r}, workdir.PRETRAIN, command='electra_jax.train')\n"
        # Held until killed (or until this process ends and its pipe closes): a time limit
        # would let the lock go while a slow case still runs.
        "print('held', flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        PY + ["-c", code], cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    if holder.stdout.readline().strip() != b"held":
        raise RuntimeError(f"the holder of {w} did not claim it (exit {holder.wait()})")
    _HOLDERS.append(holder)
    return w


_HOLDERS: list[subprocess.Popen] = []


def _train_while_held(ctx: Context):
    w = _held(ctx)
    return _train(ctx, w), [w / "checkpoints", w / "config.json", w / "metrics.jsonl"]


def _prepare_while_held(ctx: Context):
    w = _held(ctx)
    return PREPARE + [f"--config={ctx.config}", f"--workdir={w}"], [w / "tokenizer", w / "data"]


def _with_config_file(ctx: Context, text: str) -> list:
    """train with a config file holding `text`."""
    path = ctx.fresh("config").with_suffix(".py")
    path.write_text(text)
    return TRAIN + [f"--config={path}", f"--workdir={ctx.fresh('w')}"]


def _shard_of(w: pathlib.Path) -> pathlib.Path:
    (shard,) = w.glob("data/*/shard-00000.array_record")
    return shard


def _truncated_shard(ctx: Context):
    w = ctx.copy("shard")
    shard = _shard_of(w)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return _train(ctx, w, "--config.train.num_steps=9"), [w / "checkpoints"]


def _escaping_manifest(ctx: Context):
    w = ctx.copy("manifest")
    manifest = _shard_of(w).parent / "manifest.json"
    data = json.loads(manifest.read_text())
    data["shards"] = ["../../../../../../etc/passwd"]
    manifest.write_text(json.dumps(data))
    return _train(ctx, w, "--config.train.num_steps=9"), [w / "checkpoints"]


def _damaged_tokenizer(ctx: Context):
    w = ctx.copy("tok")
    (w / "tokenizer" / "spm.model").write_bytes(b"\x00garbage" * 10)
    return _train(ctx, w, "--config.train.num_steps=9"), [w / "checkpoints"]


def _all_checkpoints_damaged(ctx: Context):
    w = ctx.copy("damaged")
    for manifest in w.glob("checkpoints/*/state/manifest.ocdbt"):
        manifest.unlink()
    return _train(ctx, w), [w / "config.json", w / "metrics.jsonl", w / "tokenizer"]


def _no_restart_after_damage(ctx: Context, argv: list) -> str:
    """After the run set both damaged checkpoints aside, a rerun still does not start over."""
    w = pathlib.Path(str(argv[-1]).split("=", 1)[1])
    aside = sorted(p.name for p in (w / "checkpoints").iterdir())
    if aside != ["3.corrupt", "6.corrupt"]:
        return f"checkpoints/ holds {aside}"
    code, err, _ = _run(argv)
    if code != 2 or "set aside as damaged" not in err:
        return f"the rerun exited {code}: {err.strip().splitlines()[-1:]}"
    return ""


def _symlink_loop_corpus(ctx: Context):
    d = ctx.fresh("loopcorpus")
    (d / "sub").mkdir(parents=True)
    shutil.copy(ctx.corpus, d / "sub" / "a.txt")
    os.symlink(d, d / "sub" / "up")  # a link to a parent folder: a loop for a naive glob
    os.symlink(d / "sub" / "a.txt", d / "b.txt")  # a link to a file: followed
    return PREPARE + [
        f"--config={ctx.config}",
        f"--workdir={ctx.fresh('w')}",
        f"--config.data.source=text:{d}/**/*.txt",
    ], [d]


def _prepare_then_init_from(ctx: Context):
    """`prepare` trained a tokenizer on another corpus; train's init_from brings the trained
    run's weights with their own tokenizer: refused, the prepared tokenizer kept."""
    w = ctx.fresh("prepared")
    half = ctx.fresh("half").with_suffix(".txt")
    half.write_text("\n".join(ctx.corpus.read_text().splitlines()[:3000]) + "\n")
    prepared = PREPARE + [
        f"--config={ctx.config}",
        f"--workdir={w}",
        f"--config.data.source=text:{half}",
    ]
    code, err, _ = _run(prepared)
    if code != 0:
        raise RuntimeError(f"preparing {w} failed:\n{err[-3000:]}")
    return _train(ctx, w, f"--config.train.init_from={ctx.workdir}"), [w / "tokenizer"]


def _hf_damaged(edit: Callable[[pathlib.Path], None]):
    def argv(ctx: Context):
        export = ctx.fresh("export")
        shutil.copytree(ctx.export, export)
        edit(export)
        return _finetune(ctx, ctx.fresh("ft"), f"--config.init_from={export}"), [export]

    return argv


def _edit_config(key: str, value) -> Callable[[pathlib.Path], None]:
    def edit(export: pathlib.Path) -> None:
        path = export / "discriminator" / "config.json"
        config = json.loads(path.read_text())
        config[key] = value
        path.write_text(json.dumps(config))

    return edit


def _nan_weight(export: pathlib.Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = export / "discriminator" / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})


def _utf16_glue(ctx: Context):
    data = ctx.fresh("sst2-utf16")
    shutil.copytree(ctx.sst2, data)
    for name in ("train.tsv", "dev.tsv"):
        path = data / name
        path.write_text(path.read_text(encoding="utf-8"), encoding="utf-16")
    return _finetune(ctx, ctx.fresh("ft"), data=data), [data]


def _escaping_weight_map(export: pathlib.Path) -> None:
    d = export / "discriminator"
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"electra.embeddings.word_embeddings.weight": "../../x"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _config_list(export: pathlib.Path) -> None:
    (export / "discriminator" / "config.json").write_text("[]")


def _finetune(ctx: Context, workdir, *overrides, data=None) -> list:
    return FINETUNE + [
        "--config=configs/glue.py",
        f"--workdir={workdir}",
        f"--config.data_dir={data or ctx.sst2}",
        *overrides,
    ]


TINY_FINETUNE = (
    "--config.model.hidden_size=32",
    "--config.model.num_layers=1",
    "--config.model.num_heads=1",
    "--config.model.intermediate_size=64",
    "--config.model.embedding_size=32",
    "--config.vocab_size=60",
    "--config.seq_length=16",
    "--config.batch_size=8",
    "--config.eval_batch_size=8",
)


def _stsb_case(score: str) -> Callable[[Context], tuple[list, list]]:
    def argv(ctx: Context):
        data = _stsb(ctx.root, score)
        return _finetune(ctx, ctx.fresh("ft"), "--config.task=STS-B", data=data), [data]

    return argv


def _no_results(ctx: Context, argv: list) -> str:
    w = pathlib.Path(next(a for a in argv if str(a).startswith("--workdir=")).split("=", 1)[1])
    return "eval_results.json was written" if (w / "eval_results.json").exists() else ""


def _api(snippet: str) -> Callable[[Context], tuple[list, list]]:
    """A Python API call in a subprocess: a ValueError becomes `error: ...`, exit 2."""

    def argv(ctx: Context):
        code = (
            "import sys\nimport numpy as np\nimport electra_jax\n"
            f"W = {str(ctx.workdir)!r}\n"
            "try:\n"
            + "".join(f"    {line}\n" for line in snippet.splitlines())
            + "except (ValueError, TypeError) as e:\n"
            "    print(f'error: {type(e).__name__}: {e}', file=sys.stderr)\n"
            "    sys.exit(2)\n"
        )
        return PY + ["-c", code], [ctx.workdir]

    return argv


def _export_over_foreign_manifest(ctx: Context):
    out = _foreign_folder(ctx)
    (out / "export.json").write_text(json.dumps({"format": "somebody-else", "files": ["sub"]}))
    return EXPORT + [f"--workdir={ctx.workdir}", f"--out={out}"], [out]


def _export_over_our_export(ctx: Context):
    out = ctx.fresh("export")
    shutil.copytree(ctx.export, out)
    (out / "important.txt").write_text("a user's file beside an export")
    (out / "discriminator" / "notes.md").write_text("and one inside it")
    return EXPORT + [f"--workdir={ctx.workdir}", f"--out={out}"], []


def _kept_users_files(ctx: Context, argv: list) -> str:
    out = pathlib.Path(argv[-1].split("=", 1)[1])
    ok = (out / "important.txt").exists() and (out / "discriminator" / "notes.md").exists()
    return "" if ok else "the user's files beside the export were deleted"


def _nonutf8_workdir(ctx: Context):
    path = os.fsencode(str(ctx.root)) + b"/w\xff\xfe"
    argv = [os.fsencode(a) for a in _train(ctx, "X")]
    argv[-1] = b"--workdir=" + path
    return argv, []


def _beside_users_folders(ctx: Context):
    """The trained run's copy whose checkpoints/ holds a user's backup of checkpoint 6 and a
    folder of notes: resumed beside them, they stay as they are."""
    w = ctx.copy("beside")
    shutil.copytree(w / "checkpoints" / "6", w / "checkpoints" / "6_copy")
    (w / "checkpoints" / "backup").mkdir()
    (w / "checkpoints" / "backup" / "notes.txt").write_text("a user's file")
    kept = [w / "checkpoints" / "6_copy", w / "checkpoints" / "backup"]
    return _train(ctx, w, "--config.train.num_steps=9"), kept


def _export_in_checkpoints(ctx: Context):
    """An export put at checkpoints/99 before the --out check existed (or by hand)."""
    w = ctx.copy("exported")
    shutil.copytree(ctx.export, w / "checkpoints" / "99")
    return _train(ctx, w, "--config.train.num_steps=9"), [w]


def _renamed_checkpoint(ctx: Context):
    w = ctx.copy("renamed")
    (w / "checkpoints" / "6").rename(w / "checkpoints" / "9")
    return _train(ctx, w, "--config.train.num_steps=12"), [w]


def _switch_config_file(ctx: Context, switch: int) -> pathlib.Path:
    """A two_stage micro config (a generator as wide as the discriminator) switching at `switch`."""
    path = ctx.fresh("two_stage").with_suffix(".py")
    path.write_text(
        ctx.config.read_text()
        + "\n\n_base = get_config\n\n\ndef get_config():\n    config = _base()\n"
        + "    config.objective.name = 'two_stage'\n"
        + f"    config.objective.two_stage_steps = {switch}\n"
        + "    config.generator.hidden_fraction = 1.0\n"
        + "    config.model.num_heads, config.model.intermediate_size = 1, 256\n"
        + "    config.train.num_steps = 12\n    return config\n"
    )
    return path


def _passed_switch_moved_ahead(ctx: Context):
    """A two_stage run at step 6 that switched at 4 (its config.json says so; the refusal comes
    before the checkpoints are read), its switch moved to 9 with --allow_change."""
    w = ctx.copy("switch")
    code = "import runpy, json, sys\nc = runpy.run_path(sys.argv[1])['get_config']()\n"
    code += "print(json.dumps(c.to_dict()))"
    out = subprocess.run(
        PY + ["-c", code, str(_switch_config_file(ctx, 4))],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    (w / "config.json").write_text(out.stdout)
    argv = TRAIN + [
        f"--config={_switch_config_file(ctx, 9)}",
        f"--workdir={w}",
        "--allow_change=objective.two_stage_steps",
    ]
    return argv, [w]


def _corpus_moved_away(ctx: Context):
    """A run of its own corpus stopped at step 3, the corpus then moved: it resumes from the
    shards its data record names (a run of its own: the shared corpus stays)."""
    corpus = ctx.fresh("corpus").with_suffix(".txt")
    shutil.copy(ctx.corpus, corpus)
    w = ctx.fresh("moved")
    source = f"--config.data.source=text:{corpus}"
    code, err, _ = _run(_train(ctx, w, source, "--config.train.num_steps=3"), timeout=600)
    if code != 0:
        raise RuntimeError(f"training the run whose corpus moves failed:\n{err[-3000:]}")
    corpus.rename(corpus.with_suffix(".moved"))
    return _train(ctx, w, source), [w / "data", w / "tokenizer"]


def _reached_step_6(ctx: Context, argv: list) -> str:
    w = pathlib.Path(next(a for a in argv if str(a).startswith("--workdir=")).split("=", 1)[1])
    steps = sorted(p.name for p in (w / "checkpoints").iterdir() if p.name.isdigit())
    return "" if "6" in steps else f"checkpoints/ holds {steps}"


# ---- the fourth pass's rules (docs/reliability.md), several inputs each

GOODPUT = PY + ["-m", "electra_jax.goodput"]


def _goodput_over(make: Callable[[pathlib.Path], None]):
    """goodput of a workdir whose metrics.jsonl `make` writes (or puts something else at)."""

    def argv(ctx: Context):
        w = ctx.fresh("goodput")
        w.mkdir()
        make(w / "metrics.jsonl")
        return GOODPUT + [str(w)], [w]

    return argv


def _rows(*rows) -> Callable[[pathlib.Path], None]:
    return lambda path: path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _export_with_commands(make: Callable[[pathlib.Path], None]):
    """export of the trained run's copy whose commands.jsonl `make` replaces."""

    def argv(ctx: Context):
        w = ctx.copy("commands")
        (w / "commands.jsonl").unlink(missing_ok=True)
        make(w / "commands.jsonl")
        return EXPORT + [f"--workdir={w}", f"--out={ctx.fresh('o')}"], [w]

    return argv


# What goodput (jax-free, so each case takes a fraction of a second) is given as metrics.jsonl.
_GOODPUT_FILES = (
    ("metrics.jsonl a FIFO", os.mkfifo, "FIFO"),
    ("metrics.jsonl a folder", lambda p: p.mkdir(), "is a folder"),
    (
        "wall_sec 0",
        _rows({"step": 1, "wall_sec": 0, "productive_sec": 0, "goodput": 0}),
        "wall_sec 0",
    ),
    ("rows that are lists", _rows([1], [2]), "line 1"),
    ("a row without step", _rows({"wall_sec": 1, "productive_sec": 1, "goodput": 1}), "no step"),
    ("a Latin-1 byte", lambda p: p.write_bytes(b'{"step": 1, "note": "caf\xe9"}\n'), "not UTF-8"),
)


def _train_with_env(*env: str, workdir: str = ""):
    """train of a fresh workdir (or the trained run's copy: `workdir='copy'`) with `env` set."""

    def argv(ctx: Context):
        if workdir != "copy":
            return ["env", *env] + _train(ctx, ctx.fresh("w")), []
        w = ctx.copy("env")  # finished: a start adds to commands.jsonl, nothing else
        return ["env", *env] + _train(ctx, w), [w / "checkpoints", w / "config.json"]

    return argv


def _dry_run_topology(name: str):
    return lambda ctx: (_train(ctx, ctx.fresh("w"), "--dry_run", f"--topology={name}"), [])


_MISSPELT = """import sys

sys.path.insert(0, {root!r})
from tests.micro import micro_config  # noqa: E402


def get_config():
    config = micro_config()
    config.train.num_step = 3
    return config
"""


def _twice(flag: str, first: str, then: str):
    """train given `flag` twice, in each of absl's forms."""
    return lambda ctx: (_train(ctx, ctx.fresh("w"), f"{flag}={first}", flag, then), [])


def _config_with(ctx: Context, line: str) -> pathlib.Path:
    """The micro config file with `line` added to its get_config()."""
    path = ctx.fresh("config").with_suffix(".py")
    text = ctx.config.read_text().replace("    return config", f"    {line}\n    return config")
    path.write_text(text)
    return path


# tpu_vm.sh's arguments up to the train flags.
_TPU = ("e", "us-central2-b", "v4-16", "gs://b/runs/x", "--config=c.py")
_SILENT: list = []  # the listening sockets of _silent_hub, closed by release_holders


def _silent_address() -> str:
    """'http://127.0.0.1:PORT' of a socket that accepts connections (the kernel's backlog) and
    never answers (closed by release_holders)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    _SILENT.append(server)
    return f"http://127.0.0.1:{server.getsockname()[1]}"


def _silent_hub(ctx: Context):
    """export --push_to_hub to a Hub that never answers."""
    out = ctx.fresh("pushed")
    env = ["env", f"HF_ENDPOINT={_silent_address()}", "HF_TOKEN=hf_x"]
    return env + EXPORT + [
        f"--workdir={ctx.workdir}",
        f"--out={out}",
        "--push_to_hub=someone/electra-micro",
        "--hub_timeout_seconds=3",
    ], [ctx.workdir]


def _prepare_from_a_silent_hub(ctx: Context):
    """prepare of an hf:// corpus on a Hub that never answers, each request given 1 s."""
    env = ["env", f"HF_ENDPOINT={_silent_address()}", "HF_TOKEN=hf_x"]
    env.append("ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS=1")
    argv = PREPARE + [f"--config={ctx.config}", f"--workdir={ctx.fresh('w')}"]
    return env + argv + ["--config.data.source=text:hf://datasets/someone/corpus/*.txt"], []


def _finished_finetune_asked_again(ctx: Context):
    """A finished fine-tuning run (its own copy of SST-2) asked again after its dev.tsv changed:
    its results are of the earlier file."""
    data = ctx.fresh("SST-2")
    shutil.copytree(ctx.sst2, data)
    argv = _finetune(ctx, ctx.fresh("ft"), "--config.num_epochs=1", *TINY_FINETUNE, data=data)
    code, err, _ = _run(argv, timeout=600)
    if code != 0:
        raise RuntimeError(f"the fine-tuning to ask again failed:\n{err[-3000:]}")
    with open(data / "dev.tsv", "a") as f:
        f.write("the river ran\t1\n")
    w = pathlib.Path(next(a for a in argv if a.startswith("--workdir=")).split("=", 1)[1])
    return argv, [w]


def _export_kept(ctx: Context, argv: list) -> str:
    out = pathlib.Path(next(a for a in argv if a.startswith("--out=")).split("=", 1)[1])
    return "" if (out / "export.json").is_file() else f"no export in {out}"


def _export_step(step: str):
    def argv(ctx: Context):
        return EXPORT + [f"--workdir={ctx.workdir}@{step}", f"--out={ctx.fresh('o')}"], [
            ctx.workdir
        ]

    return argv


def _exported_step_3(ctx: Context, argv: list) -> str:
    out = pathlib.Path(next(a for a in argv if a.startswith("--out=")).split("=", 1)[1])
    source = json.loads((out / "export.json").read_text()).get("source", "")
    return "" if "(checkpoint 3)" in source else f"exported {source!r}"


def _export_all_damaged(ctx: Context):
    w = ctx.copy("damaged")
    for step in ("3", "6"):
        (w / "checkpoints" / step).rename(w / "checkpoints" / f"{step}.corrupt")
    return EXPORT + [f"--workdir={w}", f"--out={ctx.fresh('o')}"], [w]


def _export_over_a_listed_folder(ctx: Context):
    """An export of ours whose export.json also lists a user's notes/ file: kept, and said."""
    out = ctx.fresh("listed")
    shutil.copytree(ctx.export, out)
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("a user's file")
    manifest = json.loads((out / "export.json").read_text())
    manifest["files"].append("notes/mine.txt")
    manifest["sha256"]["notes/mine.txt"] = hashlib.sha256(b"a user's file").hexdigest()
    (out / "export.json").write_text(json.dumps(manifest))
    return EXPORT + [f"--workdir={ctx.workdir}", f"--out={out}"], [out / "notes"]


def _prepare_jsonl(ctx: Context):
    """prepare of the corpus as JSON lines whose text is in meta/text, one of them holding a
    lone surrogate (valid JSON, no text)."""
    corpus = ctx.fresh("corpus.jsonl")
    lines = [ln for ln in ctx.corpus.read_text().splitlines() if ln]
    rows = [{"meta": {"text": ln}} for ln in lines]
    rows[5]["meta"]["text"] += " \ud800 and on"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = PREPARE + [f"--config={ctx.config}", f"--workdir={ctx.fresh('w')}"]
    return argv + [f"--config.data.source=jsonl:{corpus}:meta/text"], [corpus]


def _prepare_categorical_parquet(ctx: Context):
    """prepare of the corpus as parquet whose text column is dictionary-encoded (categorical)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = ctx.fresh("corpus.parquet")
    lines = [ln for ln in ctx.corpus.read_text().splitlines() if ln]
    pq.write_table(pa.table({"text": pa.array(lines).dictionary_encode()}), corpus)
    argv = PREPARE + [f"--config={ctx.config}", f"--workdir={ctx.fresh('w')}"]
    return argv + [f"--config.data.source=parquet:{corpus}"], [corpus]


def _launcher(script: str, *args: str, env: tuple = ()):
    """A launcher (launch/) refusing before it calls anything (gcloud, srun, python)."""
    return lambda ctx: (["env", *env, "bash", f"launch/{script}", *args], [])


def fourth_pass() -> list[Case]:
    return [
        # 1. a command that reads a file we wrote reads it defensively
        *(
            Case(f"goodput, {name}", _goodput_over(make), contains=says, timeout=60)
            for name, make, says in _GOODPUT_FILES
        ),
        Case(
            "export, commands.jsonl a folder",
            _export_with_commands(lambda p: p.mkdir()),
            contains="commands.jsonl is a folder",
        ),
        # 2. what a parser accepts, what follows can do, or refuses in one line; every value
        # read from the environment is checked where it is read
        Case("topology of part hosts", _dry_run_topology("v5e:4x3"), contains="whole number of"),
        Case("topology v4:3x2x2", _dry_run_topology("v4:3x2x2"), contains="whole number of"),
        # (SLURM_PROCID=-1 and the like: tests/pretraining/test_cluster.py, in process)
        Case(
            "OMPI_COMM_WORLD_SIZE=abc",
            _train_with_env("OMPI_COMM_WORLD_SIZE=abc"),
            contains="OMPI_COMM_WORLD_SIZE='abc' is not a whole number",
        ),
        # 4. a launch that cannot join says so on every process; a stray variable is named
        Case(
            "Kubernetes pod 0 without the kubernetes package",
            _train_with_env("KUBERNETES_SERVICE_HOST=10.0.0.1", "JOB_COMPLETION_INDEX=0"),
            contains="pod 0 of a Kubernetes Indexed Job",
        ),
        # (TPU_WORKER_HOSTNAMES=a,b and the others: tests/pretraining/test_cluster.py)
        Case(
            "a stale SLURM_NTASKS=2",
            _train_with_env("SLURM_NTASKS=2", workdir="copy"),
            expect="ok",
            contains="nothing was trained",  # it went on alone, with the line before
            says="cluster: SLURM_NTASKS=2 set, but jax detects no launch here",
        ),
        # 7. any valid input text is read or refused in one line
        Case(
            "prepare, JSON lines: a nested field, a lone surrogate",
            _prepare_jsonl,
            expect="ok",
            timeout=300,
        ),
        Case("prepare, a categorical parquet column", _prepare_categorical_parquet, expect="ok"),
        # 8. a folder is ours only for the files we wrote; a message says what happened
        Case("export WORKDIR@3", _export_step("3"), expect="ok", after=_exported_step_3),
        Case("export WORKDIR@99", _export_step("99"), contains="has no checkpoint of step 99"),
        Case(
            "export, every checkpoint set aside as damaged",
            _export_all_damaged,
            contains="set aside as damaged (6.corrupt, 3.corrupt)",
        ),
        Case(
            "export over an export.json listing a user's file",
            _export_over_a_listed_folder,
            expect="ok",
            says="lists notes/mine.txt, which no export writes: left as it is",
        ),
        # 3. no setting is silently dropped or silently replaced
        Case(
            "a misspelt key in a config file",
            lambda ctx: (_with_config_file(ctx, _MISSPELT.format(root=str(ROOT))), []),
            contains="sets unknown config key train.num_step (did you mean train.num_steps?)",
        ),
        Case(
            "--config.train.batch_size twice",
            _twice("--config.train.batch_size", "8", "16"),
            contains="--config.train.batch_size (as --config.train.batch_size=8 and",
        ),
        train_setting(
            "log.profile_steps past the end", "--config.log.profile_steps=99", "past the run's end"
        ),
        Case(
            "prepare, a misspelt key in a config file",
            lambda ctx: (
                PREPARE
                + [f"--config={_config_with(ctx, 'config.data.vocab_siz = 300')}"]
                + [f"--workdir={ctx.fresh('w')}"],
                [],
            ),
            contains="data.vocab_siz (did you mean data.vocab_size?)",
        ),
        # 5. the launchers hold the commands' rules (launch/_rules.sh)
        *(
            Case(f"tpu_vm.sh {var}", _launcher("tpu_vm.sh", *_TPU, env=(var,)), contains=var)
            for var in ("SPOT=yes", "QUEUED=2", "POLL_SECONDS=abc")
        ),
        Case(
            "tpu_vm.sh, a bucket with capitals",
            _launcher("tpu_vm.sh", "e", "us-central2-b", "v4-16", "gs://Runs/x", "--config=c.py"),
            contains="capitals are not allowed",
        ),
        Case(
            "tpu_vm.sh --config.data.cache_dir /local",
            _launcher("tpu_vm.sh", *_TPU, "--config.data.cache_dir", "/local"),
            contains="--config.data.cache_dir=/local must be gs://",
        ),
        Case(
            "slurm.sbatch --workdir given twice",
            _launcher("slurm.sbatch", "--config=c.py", "--workdir=/a", "--workdir", "/b"),
            contains="--workdir is given 2 times",
        ),
        # 9. a finished run asked again with changed inputs says what changed
        Case(
            "finetune, a finished run asked again after its dev.tsv changed",
            _finished_finetune_asked_again,
            contains="holds this run, finished on other task files",
            timeout=300,
        ),
        # 6. every network call has a deadline (here 3 s; the default is 900 s)
        Case(
            "export --push_to_hub to a Hub that never answers",
            _silent_hub,
            contains="did not finish the upload to someone/electra-micro within 3s",
            timeout=120,
            after=_export_kept,
        ),
        # (a gs:// bucket that never answers: tests/store/test_deadline.py; gcsfs's own
        # back-off between its tries adds half a minute here)
        Case(
            "prepare, an hf:// corpus on a Hub that never answers",
            _prepare_from_a_silent_hub,
            contains="no answer within 1s (ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS)",
            timeout=120,
        ),
        Case(
            "ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS=abc",
            _train_with_env("ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS=abc"),
            contains="ELECTRA_JAX_NETWORK_TIMEOUT_SECONDS='abc' is not a number of seconds",
        ),
    ]


def cases() -> list[Case]:
    return [
        # ---- train: settings, each one line before any work
        train_setting("remat choice", "--config.train.remat=some", "train.remat='some'"),
        train_setting("xla attention, dropout", "--config.model.attention=xla", "no dropout"),
        train_setting("pallas attention on a CPU", "--config.model.attention=pallas", "TPU kernel"),
        Case(
            "cudnn in float32",
            lambda ctx: (
                _train(ctx, ctx.fresh("w"), "--config.model.attention=cudnn")
                + ["--config.model.attention_dropout_rate=0"],
                [],
            ),
            contains="computes in 16 bits",
        ),
        Case(
            "cudnn without a GPU",
            lambda ctx: (
                _train(ctx, ctx.fresh("w"), "--config.model.attention=cudnn")
                + ["--config.model.attention_dropout_rate=0", "--config.model.dtype=bfloat16"],
                [],
            ),
            contains="needs an NVIDIA GPU",
        ),
        train_setting(
            "single_segment_prob 2", "--config.data.single_segment_prob=2", "single_segment_prob"
        ),
        train_setting("short_seq_prob -1", "--config.data.short_seq_prob=-1", "short_seq_prob"),
        train_setting(
            "layers_fraction 0", "--config.generator.layers_fraction=0", "layers_fraction"
        ),
        train_setting("type_vocab_size 0", "--config.model.type_vocab_size=0", "type_vocab_size"),
        train_setting("learning_rate nan", "--config.train.learning_rate=nan", "learning_rate"),
        train_setting("sampler choice", "--config.objective.sampler=top_k", "objective.sampler"),
        train_setting("unknown source", "--config.data.source=wikipedia", "data.source"),
        train_setting(
            "source matching nothing", "--config.data.source=text:/nonexistent/*.txt", "/nonexist"
        ),
        train_setting(  # the table's config names its corpus in data.source
            "mixture beside data.source",
            "--config.data.mixture=builtin:0.7;text:/nonexistent/*.txt:0.3",
            "both name the corpus",
        ),
        train_setting(
            "mixture weight 0",
            "--config.data.source=builtin",
            "data.mixture: the weight of 'text:/nonexistent/*.txt:0' is '0'",
            "--config.data.mixture=builtin:0.7;text:/nonexistent/*.txt:0",
        ),
        train_setting("seed -1", "--config.seed=-1", "seed=-1"),
        # ---- train: workdirs that are not ours, or not ours to take now
        Case(
            "workdir is a file",
            lambda ctx: (_train(ctx, ctx.corpus), [ctx.corpus]),
            contains="is a file",
        ),
        Case(
            "workdir is a HF model",
            lambda ctx: (lambda p: (_train(ctx, p), [p]))(_hf_folder(ctx)),
            contains="Hugging Face model folder",
        ),
        Case(
            "workdir of a user's files",
            lambda ctx: (lambda p: (_train(ctx, p), [p]))(_foreign_folder(ctx)),
            contains="not an electra_jax workdir",
        ),
        Case("workdir held by a run", _train_while_held, contains="is in use by electra_jax.train"),
        Case("non-UTF-8 workdir path", _nonutf8_workdir, contains="not valid UTF-8"),
        # ---- train: resumes that must not lose the run
        Case("resume, other optimizer", _resume_other_setting, contains="adam_bias_correction"),
        Case(
            "resume, no config.json, other depth",
            _resume_without_config_other_model,
            contains="nothing was moved aside",
        ),
        Case("resume, no config.json", _resume_without_config, contains="config.json is missing"),
        Case(
            "resume on 3 devices, batch 8",
            _resume_on_devices_that_cannot_split_the_batch,
            contains="cannot go on exactly on this run's 1 process x 3 devices",
        ),
        Case("resume, other data.source", _resume_other_source, contains="--allow_change"),
        Case(
            "another program's config.json beside checkpoints/",
            _foreign_config_beside("checkpoints"),
            contains="not a run's",
        ),
        Case(
            "another program's config.json beside tokenizer/",
            _foreign_config_beside("tokenizer"),
            contains="not a run's",
        ),
        Case("WORKDIR/.lock a link out", _linked(".lock"), contains="is a symbolic link"),
        Case("metrics.jsonl a link out", _linked("metrics.jsonl"), contains="is a symbolic link"),
        Case("config.json a link out", _linked("config.json"), contains="is a symbolic link"),
        Case("config.json a JSON list", _config_json_list, contains="config.json"),
        Case("checkpoints/ a file", _checkpoints_a_file, contains="checkpoints is a file"),
        Case("cache_dir a file", _cache_dir_a_file, contains="data.cache_dir"),
        Case(
            "all checkpoints damaged",
            _all_checkpoints_damaged,
            contains="can be restored",
            after=_no_restart_after_damage,
        ),
        Case("truncated shard", _truncated_shard, contains="shard-00000.array_record"),
        Case("manifest escapes its folder", _escaping_manifest, contains="manifest.json"),
        Case("damaged workdir tokenizer", _damaged_tokenizer, contains="tokenizer"),
        # ---- train: multi-host flags
        Case(
            "coordinator garbage",
            lambda ctx: (
                _train(ctx, ctx.fresh("w"), "--coordinator_address=garbage")
                + ["--num_processes=2", "--process_id=0"],
                [],
            ),
            contains="not host:port",
        ),
        Case(
            "num_processes 0",
            lambda ctx: (_train(ctx, ctx.fresh("w"), "--num_processes=0", "--process_id=0"), []),
            contains="--num_processes=0",
        ),
        Case(
            "process_id out of range",
            lambda ctx: (_train(ctx, ctx.fresh("w"), "--num_processes=2", "--process_id=5"), []),
            contains="--process_id=5",
        ),
        Case(
            "unreachable coordinator",
            lambda ctx: (
                _train(
                    ctx,
                    ctx.fresh("w"),
                    "--coordinator_address=127.0.0.1:1",
                    "--num_processes=2",
                    "--process_id=1",
                    "--peer_timeout_seconds=1",
                ),
                [],
            ),
            contains="did not all join",
            # Far below jax's own wait (300 s), far above a start on a loaded machine.
            timeout=150,
        ),
        # ---- config files
        Case(
            "config without get_config",
            lambda ctx: (_with_config_file(ctx, "x = 1\n"), []),
            contains="has no get_config()",
        ),
        Case(
            "config giving a list, with an override",
            lambda ctx: (
                _with_config_file(ctx, "def get_config():\n    return [1]\n")
                + ["--config.train.num_steps=3"],
                [],
            ),
            contains="get_config() returned list",
        ),
        # ---- prepare
        Case(
            "prepare into a HF model",
            lambda ctx: (lambda p: (PREPARE + [f"--config={ctx.config}", f"--workdir={p}"], [p]))(
                _hf_folder(ctx)
            ),
            contains="Hugging Face model folder",
        ),
        Case("prepare while held", _prepare_while_held, contains="is in use"),
        Case(
            "prepare, bad setting",
            lambda ctx: (
                PREPARE
                + [f"--config={ctx.config}", f"--workdir={ctx.fresh('w')}"]
                + ["--config.data.short_seq_prob=1.5"],
                [],
            ),
            contains="short_seq_prob",
        ),
        Case("prepare, symlink loop", _symlink_loop_corpus, expect="ok", timeout=180),
        # ---- export
        Case(
            "export over a foreign export.json",
            _export_over_foreign_manifest,
            contains="export.json",
        ),
        Case("export over a handed file list", _export_over_a_handed_list, expect="ok"),
        Case(
            "export over our export",
            _export_over_our_export,
            expect="ok",
            after=_kept_users_files,
        ),
        Case(
            "export --out a file",
            lambda ctx: (EXPORT + [f"--workdir={ctx.workdir}", f"--out={ctx.corpus}"], []),
            contains="is a file",
        ),
        Case(
            "export a folder not a workdir",
            lambda ctx: (lambda p: (EXPORT + [f"--workdir={p}", f"--out={ctx.fresh('o')}"], [p]))(
                _foreign_folder(ctx)
            ),
        ),
        # ---- finetune
        Case(
            "finetune into a pre-training workdir",
            lambda ctx: (lambda w: (_finetune(ctx, w), [w]))(ctx.copy("pre")),
            contains="is a pre-training workdir",
        ),
        Case("STS-B score 7", _stsb_case("7"), contains="line 4"),
        Case("STS-B score nan", _stsb_case("nan"), contains="line 4"),
        Case(
            "num_epochs inf",
            lambda ctx: (_finetune(ctx, ctx.fresh("ft"), "--config.num_epochs=inf"), []),
            contains="num_epochs",
        ),
        Case(
            "HF weight_map escapes",
            _hf_damaged(_escaping_weight_map),
            contains="weight_map",
        ),
        Case(
            "HF vocab_size 1e12",
            _hf_damaged(_edit_config("vocab_size", 10**12)),
            contains="vocab_size",
        ),
        Case(
            "HF num_attention_heads 0",
            _hf_damaged(_edit_config("num_attention_heads", 0)),
            contains="num_attention_heads",
        ),
        Case("HF config.json a list", _hf_damaged(_config_list), contains="config.json"),
        Case(
            "finetune diverges",
            lambda ctx: (
                _finetune(ctx, ctx.fresh("ft"), "--config.learning_rate=1e10", *TINY_FINETUNE),
                [],
            ),
            expect="diverged",
            after=_no_results,
        ),
        # ---- Python API
        Case(
            "token id past the vocabulary",
            _api(
                "m = electra_jax.load(W)\nids = dict(m.tokenize(['The river ran.']))\n"
                "ids['input_ids'] = np.array(ids['input_ids']); ids['input_ids'][0, 1] = 10**6\n"
                "m.replaced_token_logits(ids)"
            ),
            contains="input_ids",
        ),
        Case(
            "segment id 2",
            _api(
                "m = electra_jax.load(W)\nids = dict(m.tokenize(['The river ran.']))\n"
                "ids['segment_ids'] = np.full_like(ids['input_ids'], 2)\nm.encode(ids)"
            ),
            contains="segment_ids",
        ),
        Case("load a missing path", _api("electra_jax.load(W + '-missing')"), contains="missing"),
        # ---- rules of the third pass (docs/reliability.md), a case each
        Case("tokenize no text", _api("electra_jax.load(W).tokenize([])"), contains="is empty"),
        Case(
            "tokenize a lone surrogate",
            _api("electra_jax.load(W).tokenize(['a \\ud800 b'])"),
            contains="lone surrogate",
        ),
        Case("HF weights with a NaN", _hf_damaged(_nan_weight), contains="non-finite"),
        Case(
            "export into the run's checkpoints/",
            lambda ctx: (
                EXPORT + [f"--workdir={ctx.workdir}", f"--out={ctx.workdir}/checkpoints/99"],
                [ctx.workdir],
            ),
            contains="which the run in",
        ),
        Case(
            "evaluate one step twice",
            lambda ctx: (EVALUATE + [f"--workdir={ctx.workdir}", "--steps=3,03"], [ctx.workdir]),
            contains="--steps names 3",
        ),
        Case(
            "finetune, family switched to squad",
            lambda ctx: (_finetune(ctx, ctx.fresh("ft"), "--config.family=squad"), []),
            contains="needs the keys",
        ),
        Case("finetune, a UTF-16 train.tsv", _utf16_glue, contains="UTF-16"),
        Case(
            "prepare, then init_from with another tokenizer",
            _prepare_then_init_from,
            contains=" other than the one train.init_from=",
        ),
        Case("resume beside a user's folders in checkpoints/", _beside_users_folders, expect="ok"),
        Case(
            "resume, an export at checkpoints/99",
            _export_in_checkpoints,
            contains="orbax would take it for checkpoint 99",
        ),
        Case(
            "resume, checkpoint 6 renamed 9",
            _renamed_checkpoint,
            contains="holds the run's state at step 6",
        ),
        Case(
            "resume, a passed two_stage switch moved ahead",
            _passed_switch_moved_ahead,
            contains="would rewrite the run's phases",
        ),
        Case(
            "resume, num_steps below the checkpoint",
            lambda ctx: (lambda w: (_train(ctx, w, "--config.train.num_steps=3"), [w]))(
                ctx.copy("shorter")
            ),
            contains="is below step 6",
        ),
        Case(
            "resume a finished run",
            lambda ctx: (lambda w: (_train(ctx, w), [w / "checkpoints", w / "config.json"]))(
                ctx.copy("finished")
            ),
            expect="ok",
            contains="nothing was trained",
        ),
        Case(
            "resume, corpus moved away",
            _corpus_moved_away,
            expect="ok",
            timeout=600,
            after=_reached_step_6,
        ),
        *fourth_pass(),
    ]


# ----------------------------------------------------------------------------------------- run


@dataclasses.dataclass
class Row:
    name: str
    code: int
    last: str
    seconds: float
    problem: str  # '' when the case passed

    @property
    def passed(self) -> bool:
        return not self.problem


def run_case(case: Case, ctx: Context) -> Row:
    argv, kept = case.argv(ctx)
    before = {str(p): _snapshot(p) for p in kept}
    code, err, seconds = _run(argv, case.timeout)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    problem = ""
    if code == 124:
        problem = f"no answer within {case.timeout:.0f}s"
    elif "Traceback" in err:
        # Its exception's line, so that a failure seen once in CI says where to look.
        after = err[err.index("Traceback") :].splitlines()[1:]
        raised = next((ln for ln in after if ln and not ln.startswith(" ")), "")
        problem = f"traceback ({raised[:200]})"
    elif case.expect == "error" and (code != 2 or not last.startswith("error: ")):
        problem = "not one error line with exit 2"
    elif case.expect == "error" and [ln for ln in lines if ln.startswith("error")] != [last]:
        problem = "more than one error line"
    elif case.expect == "diverged" and (code != 1 or not last.startswith("error: ")):
        problem = "not one line with exit 1"
    elif case.expect == "ok" and code != 0:
        problem = f"failed where it should succeed (exit {code})"
    elif case.contains and case.contains not in last:
        problem = f"the line does not say {case.contains!r}"
    elif case.says and case.says not in err:
        problem = f"nothing on stderr says {case.says!r}"
    if not problem:
        changed = [p for p, snap in before.items() if _snapshot(pathlib.Path(p)) != snap]
        if changed:
            problem = f"changed: {', '.join(changed)}"
    if not problem and case.after is not None:
        problem = case.after(ctx, argv)
    return Row(case.name, code, last, seconds, problem)


def run_all(root: pathlib.Path, workers: int = 2, log=print) -> list[Row]:
    started = time.time()
    ctx = make_context(root)
    log(f"trained and exported the micro run in {time.time() - started:.0f}s")
    rows = []
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(run_case, case, ctx) for case in cases()]
            for future in futures:
                rows.append(future.result())
    finally:
        release_holders()
    return rows


def release_holders() -> None:
    """Ends the processes that hold workdirs for the 'while held' cases."""
    while _HOLDERS:
        holder = _HOLDERS.pop()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    while _SILENT:
        _SILENT.pop().close()


def table(rows: list[Row]) -> str:
    out = ["| case | exit | last line | s | verdict |", "|---|---|---|---|---|"]
    for r in rows:
        last = r.last.replace("|", "\\|")
        last = last if len(last) <= 150 else last[:147] + "..."
        verdict = "ok" if r.passed else f"FAIL: {r.problem}"
        out.append(f"| {r.name} | {r.code} | {last} | {r.seconds:.1f} | {verdict} |")
    passed = sum(r.passed for r in rows)
    out.append(f"\n{passed} of {len(rows)} cases end cleanly and lose nothing.")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temp folder)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.keep:
        root = pathlib.Path(args.keep).resolve()
        root.mkdir(parents=True, exist_ok=False)
        rows = run_all(root, args.workers)
    else:
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
            rows = run_all(pathlib.Path(tmp), args.workers)
    print(table(rows))
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
