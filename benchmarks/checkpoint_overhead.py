r"""What asynchronous checkpointing costs the training loop, as a share of step time.

    python benchmarks/checkpoint_overhead.py --config=configs/tiny.py --interval 10 --saves 3

Runs the real train step on synthetic ids, then `saves` intervals of `interval` steps twice:
without saving, and with `checkpointing.save` (what the loop calls) at the start of each
interval. Reports the time each save blocks the loop (the part orbax does on the caller's thread:
copying the arrays off the device and starting the writer), the slowdown of the steps that run
while the write is in flight, and both as a share of the step time spent between two saves at the
config's default cadence (`checkpoint.every_steps`). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument(
        "--interval", type=_cli.positive_int, default=10, help="steps timed after each save"
    )
    ap.add_argument("--saves", type=_cli.positive_int, default=3)
    ap.add_argument("--warmup", type=_cli.natural_int, default=3)
    args = ap.parse_args()

    config = _cli.config("--config", args.config)
    # Here, not at the top: a refusal of a bad flag above is not kept waiting for jax.
    import grain
    import jax

    from electra_jax.data.tokenizer import CLS_ID, SEP_ID
    from electra_jax.model import sharding
    from electra_jax.pretraining import program
    from electra_jax.store import checkpointing

    batch_size, seq = config.train.batch_size, config.data.seq_length
    mesh = sharding.make_mesh(config.mesh)
    setup = program.setup_step(config, config.data.vocab_size, mesh)
    spec, step = setup.spec, setup.step_fn
    state = program.init_on_mesh(setup)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, spec.vocab_size, (batch_size, seq), np.int32)
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    batch = sharding.global_batch(
        {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids)},
        mesh,
    )
    compiled = step.lower(state, batch).compile()
    for _ in range(args.warmup):
        state, m = compiled(state, batch)
    jax.block_until_ready(state)

    def interval():
        nonlocal state
        t = time.perf_counter()
        for _ in range(args.interval):
            state, m = compiled(state, batch)
        jax.block_until_ready(m)
        return time.perf_counter() - t

    plain = [interval() for _ in range(args.saves)]
    data_iter = iter(grain.MapDataset.range(10**6).batch(4).to_iter_dataset())
    blocking, saving = [], []
    with tempfile.TemporaryDirectory() as workdir:
        cfg = config.checkpoint.copy_and_resolve_references()
        cfg.keep = 2
        manager = checkpointing.make_manager(workdir, cfg)
        for i in range(args.saves):
            t = time.perf_counter()
            checkpointing.save(manager, i + 1, state, data_iter)
            blocking.append(time.perf_counter() - t)
            saving.append(interval())  # the write runs in the background meanwhile
            manager.wait_until_finished()
        manager.close()

    step_s = statistics.median(plain) / args.interval
    every = config.checkpoint.every_steps
    between_saves = every * step_s
    block_s = statistics.median(blocking)
    in_flight_s = max(0.0, statistics.median(saving) - statistics.median(plain))
    print(
        json.dumps(
            {
                "config": args.config,
                "device": jax.devices()[0].device_kind,
                "state_mbytes": round(
                    sum(x.nbytes for x in jax.tree_util.tree_leaves(state)) / 1e6, 1
                ),
                "step_s": round(step_s, 4),
                "save_blocking_s": round(block_s, 4),
                "in_flight_slowdown_s": round(in_flight_s, 4),
                "every_steps": every,
                "overhead_blocking_pct": round(100 * block_s / between_saves, 3),
                "overhead_total_pct": round(100 * (block_s + in_flight_s) / between_saves, 3),
            }
        )
    )


if __name__ == "__main__":
    _cli.run(main)
