r"""Prepares, on a CPU machine, every file benchmarks/gpu_quality.py reads on the GPU machine.

    python benchmarks/gpu_data.py --corpus=corpus --glue=glue_data   # -> .gpu_data/ (git-ignored)

The GPU machine gets only the repository and the ignored folders a run carries (not the corpus
and GLUE's files, which the repository does not hold: benchmarks/README.md, "Inputs") and has
no time to tokenize, so this writes into OUT (default .gpu_data/):

  corpus/       the corpus's text files (--corpus: *.txt and *.raw), a paragraph per line and a
                document per file or article (as_documents), gzip-compressed
  tokenizer/    the SentencePiece model of data.vocab_size pieces trained on them, and
  shards/       the packed ArrayRecord rows of data.seq_length tokens, both made by
                `python -m electra_jax.prepare` with --config (configs/gpu_quality.py)
  glue/TASK/    train.tsv and dev.tsv of each of --tasks
  bench/        the PyTorch reference step (benchmarks/reference/peer_torch_electra.py)
  gpu_data.json what is there: files and sizes, the shards' content key, the manifest's figures

Prepared shards are found by a content key over the corpus files' absolute paths, sizes and
modification times (docs/corpora.md), so the corpus is read from one fixed path, --staged_at
(default /tmp/electra_jax_gpu_corpus), with fixed modification times: `stage()` copies the
carried corpus there, here before preparing and on the GPU machine before training, and the
train command finds the shards under the same key without tokenizing anything.

Prints one JSON line: the folder's size and what travels with the working tree (tracked and
untracked files plus OUT and .whl/), which must stay under the device's 64 MiB. OUT is rebuilt
in a temporary folder and swapped in only when complete; an OUT that this script did not write
is refused.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _cli  # noqa: E402
from electra_jax.store.paths import sha256_of_file  # noqa: E402

FORMAT = "electra_jax-gpu-data-v1"
MANIFEST = "gpu_data.json"
STAGE_MARKER = ".electra_jax_gpu_corpus"  # hidden: the corpus glob never matches it
# Every staged file gets this modification time (2020-09-13), here and on the GPU machine.
FIXED_MTIME_NS = 1_600_000_000 * 10**9
CORPUS_SUFFIXES = (".txt", ".raw")
# The inputs a user supplies (the repository holds neither): what to give, where to read more.
CORPUS_HELP = (
    'the pre-training text: *.txt and *.raw files in a folder (benchmarks/README.md, "Inputs")'
)
GLUE_HELP = 'GLUE\'s folder: TASK/{train,dev}.tsv (benchmarks/README.md, "Inputs")'
TASKS = ("SST-2", "MRPC", "STS-B", "CoLA", "RTE")
CARRY_LIMIT = 64 * 2**20  # the device's limit on the working tree it copies, carried paths in


class Refused(Exception):
    """Bad input or a folder that is not ours: one `error:` line, exit code 2."""


def config_flags(overrides: dict) -> list[str]:
    """`--config.SECTION.KEY=VALUE` flags for a train/prepare/finetune command line."""
    return [f"--config.{key}={value}" for key, value in overrides.items()]


def corpus_source(staged_at: str) -> str:
    """The data.source that reads the staged corpus."""
    return f"text:{staged_at}/**/*.gz"


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, obj) -> None:
    """`obj` as indented JSON, written to a temporary file and renamed into place."""
    _write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def folder_bytes(path: str) -> int:
    """Bytes of the regular files under `path` (links not followed)."""
    total = 0
    for parent, _, names in os.walk(path):
        for name in names:
            full = os.path.join(parent, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def traveling_bytes(root: str, carried: list[str]) -> int:
    """What the device copies: tracked and untracked-not-ignored files, plus the carried
    folders (`carried`, relative to `root`) that exist."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = os.path.join(root, os.fsdecode(name))
        if os.path.isfile(path) and not os.path.islink(path):
            total += os.path.getsize(path)
    return total + sum(folder_bytes(os.path.join(root, c)) for c in carried)


