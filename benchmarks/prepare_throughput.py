r"""Times `prepare` (tokenize + pack + write shards) with 1 and more worker processes.

    python benchmarks/prepare_throughput.py --config=configs/tiny.py \
        --source='text:corpus/*/*.txt' --workers 1 2

The tokenizer is trained once (not timed) and shared; each worker count prepares into a fresh
cache. Prints one JSON line per worker count: tokens, examples, seconds, tokens/s, and whether the
shards are byte-identical to the first count's.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402
from electra_jax.data import shards  # noqa: E402


def _digest(prepared) -> str:
    h = hashlib.sha256()
    for path in prepared.shard_paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument("--source", required=True)
    ap.add_argument("--workers", type=_cli.positive_int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    _cli.each_once("--workers", args.workers)  # one timing per count; rerun to repeat
    config = _cli.config("--config", args.config)
    config.data.source = args.source
    _cli.checked(config)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with _cli.failures(f"--source {args.source}"):  # e.g. a glob that matches no file
            tok = shards.ensure_tokenizer(config.data, os.path.join(tmp, "tokenizer"), config.seed)
        tokenizer_s = time.perf_counter() - t0
        first = None
        for i, n in enumerate(args.workers):
            t0 = time.perf_counter()
            prep = shards.prepare(
                config.data, tok, os.path.join(tmp, f"cache{i}"), config.seed, num_workers=n
            )
            seconds = time.perf_counter() - t0
            digest = _digest(prep)
            first = first or digest
            print(
                json.dumps(
                    {
                        "source": args.source,
                        "config": args.config,
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "workers": n,
                        "tokenizer_train_s": round(tokenizer_s, 2),
                        "examples": prep.num_examples,
                        "tokens": prep.manifest["tokens"],
                        "seconds": round(seconds, 2),
                        "tokens_per_sec": round(prep.manifest["tokens"] / seconds),
                        "identical_to_first": digest == first,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    _cli.run(main)
