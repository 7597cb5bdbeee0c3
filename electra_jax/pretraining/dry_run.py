"""The --dry_run summary: parameter counts and counted FLOPs from shapes alone, and the ahead-of-
time compile of the train step, with XLA's memory plan and FLOP count (python -m
electra_jax.train --dry_run)."""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import re
import time

import jax
import ml_collections
import numpy as np

from electra_jax.errors import ConfigError
from electra_jax.model import sharding
from electra_jax.model.networks import abstract_params, network_param_counts
from electra_jax.pretraining import compiled_costs, fit, metrics, remat_auto, topology
from electra_jax.pretraining.program import (
    abstract_arguments,
    build,
    checked_mesh,
    resolve_remat,
    setup_step,
)


def describe(
    config: ml_collections.ConfigDict,
    vocab_size: int | None = None,
    compile: bool = True,
    target: topology.Target | None = None,
    costs: bool = True,
) -> dict:
    """The dry run's summary, from shapes only: no parameter is allocated.

    Parameter counts and counted FLOPs always; with `compile`, the train step is also lowered
    and compiled ahead of time for a mesh over all devices (as the run would), adding the
    per-device memory XLA planned for it and XLA's own FLOP count, so an out-of-memory or a
    counting error shows before any hardware is booked. With `target` (a TPU slice from
    topology.resolve) it is compiled by the TPU compiler for that slice's devices instead of
    this machine's (tpu_report; `costs`: also its cost compiles).
    """
    vocab_size = vocab_size or config.data.vocab_size
    spec, model, _, _, num_slots = build(config, vocab_size)
    counts = network_param_counts(abstract_params(model)[0])
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
    if target is not None:
        summary.update(tpu_report(config, vocab_size, target, flops["total"], costs))
    elif compile:
        summary.update(compile_report(config, vocab_size))
    return summary


class DoesNotFit(ConfigError):
    """The step needs more memory per device than the chip has (XLA's RESOURCE_EXHAUSTED)."""


def _uniform(vocab_size: int):
    """The unigram floor's distribution changes no shape: a uniform one stands in for the
    corpus's."""
    return np.arange(1, vocab_size + 1, dtype=np.float32) / vocab_size


def _abstract_inputs(config, vocab_size: int, mesh, steps: int = 1):
    """The run's step (one step, or `steps` per call) and its abstract state and batch: the
    shapes and shardings alone, nothing allocated."""
    setup = setup_step(config, vocab_size, mesh, unigram_cdf=_uniform(vocab_size))
    _, fn, state, batch = abstract_arguments(setup, config, mesh, steps)
    return fn, state, batch


def _resolved(config, vocab_size: int, mesh) -> tuple:
    """(the config with train.remat='auto' resolved for `mesh`'s devices, the summary's fields:
    the policy compiled, and for 'auto' the line saying why and the seconds its compiles took)."""
    if config.train.remat != remat_auto.AUTO:
        return config, {"remat": config.train.remat}
    choice = resolve_remat(config, vocab_size, mesh, unigram_cdf=_uniform(vocab_size))
    metrics.log(choice.line)  # as the run logs it; the summary carries it too
    fields = {"remat": choice.policy, "remat_auto": choice.line, "remat_auto_seconds": None}
    if choice.trials:
        fields["remat_auto_seconds"] = round(choice.seconds, 1)
    return remat_auto.with_policy(config, choice.policy), fields


def _step_compiled(config, vocab_size: int, mesh, steps: int):
    """(compiled, seconds) of the run's program of `steps` per call: the one remat_auto compiled
    choosing the policy when it did (0 seconds), else compiled now."""
    setup = setup_step(config, vocab_size, mesh, unigram_cdf=_uniform(vocab_size))
    name, fn, state, batch = abstract_arguments(setup, config, mesh, steps)
    if setup.compiled.get(name) is not None:
        return setup.compiled[name], 0.0
    return _compile(fn, state, batch)


def _compile(fn, *args):
    """(compiled, seconds); DoesNotFit with XLA's need and have when memory runs out."""
    _, compiled, seconds = lower_and_compile(fn, *args)
    return compiled, seconds


