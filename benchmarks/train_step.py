r"""Times the full ELECTRA train step on synthetic ids (no input pipeline in the timed region).

    python benchmarks/train_step.py --config=configs/small.py --batch 32 --seq 128 \
        --steps 20 --warmup 8

With the config's train.steps_per_call = K > 1 (configs/small.py: 4) each timed call runs K steps
and counts as K; `--set train.steps_per_call=1` times single-step calls.
Prints one JSON line: median and mean seconds per step, tokens/s, counted TFLOP/s and MFU where the
device's peak is known. The ids are drawn like benchmarks/reference/'s PyTorch reference (uniform in
[1000, 30000), [CLS] first, [SEP] last, no padding) so the two can be compared shape for shape.
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


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/small.py")
    ap.add_argument("--batch", type=_cli.positive_int, default=32)
    ap.add_argument("--seq", type=_cli.positive_int, default=128)
    ap.add_argument("--steps", type=_cli.positive_int, default=20)
    ap.add_argument("--warmup", type=_cli.natural_int, default=8)
    ap.add_argument("--dtype", default=None, choices=_cli.DTYPES, help="override model.dtype")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config field, e.g. --set model.attention=cudnn (repeatable)",
    )
    args = ap.parse_args()

    config = _cli.config("--config", args.config)
    config.train.batch_size, config.data.seq_length = args.batch, args.seq
    if args.dtype:
        config.model.dtype = args.dtype
    for item in _cli.settings("--set", args.set):
        _cli.set_field("--set", config, item, sections=True)
    # Here, not at the top: a refusal of a bad flag or setting above is not kept waiting for jax.
    import jax
    import jax.numpy as jnp

    from electra_jax.data.tokenizer import CLS_ID, SEP_ID
    from electra_jax.model import sharding
    from electra_jax.pretraining import metrics, program

    mesh = sharding.make_mesh(config.mesh)
    setup = program.setup_step(config, config.data.vocab_size, mesh)
    spec, slots, step = setup.spec, setup.num_slots, setup.step_fn
    state = program.init_on_mesh(setup)
    rng = np.random.default_rng(0)

    per_call = config.train.steps_per_call  # > 1: K steps per call (train_step.multi_step)
    if per_call > 1:
        step = setup.multi_step_fn

    def batch():
        ids = rng.integers(1000, min(30000, spec.vocab_size), (args.batch, args.seq), np.int32)
        ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
        return {
            "input_ids": ids,
            "segment_ids": np.zeros_like(ids),
            "input_mask": np.ones_like(ids),
        }

    def call_batches():
        if per_call > 1:
            return sharding.global_batches([batch() for _ in range(per_call)], mesh)
        return sharding.global_batch(batch(), mesh)

    t0 = time.perf_counter()
    compiled = step.lower(state, call_batches()).compile()
    compile_s = time.perf_counter() - t0
    times = []  # seconds per step (a call's time / its steps)
    calls = lambda steps: -(-steps // per_call)
    for i in range(calls(args.warmup) + calls(args.steps)):
        b = call_batches()  # made outside the timed region
        t0 = time.perf_counter()
        state, m = compiled(state, b)
        jax.block_until_ready(m)
        if i >= calls(args.warmup):
            times.append((time.perf_counter() - t0) / per_call)
    m = jax.tree_util.tree_map(lambda x: x.reshape(-1)[-1], m)
    med = statistics.median(times)
    flops = metrics.count_flops(spec, args.batch, args.seq, slots, config.objective.name)["total"]
    device = jax.devices()[0]
    peak = metrics.peak_flops_per_device(device.device_kind, config.log.peak_flops)
    achieved = flops / med / jax.device_count()
    print(
        json.dumps(
            {
                "framework": "electra_jax",
                "jax": jax.__version__,
                "device": device.device_kind,
                "devices": jax.device_count(),
                "python": platform.python_version(),
                "config": args.config,
                "dtype": config.model.dtype,
                "attention": spec.attention,
                "remat": spec.remat,
                "scan_layers": spec.scan_layers,
                "steps_per_call": per_call,
                "batch": args.batch,
                "seq": args.seq,
                "mask_slots": slots,
                "steps": len(times) * per_call,
                "warmup": args.warmup,
                "compile_s": round(compile_s, 2),
                "median_s_per_step": round(med, 4),
                "mean_s_per_step": round(statistics.mean(times), 4),
                "min_s_per_step": round(min(times), 4),
                "tokens_per_sec": round(args.batch * args.seq / med, 1),
                "flops_per_step": flops,
                "tflops_per_sec_per_device": round(achieved / 1e12, 4),
                "mfu": None if peak is None else round(achieved / peak, 4),
                "last_loss": float(m["loss"]),
                "finite": bool(jnp.isfinite(m["loss"])),
            }
        )
    )


if __name__ == "__main__":
    _cli.run(main)
