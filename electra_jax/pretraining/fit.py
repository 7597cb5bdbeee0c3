"""Whether a compiled step fits its devices: its memory per device by XLA's memory analysis,
a compile that reports the compiler's refusal for want of memory as a need instead of an
error, and what to change when nothing fits. Shared by the dry run and train.remat='auto'
(program.resolve_remat), below both."""

from __future__ import annotations

import re

import jax

from electra_jax.model import sharding
from electra_jax.pretraining.remat_auto import AUTO


def memory(compiled) -> dict:
    """Per-device bytes at the step's peak: arguments + outputs - donated aliases + temporaries
    (state, batch, activations, gradients, optimizer update)."""
    mem = compiled.memory_analysis()
    total = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    return {
        "memory_per_device_bytes": int(total),
        "memory_state_bytes": int(mem.argument_size_in_bytes),
        "memory_temp_bytes": int(mem.temp_size_in_bytes),
    }


_EXCEEDS = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compile_need(fn, state, batch):
    """(bytes per device, compiled), or (XLA's stated need or None, None) where the compiler
    refuses the program for want of memory (RESOURCE_EXHAUSTED)."""
    try:
        compiled = fn.lower(state, batch).compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        found = _EXCEEDS.search(" ".join(str(e).split()))
        # XLA's figures count in binary units ('36.73G' is GiB).
        need = round(float(found.group(1)) * _UNITS[found.group(2)]) if found else None
        return need, None
    return memory(compiled)["memory_per_device_bytes"], compiled


def fix_hint(config, mesh) -> str:
    """What to change so that a step fits: only the settings not already at their lightest."""
    batch, accum = config.train.batch_size, config.train.grad_accum_steps
    dp = sharding.data_parallel_size(mesh)
    hints = [
        f"a smaller batch per device (train.batch_size={batch} over {dp} devices: {batch // dp} "
        f"rows, {batch // dp // accum} per micro-batch)"
    ]
    if batch // dp // accum > 1:
        hints.append(f"more micro-batches (train.grad_accum_steps={accum})")
    if mesh.shape["fsdp"] < mesh.size // sharding.num_slices(mesh.devices.flat):
        hints.append(f"sharded parameters (mesh.fsdp={config.mesh.fsdp}; -1 is all of a slice)")
    if config.train.remat not in ("full", AUTO):  # 'auto' has tried 'full'
        hints.append(f"recomputation (train.remat={config.train.remat!r}; 'auto' or 'full')")
    if config.model.dtype != "bfloat16":
        hints.append(f"bfloat16 compute (model.dtype={config.model.dtype!r})")
    return "; or ".join(hints)