def lower_and_compile(fn, *args):
    """(lowered, compiled, seconds): `_compile`, keeping the lowered program as well."""
    t0 = time.time()
    try:
        lowered = fn.lower(*args)
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise DoesNotFit(" ".join(str(e).split())) from e
    return lowered, compiled, time.time() - t0


@contextlib.contextmanager
def _without_persistent_cache():
    """Compile-only executables are not cached: jax would write them to a persistent cache
    (JAX_COMPILATION_CACHE_DIR) and then fail, with a warning, to load them back (loading needs
    a client with the devices). jax decides once per process whether it uses the cache, at its
    first compile: this holds where the TPU compile comes first (a dry run's process), not in
    one that compiled with the cache before (the test suite, which then sees that warning)."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)


def _costs(compiled) -> dict:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return dict(cost or {})


def compile_report(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    """Compiles the train step from abstract inputs for this machine's devices; returns XLA's
    memory plan and FLOPs.

    xla_flops_per_step is XLA's cost analysis of one device's program times the device count
    (None with gradient accumulation or scanned layers: XLA counts a loop's body once; set
    model.scan_layers=False to have it count the unrolled layers).
    This is the one-step program; the run's calls of train.steps_per_call steps scan it and hold
    about as much (configs/small.py at 32 x 128: 963 MB of temporaries for 4 steps, 945 for 1).
    """
    mesh = checked_mesh(config, process_count=jax.process_count())
    config, auto = _resolved(config, vocab_size, mesh)
    compiled, seconds = _step_compiled(config, vocab_size, mesh, 1)
    cost = _costs(compiled)
    xla_flops = float(cost.get("flops", 0.0)) * mesh.size if cost else None
    if config.train.grad_accum_steps > 1 or config.model.scan_layers:
        xla_flops = None  # XLA counts a loop's body once, not once per micro-batch or layer
    return {
        "devices": mesh.size,
        "mesh": dict(mesh.shape),
        **auto,
        **fit.memory(compiled),
        "xla_flops_per_step": xla_flops,
        # With 'auto', the choice's compiles, the reported program's among them.
        "compile_seconds": round(seconds or auto.get("remat_auto_seconds") or 0.0, 1),
    }


COST_METHOD = (
    "XLA costs a loop's body once, so FLOPs, bytes, optimal_seconds and the compiler's "
    "estimated cycles come from two more compiles of one step with the layers unrolled (1 and 2 "
    "of them) and no accumulation, extrapolated linearly to the config's depth (each layer adds "
    "the same program)"
)


COST_ACROSS_SLICES = (
    "; across slices: costed on one slice with its share of the batch (the compiler has no "
    "cost for the network between slices, whose gradient all-reduce this leaves out)"
)


def _cost_config(config, layers: int, slices: int):
    """The config with `layers` unrolled layers, one step per call, no accumulation, and the
    batch of one of `slices` slices."""
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
        cfg.model.num_layers = layers
        cfg.model.scan_layers = False
        cfg.train.grad_accum_steps = 1
        cfg.train.steps_per_call = 1
        cfg.train.batch_size = config.train.batch_size // slices
    return cfg


# (generation, libtpu version): the TPU compiler of that libtpu dies (SIGSEGV) compiling the
# unrolled one-step programs the ceilings are costed from, where the run's own program compiles
# (TPU7x in libtpu 0.0.42.1: any unscanned layer with dropout). A process cannot survive that,
# so those compiles are left out there, and the summary says why; a newer libtpu tries again.
_COST_COMPILES_CRASH = {("tpu7x", "0.0.42.1")}


def cost_compiles_crash(generation) -> str | None:
    """Why the cost compiles are left out for `generation` with the installed libtpu, or None."""
    try:
        version = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None
    if (generation.name, version) not in _COST_COMPILES_CRASH:
        return None
    return (
        f"libtpu {version}'s compiler crashes on the cost compiles for {generation.name}, "
        "which are left out (the run's own program compiles; another libtpu tries them)"
    )


def step_costs(config, vocab_size: int, mesh) -> dict | None:
    """XLA's per-device flops, bytes accessed and optimal_seconds for one step of `config`,
    and the compiler's estimated cycles (compiled_costs.program_cycles: `cycles`, None when a
    Pallas call states no cost; `kernels`, the Pallas calls a step runs), from unrolled
    compiles (COST_METHOD), on one slice of a multi-slice mesh; None when those do not fit."""
    slices = sharding.num_slices(mesh.devices.flat)
    if slices > 1:
        one = [d for d in mesh.devices.flat if d.slice_index == 0]
        mesh = sharding.make_mesh(config.mesh, one)
    generation = topology.generation_for_kind(mesh.devices.flat[0].device_kind)
    points = []
    for layers in (1, 2):
        cfg = _cost_config(config, layers, slices)
        try:
            compiled, _ = _compile(*_abstract_inputs(cfg, vocab_size, mesh))
        except DoesNotFit:
            return None
        point = _costs(compiled)
        if generation is not None:
            cycles = compiled_costs.program_cycles(compiled.as_text(), generation)
            point["cycles"] = -1.0 if cycles.cycles is None else cycles.cycles
            point["kernels"] = cycles.kernels
            point["uncosted_kernels"] = cycles.uncosted_kernels
            point["unknown_loops"] = cycles.unknown_loops
        points.append(point)
    depth = config.model.num_layers
    keys = ("flops", "bytes accessed", "optimal_seconds", "cycles", "kernels")
    costs = {
        k: points[0].get(k, -1.0) + (depth - 1) * (points[1].get(k, -1.0) - points[0].get(k, -1.0))
        for k in keys
    }
    if generation is None or min(p["cycles"] for p in points) < 0:
        costs["cycles"] = None  # not a TPU, or a program whose time cannot be counted
        costs["uncounted"] = {k: max(p.get(k, 0) for p in points)
                              for k in ("uncosted_kernels", "unknown_loops")}  # fmt: skip
    if min(p.get("optimal_seconds", -1.0) for p in points) <= 0:
        costs["optimal_seconds"] = None  # libtpu has no bound for some programs: see tpu_report
    return costs


def _gib(n: float) -> str:
    return f"{n / topology.GIB:.2f} GiB"


def tpu_report(
    config: ml_collections.ConfigDict,
    vocab_size: int,
    target: topology.Target,
    flops: float,
    costs: bool = True,
) -> dict:
    """Compiles the run's train step with the TPU compiler for `target`'s devices (none of
    them here; nothing allocated): per-device memory against the chip's HBM, XLA's costs and
    the MFU ceiling its optimal_seconds implies for `flops` (the counted FLOPs of one step;
    `costs` False leaves out the cost compiles and the figures from them).

    The program is the one the run calls most: train.steps_per_call steps in one call when
    that is above 1, with the config's mesh, accumulation, scanned layers, remat and dtype.
    DoesNotFit (one line: need, have, what to change) when the step does not fit.
    """
    gen = target.generation
    devices = topology.compile_only_devices(target)
    hosts = len({d.process_index for d in devices})
    mesh = checked_mesh(config, process_count=hosts, devices=devices)
    steps = config.train.steps_per_call
    try:
        with _without_persistent_cache():
            config, auto = _resolved(config, vocab_size, mesh)
            compiled, seconds = _step_compiled(config, vocab_size, mesh, steps)
    except DoesNotFit as e:
        found = re.search(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", str(e))
        need = f"{found.group(1)}G of HBM for temporaries" if found else "more memory"
        have = f"{found.group(2)}G available" if found else f"{_gib(gen.hbm_bytes_per_device)}"
        raise DoesNotFit(
            f"does not fit {target.asked_as} ({gen.name}): a device needs {need}, it has "
            f"{have} (XLA: RESOURCE_EXHAUSTED); try {fit.fix_hint(config, mesh)}"
        ) from None
    memory = fit.memory(compiled)
    hbm = gen.hbm_bytes_per_device
    crashes = costs and cost_compiles_crash(gen)
    asked, t0 = costs and not crashes, time.time()
    with _without_persistent_cache():
        costs = step_costs(config, vocab_size, mesh) if asked else None
    ceiling_seconds = round(time.time() - t0, 1) if asked else None
    peak = gen.bf16_flops_per_device * mesh.size
    cycles = costs and costs["cycles"]
    cycle_seconds = cycles and cycles / gen.clock_hz
    if cycles is None and costs:
        why = costs["uncounted"]
        cycles_from = "none: " + (
            f"{why['uncosted_kernels']} Pallas calls state no cost (pl.CostEstimate)"
            if why["uncosted_kernels"]
            else f"{why['unknown_loops']} instructions run in loops of unstated trip counts"
        )
    elif cycles:
        kernels = round(costs["kernels"])
        cycles_from = "the TPU compiler's estimated cycles of each instruction, at " + (
            f"{gen.clock_hz / 1e6:.0f} MHz ({gen.clock_source})"
        )
        if kernels:
            cycles_from += (
                f"; {kernels} Pallas calls a step, which the compiler gives 0 cycles, costed at "
                "their own roofline: max(their stated FLOPs / peak, their HBM bytes / bandwidth)"
            )
    else:
        cycles_from = "none: no cost compiles, or they do not fit"
    bound, bound_from = None, "none: no cost compiles, or they do not fit"
    if crashes:
        cycles_from = bound_from = f"none: {crashes}"
    if costs and costs["optimal_seconds"]:
        bound, bound_from = costs["optimal_seconds"], "the compiler's optimal_seconds"
    elif costs:
        # libtpu 0.0.42 gives a negative optimal_seconds for some programs (it comes out a
        # whole number of seconds below the others, as if each op it cannot cost took -1 s):
        # the roofline of XLA's own counts stands in, the slower of compute and HBM traffic.
        bound = max(
            costs["flops"] / gen.bf16_flops_per_device,
            costs["bytes accessed"] / gen.hbm_bytes_per_second_per_device,
        )
        bound_from = "a roofline of XLA's FLOPs and bytes (the compiler gave no optimal_seconds)"
    return {
        "platform": "tpu",
        "topology": target.topology_name,
        "device_kind": devices[0].device_kind,
        "chips": target.chips * target.num_slices,
        "devices": mesh.size,
        "hosts": hosts,
        "slices": target.num_slices,
        "mesh": dict(mesh.shape),
        "batch_per_device": config.train.batch_size // sharding.data_parallel_size(mesh),
        "program": f"{steps} steps per call" if steps > 1 else "one step per call",
        **auto,
        **memory,
        "hbm_per_device_bytes": hbm,
        "headroom_bytes": hbm - memory["memory_per_device_bytes"],
        "fits": memory["memory_per_device_bytes"] <= hbm,
        # With 'auto', the choice's compiles, the reported program's among them.
        "compile_seconds": round(seconds or auto.get("remat_auto_seconds") or 0.0, 1),
        # The cost compiles' time: what --noceiling saves (None when they were not asked for).
        "ceiling_compile_seconds": ceiling_seconds,
        "xla_flops_per_step": costs and costs["flops"] * mesh.size,
        "xla_bytes_per_step": costs and costs["bytes accessed"] * mesh.size,
        "optimal_seconds": costs and costs["optimal_seconds"],
        "step_seconds_bound": bound,
        "mfu_ceiling": bound and round(flops / (bound * peak), 4),
        "mfu_ceiling_from": bound_from,
        "estimated_cycles_per_step": cycles and round(cycles),
        "step_seconds_from_cycles": cycle_seconds,
        "mfu_ceiling_cycles": cycle_seconds and round(flops / (cycle_seconds * peak), 4),
        "mfu_ceiling_cycles_from": cycles_from,
        "pallas_calls_per_step": costs and round(costs["kernels"]),
        "cost_method": (
            COST_METHOD + (COST_ACROSS_SLICES if target.num_slices > 1 else "") if costs else None
        ),
        "peak_source": gen.source,
    }