def _is_ours(out: str) -> bool:
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def stage(corpus_dir: str, files: list[list], staged_at: str) -> str:
    """Copies the carried corpus (`files`: [relative path, size] rows of gpu_data.json) to
    `staged_at` with the fixed modification time, so that its content key is the one the shards
    were prepared under; returns the data.source that reads it.

    Raises:
      Refused: `staged_at` is a link, or a folder this function did not make; a carried file
        is missing or not of its listed size.
    """
    if os.path.islink(staged_at):
        raise Refused(f"--staged_at {staged_at} is a link; give a plain path")
    if os.path.exists(staged_at):
        if not os.path.isfile(os.path.join(staged_at, STAGE_MARKER)):
            raise Refused(
                f"{staged_at} exists and was not staged by benchmarks/gpu_data.py; remove it "
                "or choose another --staged_at"
            )
        shutil.rmtree(staged_at)
    os.makedirs(staged_at)
    with open(os.path.join(staged_at, STAGE_MARKER), "w", encoding="utf-8") as f:
        f.write("staged by benchmarks/gpu_data.py; removed and rewritten by each staging\n")
    for rel, size in files:
        src, dst = os.path.join(corpus_dir, rel), os.path.join(staged_at, rel)
        if not os.path.isfile(src) or os.path.getsize(src) != size:
            raise Refused(f"{src} is missing or not {size} bytes; rerun benchmarks/gpu_data.py")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        os.utime(dst, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
    return corpus_source(staged_at)


def read_manifest(data_dir: str) -> dict:
    """gpu_data.json of a prepared folder. Raises Refused when absent or not ours."""
    if not _is_ours(data_dir):
        raise Refused(
            f"{data_dir} holds no {MANIFEST} of benchmarks/gpu_data.py; run "
            "`python benchmarks/gpu_data.py` on a machine with the corpus and carry the folder"
        )
    with open(os.path.join(data_dir, MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def _corpus_files(corpus: str) -> list[str]:
    found = [
        p
        for p in sorted(glob.glob(os.path.join(corpus, "**", "*"), recursive=True))
        if p.endswith(CORPUS_SUFFIXES) and os.path.isfile(p)
    ]
    if not found:
        raise Refused(f"--corpus {corpus} holds no {' or '.join(CORPUS_SUFFIXES)} files")
    return found


# A WikiText article's title line (" = Title = "; sections have "= =" and more).
_WIKI_TITLE = re.compile(rb"= [^=].* =")


def as_documents(data: bytes) -> bytes:
    """A corpus file in the loader's layout: one paragraph per line, a blank line between
    documents (docs/corpora.md). The NLTK books wrap paragraphs over lines with blank lines
    between them, the speeches mostly give a paragraph per line, WikiText a paragraph per line
    and no blank lines; read as they are, every paragraph would be a document of its own and
    the rows mostly padding. So runs of non-blank lines become one line (in a file with blank
    lines), each file is one document, and WikiText's article titles start a new one. Lines the
    loader finds too long it cuts after a sentence end. Bytes stay bytes: invalid UTF-8 is the
    loader's to count."""
    lines = [line.strip() for line in data.replace(b"\r", b"").split(b"\n")]
    if b"" in b"\n".join(lines).strip(b"\n").split(b"\n"):  # a blank line between others
        paragraphs, run = [], []
        for line in [*lines, b""]:
            if line:
                run.append(line)
            elif run:
                paragraphs.append(b" ".join(run))
                run = []
    else:
        paragraphs = [line for line in lines if line]
    documents: list[list[bytes]] = [[]]
    for paragraph in paragraphs:
        if _WIKI_TITLE.fullmatch(paragraph) and documents[-1]:
            documents.append([])
        documents[-1].append(paragraph)
    return b"\n\n".join(b"\n".join(doc) for doc in documents if doc) + b"\n"


def _compress_corpus(corpus: str, paths: list[str], into: str) -> list[list]:
    """gzip copies of `paths` (as_documents) under `into`, with deterministic bytes (no name
    or time in the header); returns [relative path, size] rows."""
    rows = []
    for path in paths:
        rel = os.path.relpath(path, corpus) + ".gz"
        dst = os.path.join(into, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(path, "rb") as src:
            text = as_documents(src.read())
        with open(dst, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as z:
            z.write(text)
        rows.append([rel, os.path.getsize(dst)])
    return rows


def _check_glue(glue: str, tasks: list[str]) -> None:
    for task in tasks:
        for name in ("train.tsv", "dev.tsv"):
            path = os.path.join(glue, task, name)
            if not os.path.isfile(path):
                raise Refused(f"{path} is missing; --glue must hold TASK/train.tsv and dev.tsv")


def _prepare(config: str, overrides: dict, workdir: str, log) -> dict:
    """`python -m electra_jax.prepare` with `overrides`; its JSON line."""
    cmd = [
        sys.executable,
        "-m",
        "electra_jax.prepare",
        f"--config={config}",
        f"--workdir={workdir}",
        *config_flags(overrides),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log(" ".join(cmd))
    out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise Refused(f"electra_jax.prepare exited {out.returncode} (its error is above)")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build(args, log=lambda m: print(m, file=sys.stderr)) -> dict:
    """Writes args.out (see the module docstring); returns the printed summary."""
    out = os.path.abspath(args.out)
    if os.path.lexists(out) and not _is_ours(out):
        raise Refused(f"{out} exists and was not written by benchmarks/gpu_data.py; remove it")
    paths = _corpus_files(args.corpus)
    config = runpy.run_path(args.config)["get_config"]()
    tasks = [t for t in args.tasks.split(",") if t]
    _check_glue(args.glue, tasks)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp-", dir=os.path.dirname(out))
    try:
        files = _compress_corpus(args.corpus, paths, os.path.join(tmp, "corpus"))
        source = stage(os.path.join(tmp, "corpus"), files, args.staged_at)
        overrides = {"data.source": source, "data.cache_dir": os.path.join(tmp, "shards")}
        if args.vocab_size:
            overrides["data.vocab_size"] = args.vocab_size
        if args.seq_length:
            overrides["data.seq_length"] = args.seq_length
        workdir = os.path.join(tmp, "prepare-workdir")
        summary = _prepare(args.config, overrides, workdir, log)
        shutil.copytree(os.path.join(workdir, "tokenizer"), os.path.join(tmp, "tokenizer"))
        shutil.rmtree(workdir)
        for task in tasks:
            os.makedirs(os.path.join(tmp, "glue", task))
            for name in ("train.tsv", "dev.tsv"):
                shutil.copyfile(
                    os.path.join(args.glue, task, name), os.path.join(tmp, "glue", task, name)
                )
        if args.peer:
            os.makedirs(os.path.join(tmp, "bench"))
            shutil.copyfile(args.peer, os.path.join(tmp, "bench", os.path.basename(args.peer)))
        shards = os.path.relpath(summary["directory"], tmp)
        manifest = {
            "format": FORMAT,
            "config": os.path.relpath(os.path.abspath(args.config), ROOT),
            "corpus": os.path.abspath(args.corpus),
            "corpus_files": files,
            "staged_at": args.staged_at,
            "source": source,
            "vocab_size": args.vocab_size or int(config.data.vocab_size),
            "seq_length": summary["seq_length"],
            "shards": shards,
            "prepared": {k: v for k, v in summary.items() if k != "directory"},
            "tokenizer_sha256": sha256_of_file(os.path.join(tmp, "tokenizer", "spm.model")),
            "tasks": tasks,
            "peer": os.path.join("bench", os.path.basename(args.peer)) if args.peer else None,
            "seconds": round(time.time() - t0, 1),
        }
        manifest["bytes"] = folder_bytes(tmp)
        write_json(os.path.join(tmp, MANIFEST), manifest)
        old = None
        if os.path.lexists(out):
            old = f"{out}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        tmp = None
        if old:
            shutil.rmtree(old)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    carried = [os.path.relpath(out, ROOT), ".whl"] if out.startswith(ROOT + os.sep) else [".whl"]
    travels = traveling_bytes(ROOT, carried)
    result = {
        "out": out,
        "bytes": folder_bytes(out),
        "travels_bytes": travels,
        "carry_limit_bytes": CARRY_LIMIT,
        "examples": summary["examples"],
        "tokens": summary["tokens"],
        "vocab_size": manifest["vocab_size"],
        "seq_length": manifest["seq_length"],
        "seconds": manifest["seconds"],
    }
    if travels > CARRY_LIMIT:
        raise Refused(
            f"the working tree with {' and '.join(carried)} is {travels / 2**20:.1f} MiB, over "
            f"the device's {CARRY_LIMIT // 2**20} MiB: use fewer --tasks or a smaller --corpus"
        )
    return result


def main(argv=None) -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", help=CORPUS_HELP)
    ap.add_argument("--glue", help=GLUE_HELP)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "gpu_quality.py"))
    ap.add_argument(
        "--vocab_size", type=_cli.natural_int, default=0, help="0: the config's (30,522)"
    )
    ap.add_argument("--seq_length", type=_cli.natural_int, default=0, help="0: the config's (128)")
    ap.add_argument("--out", default=os.path.join(ROOT, ".gpu_data"))
    ap.add_argument("--staged_at", default="/tmp/electra_jax_gpu_corpus")
    ap.add_argument(
        "--peer",
        default=os.path.join(ROOT, "benchmarks", "reference", "peer_torch_electra.py"),
        help="the PyTorch reference to carry ('' for none)",
    )
    args = ap.parse_args(argv)
    _cli.glue_tasks("--tasks", args.tasks)
    _cli.given("--corpus", args.corpus, CORPUS_HELP)
    _cli.given("--glue", args.glue, GLUE_HELP)
    if args.peer and not os.path.isfile(args.peer):
        ap.error(f"--peer {args.peer} is not a file")
    if not os.path.isfile(args.config):
        ap.error(f"--config {args.config} is not a file")
    if not os.path.isabs(args.staged_at):
        ap.error(f"--staged_at {args.staged_at} must be an absolute path")
    try:
        print(json.dumps(build(args)))
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _cli.run(main)
