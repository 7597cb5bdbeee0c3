r"""Input pipeline against the train step: loader batches/s, and step time on real vs synthetic ids.

    python benchmarks/input_pipeline.py --config=configs/small.py \
        --source='text:corpus/*/*.txt' --batch 128 --seq 128 --steps 10

Prepares the source (tokenizer and shards cached under --workdir), then
  1. reads --loader_batches batches from the Grain iterator alone: batches/s;
  2. times --steps train steps of each kind, each fetching its batch the runner's way
     (``sharding.global_batch(next(it))``, then the compiled step), alternating synthetic ids
     made ahead of time and batches from the loader step by step: the ratio of the medians is the
     input pipeline's cost to the step.
Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402
from electra_jax.data import shards  # noqa: E402


def _time_interleaved(compiled, state, fetchers, warmup: int, steps: int):
    """Median seconds per step for each fetcher, alternating them step by step (A, B, A, B, ...)
    so that a shared machine's drifting load weighs on both alike: [len(fetchers)] floats."""
    import jax

    times = [[] for _ in fetchers]
    for i in range(warmup + steps):
        for k, fetch in enumerate(fetchers):
            t0 = time.perf_counter()
            state, m = compiled(state, fetch())
            jax.block_until_ready(m)
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
    return state, [statistics.median(t) for t in times]


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/small.py")
    ap.add_argument("--source", required=True)
    ap.add_argument("--workdir", default="/tmp/electra_jax_input_bench")
    ap.add_argument("--batch", type=_cli.positive_int, default=128)
    ap.add_argument("--seq", type=_cli.positive_int, default=128)
    ap.add_argument("--steps", type=_cli.positive_int, default=10)
    ap.add_argument("--warmup", type=_cli.natural_int, default=3)
    ap.add_argument("--loader_batches", type=_cli.positive_int, default=200)
    args = ap.parse_args()

    config = _cli.config("--config", args.config)
    config.data.source = args.source
    config.train.batch_size, config.data.seq_length = args.batch, args.seq
    _cli.checked(config)
    with _cli.failures(f"--source {args.source}"):  # e.g. a glob that matches no file
        tok = shards.ensure_tokenizer(
            config.data, os.path.join(args.workdir, "tokenizer"), config.seed
        )
        prep = shards.prepare(config.data, tok, os.path.join(args.workdir, "data"), config.seed)
    # Here, not at the top: a refusal of a bad flag or input above is not kept waiting for jax.
    import jax

    from electra_jax.data import pipeline
    from electra_jax.model import sharding
    from electra_jax.pretraining import program
    from electra_jax.pretraining.optimizer_step import special_tokens_of

    # 1. The loader alone.
    it = pipeline.make_iterator(prep, args.batch, config.seed)
    next(it)  # start the read threads
    t0 = time.perf_counter()
    for _ in range(args.loader_batches):
        next(it)
    loader_bps = args.loader_batches / (time.perf_counter() - t0)

    # 2. The step, fed synthetic or real batches.
    mesh = sharding.make_mesh(config.mesh)
    setup = program.setup_step(config, tok.vocab_size, mesh, special_tokens_of(tok))
    step = setup.step_fn
    state = program.init_on_mesh(setup)
    rng = np.random.default_rng(0)
    synthetic = []
    for _ in range(4):
        ids = rng.integers(5, tok.vocab_size, (args.batch, args.seq), np.int32)
        ids[:, 0], ids[:, -1] = tok.cls_id, tok.sep_id  # the tokenizer's, as its rows have
        ones = np.ones_like(ids)
        synthetic.append({"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": ones})
    counter = iter(range(10**9))

    def fetch_synthetic():
        return sharding.global_batch(synthetic[next(counter) % len(synthetic)], mesh)

    real_it = pipeline.make_iterator(prep, args.batch, config.seed)

    def fetch_real():
        return sharding.global_batch(next(real_it), mesh)

    compiled = step.lower(state, fetch_synthetic()).compile()
    state, (synthetic_s, real_s) = _time_interleaved(
        compiled, state, [fetch_synthetic, fetch_real], args.warmup, args.steps
    )
    print(
        json.dumps(
            {
                "config": args.config,
                "source": args.source,
                "device": jax.devices()[0].device_kind,
                "devices": jax.device_count(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "batch": args.batch,
                "seq": args.seq,
                "examples": prep.num_examples,
                "loader_batches_per_sec": round(loader_bps, 1),
                "steps_per_sec_synthetic": round(1 / synthetic_s, 3),
                "median_s_per_step_synthetic": round(synthetic_s, 4),
                "median_s_per_step_real": round(real_s, 4),
                "real_over_synthetic": round(real_s / synthetic_s, 4),
            }
        )
    )


if __name__ == "__main__":
    _cli.run(main)
