r"""What the TPU compiler says holds a step: its compiled program's instructions ranked by the
compiler's own cost estimate, grouped by the part of the model they come from.

    python -m benchmarks.hlo_costs --config=configs/base.py --topology=v4-16

Compiles (on a machine without a TPU, like --dry_run --topology) the program the MFU ceiling is
costed from (electra_jax/pretraining/dry_run.py, COST_METHOD): one step with `--layers` layers
unrolled and no accumulation. Every top-level instruction of the optimized program carries the TPU
compiler's `estimated_cycles` in its backend config; this prints their sum and the bytes each reads
and writes (its operands and results, as XLA's cost analysis counts them), by part of the
model (from each instruction's op_name: network, layer part, forward or backward) and the
largest instructions one by one. --hlo=FILE also writes the optimized program's text.
--layer=N compiles one discriminator layer alone instead (forward and backward, N rows a
device, for one device of the slice): a change to a layer measured in minutes, not the step.
--set SECTION.KEY=VALUE changes the config (repeatable), as train.py's --config.SECTION.KEY.
The JSON line names the remat policy compiled (train.remat='auto' is chosen for the step as the
run chooses it, and is 'none' for --layer: --set train.remat=POLICY compiles the layer under
another) and the program's memory per device (dry_run's fields); with --layer, also
layer_kept_bytes: what the layer keeps for its backward pass (`layer_kept_bytes`).
"""

from __future__ import annotations

import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402

# Parts of the model: (what an instruction's op_name holds, the part's name), looked for in
# this order. attention._einsum is kernels.attention_core (scores, softmax, dropout, context);
# attention/ alone, the q/k/v and output projections and the moves of heads between them (with
# the slash: attention_LayerNorm is the layer norm's, attention_dropout no part's);
# attention._pallas is the Pallas kernels' (flash_attention), the same function as _einsum's.
PARTS = (("attention._einsum", "attention_core"), ("attention._pallas", "attention_core"),
         ("attention/", "attention_projections"),
         ("intermediate", "ffn"), ("output_LayerNorm", "layer_norm"), ("/output/", "ffn"),
         ("attention_LayerNorm", "layer_norm"), ("_generator_head", "mlm_head"),
         ("_replaced_logits", "rtd_head"), ("embeddings", "embeddings"))  # fmt: skip


def part(op_name: str) -> str:
    """'generator/attention/backward' and the like: the network, the part of it and the
    direction an instruction's op_name names ('other' where it names no part)."""
    network = next((n for n in ("generator", "discriminator") if n in op_name), "")
    found = next((name for pattern, name in PARTS if pattern in op_name), "")
    if not found:
        return "other"
    direction = "backward" if "transpose(" in op_name else "forward"
    return "/".join(filter(None, (network, found, direction)))


def by_part(rows: list[dict], generation, flops: list[tuple[str, float]] = ()) -> list[dict]:
    """{part, cycles, bytes, flops, instructions, kernels} per part, the most cycles first.

    rows: compiled_costs.instructions of the optimized program; cycles are each row's
    compiled_costs.row_cycles on `generation` (a Pallas call at its roofline), bytes each run
    counted. flops: compiled_costs.matmul_flops of the lowered program (the matmuls by source
    name), to which each Pallas call's stated FLOPs are added.
    """
    from electra_jax.pretraining import compiled_costs

    zero = {"cycles": 0.0, "bytes": 0, "flops": 0.0, "instructions": 0, "kernels": 0}
    sums = collections.defaultdict(lambda: dict(zero))
    for r in rows:
        s = sums[part(r["op_name"])]
        s["cycles"] += compiled_costs.row_cycles(r, generation)
        s["bytes"] += r["bytes"] * r["repeat"]
        s["instructions"] += 1
        if r["kernel_target"]:
            s["kernels"] += r["repeat"]
            s["flops"] += (r["kernel"] or {}).get("flops", 0.0) * r["repeat"]
    for op_name, count in flops:
        sums[part(op_name)]["flops"] += count
    return sorted(({"part": k, **v} for k, v in sums.items()), key=lambda s: -s["cycles"])


def share_of_peak(flops: float, cycles: float, generation) -> float | None:
    """FLOPs over the time `cycles` take at the clock, as a share of one device's peak."""
    if not cycles:
        return None
    return flops / (cycles / generation.clock_hz * generation.bf16_flops_per_device)


