"""The --dry_run summary: parameter counts and counted FLOPs from shapes alone, and the ahead-of-
time compile of the train step, with XLA's memory plan and FLOP count (python -m
electra_jax.train --dry_run)."""

from __future__ import annotations

import functools
import time

import jax
import ml_collections
import numpy as np

from electra_jax import checkpointing, metrics, sharding
from electra_jax.model import network_param_counts
from electra_jax.step_setup import build, checked_mesh, setup_step
from electra_jax.train_step import init_state


def describe(
    config: ml_collections.ConfigDict, vocab_size: int | None = None, compile: bool = True
) -> dict:
    """The dry run's summary, from shapes only: no parameter is allocated.

    Parameter counts and counted FLOPs always; with `compile`, the train step is also lowered
    and compiled ahead of time for a mesh over all devices (as the run would), adding the
    per-device memory XLA planned for it and XLA's own FLOP count, so an out-of-memory or a
    counting error shows before any hardware is booked.
    """
    vocab_size = vocab_size or config.data.vocab_size
    spec, model, tx, _, num_slots = build(config, vocab_size)
    abstract = jax.eval_shape(functools.partial(init_state, model, tx, config.seed))
    counts = network_param_counts(abstract.params)
    batch_size, seq_length = config.train.batch_size, config.data.seq_length
    flops = metrics.count_flops(spec, batch_size, seq_length, num_slots, config.objective.name)
    summary = {
        "discriminator_params": counts["discriminator"],
        "generator_params": counts["generator"],
        "total_params": counts["total"],
        "generator_hidden_size": spec.generator.hidden_size,
        "generator_num_heads": spec.generator.num_heads,
        "batch_size": batch_size,
        "seq_length": seq_length,
        "learning_rate": config.train.learning_rate,
        "mask_prob": config.objective.mask_prob,
        "mask_slots": num_slots,
        "flops_per_step": flops["total"],
    }
    if compile:
        summary.update(compile_report(config, vocab_size))
    return summary


def compile_report(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    """Compiles the train step from abstract inputs; returns XLA's memory plan and FLOPs.

    memory_per_device_bytes = arguments + outputs - donated aliases + temporaries: what one
    device holds at the step's peak (state, batch, activations, gradients, optimizer update).
    xla_flops_per_step is XLA's cost analysis of one device's program times the device count
    (None with gradient accumulation or scanned layers: XLA counts a loop's body once; set
    model.scan_layers=False to have it count the unrolled layers).
    This is the one-step program; the run's calls of train.steps_per_call steps scan it and hold
    about as much (configs/small.py at 32 x 128: 963 MB of temporaries for 4 steps, 945 for 1).
    """
    mesh = checked_mesh(config, process_count=1)
    # The unigram floor's distribution changes no shape: a uniform one stands in for the corpus's.
    uniform = np.arange(1, vocab_size + 1, dtype=np.float32) / vocab_size
    setup = setup_step(config, vocab_size, mesh, unigram_cdf=uniform)
    state = checkpointing.abstract_with_shardings(setup.abstract_state, setup.state_sharding)
    shape = (config.train.batch_size, config.data.seq_length)
    row = jax.ShapeDtypeStruct(shape, jax.numpy.int32, sharding=sharding.batch_sharding(mesh))
    batch = {"input_ids": row, "segment_ids": row, "input_mask": row}
    t0 = time.time()
    compiled = setup.step_fn.lower(state, batch).compile()
    seconds = time.time() - t0
    mem = compiled.memory_analysis()
    per_device = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    xla_flops = float(cost.get("flops", 0.0)) * jax.device_count() if cost else None
    if config.train.grad_accum_steps > 1 or config.model.get("scan_layers", False):
        xla_flops = None  # XLA counts a loop's body once, not once per micro-batch or layer
    return {
        "devices": jax.device_count(),
        "mesh": dict(mesh.shape),
        "memory_per_device_bytes": int(per_device),
        "memory_state_bytes": int(mem.argument_size_in_bytes),
        "memory_temp_bytes": int(mem.temp_size_in_bytes),
        "xla_flops_per_step": xla_flops,
        "compile_seconds": round(seconds, 1),
    }