def _compiled(config, topology_name: str, layers: int):
    from electra_jax.pretraining import dry_run, topology
    from electra_jax.pretraining.program import checked_mesh

    target = topology.resolve(topology_name)
    devices = topology.compile_only_devices(target)
    mesh = checked_mesh(
        config, process_count=len({d.process_index for d in devices}), devices=devices
    )
    cfg = dry_run._cost_config(config, layers, 1)
    with dry_run._without_persistent_cache():
        cfg, _ = dry_run._resolved(cfg, config.data.vocab_size, mesh)  # train.remat='auto'
        lowered, compiled, seconds = dry_run.lower_and_compile(
            *dry_run._abstract_inputs(cfg, config.data.vocab_size, mesh)
        )
    return lowered, compiled, seconds, cfg.train.remat


def _layer_program(config, topology_name: str, batch_per_device: int):
    """(loss, its abstract arguments on one device of the slice) for `layer_compiled`."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from electra_jax.model.networks import layer_class, spec_from_config
    from electra_jax.pretraining import topology

    device = topology.compile_only_devices(topology.resolve(topology_name))[0]
    spec = spec_from_config(config.model, config.generator, config.data.vocab_size,
                            config.train.remat)  # fmt: skip
    spec = dataclasses.replace(spec, platform=device.platform)
    layer = layer_class(spec)(spec, spec.discriminator)  # under the config's remat policy
    shape = (batch_per_device, config.data.seq_length, spec.discriminator.hidden_size)
    bias = (batch_per_device, 1, 1, config.data.seq_length)  # the padding mask's, an input
    keys = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
    # `deterministic` positional: nn.remat takes it as a static argument by its position.
    params = jax.eval_shape(lambda: layer.init(keys, jnp.zeros(shape), jnp.zeros(bias), False))

    def loss(params, x, bias, key):
        y = layer.apply(params, x, bias, False, rngs={"dropout": key})
        return jnp.sum(y.astype(jnp.float32) ** 2)

    on = jax.sharding.SingleDeviceSharding(device)
    # The layer's input in the compute dtype, as the Encoder hands it one (the embeddings and
    # every layer end in a cast to model.dtype): a float32 input would make the bfloat16 layer
    # convert it, add its residual and return its gradient in float32, which no model layer does.
    abstract = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on),
        (
            params,
            jax.ShapeDtypeStruct(shape, jnp.dtype(spec.dtype)),
            jax.ShapeDtypeStruct(bias, jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.uint32),
        ),  # fmt: skip
    )
    return loss, abstract


def layer_compiled(config, topology_name: str, batch_per_device: int):
    """One discriminator layer of `config` (its TransformerLayer with the config's width,
    heads, dtype, dropout and remat policy), forward and backward of the sum of its squared
    outputs, at `batch_per_device` rows of data.seq_length, compiled for one device of the
    slice: (lowered, compiled, seconds)."""
    import jax

    from electra_jax.pretraining import dry_run

    loss, abstract = _layer_program(config, topology_name, batch_per_device)
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    with dry_run._without_persistent_cache():
        return dry_run.lower_and_compile(step, *abstract)


def layer_kept_bytes(config, topology_name: str, batch_per_device: int) -> int:
    """What one layer keeps from its forward pass for its backward under the config's remat
    policy, by jax's count (jax.ad_checkpoint.saved_residuals; its parameters left out, its
    input counted): in a stack of layers each keeps this much until its backward runs, where
    the compiler's temporaries of one layer alone do not show it."""
    # The list print_saved_residuals prints, as data: jax exports only the printing.
    from jax._src.ad_checkpoint import saved_residuals

    loss, abstract = _layer_program(config, topology_name, batch_per_device)
    kept = saved_residuals(loss, *abstract)
    return sum(
        aval.size * aval.dtype.itemsize
        for aval, source in kept
        if not source.startswith("from the argument params")
    )


def main() -> None:
    parser = _cli.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/base.py", help="a pre-training config")
    parser.add_argument("--topology", default="v4-16", help="a TPU slice, as --dry_run takes")
    parser.add_argument("--layers", type=_cli.positive_int, default=1, help="layers unrolled")
    parser.add_argument("--top", type=_cli.natural_int, default=25, help="instructions listed")
    parser.add_argument("--set", action="append", default=[], help="SECTION.KEY=VALUE")
    parser.add_argument("--hlo", default="", help="write the optimized program's text here")
    parser.add_argument(
        "--layer",
        type=_cli.natural_int,
        default=0,
        help="N > 0: one discriminator layer alone at N rows a device, not the step",
    )
    args = parser.parse_args()
    config = _cli.config("--config", args.config)
    with config.unlocked():
        for item in _cli.settings("--set", args.set):
            _cli.set_field("--set", config, item, sections=True)
    _cli.checked(config)
    from electra_jax.pretraining import dry_run, fit, topology

    with _cli.failures("--topology"):
        topology.resolve(args.topology)
        topology.require_libtpu()
    with _cli.failures(""):
        if args.layer:
            if config.train.remat == "auto":
                # A whole step's choice; one layer has none to make. As the config stands, the
                # layer without remat: --set train.remat=POLICY measures another.
                with config.unlocked():
                    config.train.remat = "none"
            lowered, compiled, seconds = layer_compiled(config, args.topology, args.layer)
            remat = config.train.remat
        else:
            lowered, compiled, seconds, remat = _compiled(config, args.topology, args.layers)
    hlo = compiled.as_text()
    if args.hlo:
        from electra_jax.store import jsonio

        jsonio.write_atomic(args.hlo, hlo)
    from electra_jax.pretraining import compiled_costs

    generation = topology.resolve(args.topology).generation
    rows = compiled_costs.instructions(hlo)
    program = compiled_costs.program_cycles(hlo, generation)
    flops = compiled_costs.matmul_flops(lowered.as_text(debug_info=True))
    if not args.layer:
        # The lowered step is the whole mesh's program and the compiled one a device's: each
        # device runs its share of the batch's matmuls (data and FSDP split them evenly).
        share = len(topology.compile_only_devices(topology.resolve(args.topology)))
        flops = [(name, f / share) for name, f in flops]
    parts = by_part(rows, generation, flops)
    costs = dry_run._costs(compiled)
    matmul_flops = sum(s["flops"] for s in parts)
    print(json.dumps({
        "config": args.config, "topology": args.topology,
        **({"layer_rows": args.layer} if args.layer else {"layers": args.layers}),
        "compile_seconds": round(seconds, 1),
        "estimated_cycles": program.cycles, "compiler_cycles": program.compiler_cycles,
        "pallas_calls": program.kernels, "pallas_roofline_cycles": round(program.kernel_cycles),
        "uncosted_pallas_calls": program.uncosted_kernels,
        "clock_hz": generation.clock_hz, "matmul_flops": matmul_flops,
        "share_of_peak": program.cycles and share_of_peak(matmul_flops, program.cycles, generation),
        "xla_flops": costs.get("flops"), "xla_bytes_accessed": costs.get("bytes accessed"),
        "remat": remat, **fit.memory(compiled),
        **({"layer_kept_bytes": layer_kept_bytes(config, args.topology, args.layer)}
           if args.layer else {}),
    }))  # fmt: skip
    if program.kernels:
        print(f"({program.kernels} Pallas calls, which the compiler gives 0 cycles, are costed at "
              "their own roofline from their stated FLOPs and bytes)")  # fmt: skip
    print(f"{'part':46s} {'Mcycles':>8s} {'GB':>7s} {'GFLOP':>8s} {'of peak':>7s} {'instr':>6s}")
    for s in parts:
        share = share_of_peak(s["flops"], s["cycles"], generation)
        share_text = "" if share is None else f"{100 * share:.0f}%"
        print(f"{s['part'] + (' (Pallas)' if s['kernels'] else ''):46s} "
              f"{s['cycles'] / 1e6:8.2f} {s['bytes'] / 1e9:7.2f} {s['flops'] / 1e9:8.1f} "
              f"{share_text:>7s} {s['instructions']:6d}")  # fmt: skip
    print(f"\n{'kcycles':>8s} {'GB':>6s} {'op':12s} {'result':44s} where")
    ranked = sorted(rows, key=lambda r: -compiled_costs.row_cycles(r, generation))
    for r in ranked[: args.top]:
        where = r["op_name"].removeprefix("jit(guarded_train_step)/")
        print(f"{compiled_costs.row_cycles(r, generation) / 1e3:8.0f} {r['bytes'] / 1e9:6.3f} "
              f"{r['op']:12s} {r['shape'][:44]:44s} {where}")  # fmt: skip


if __name__ == "__main__":
    _cli.run(main)
