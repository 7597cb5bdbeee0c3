"""What the TPU compiler says a compiled program costs, instruction by instruction.

libtpu writes its own cost model into the optimized program: every top-level instruction (a
fusion, a copy, a collective) carries `estimated_cycles` in its backend config. Their sum, over
the entry computation and the computations it runs (a loop's body as many times as its known
trip count), is the compiler's model of the program's time in cycles of the chip's clock; at
`Generation.clock_hz` that is a time, and the counted FLOPs over that time and the peak give an
MFU ceiling that, unlike a roofline of XLA's totals, sees each instruction's own efficiency
(a relayout copy that moves bytes at a fraction of the bandwidth, a matmul too narrow for the
MXUs).

A Pallas (Mosaic) kernel's custom call gets 0 estimated cycles, which would make any ceiling
from cycles look better for nothing; so each one is costed here at its own roofline,
max(FLOPs / peak, HBM bytes / bandwidth), from the cost estimate the kernel states
(`pl.CostEstimate`, which jax writes into the call's backend config and XLA's cost analysis
adds to its totals). A kernel that states none cannot be costed, and the program then has no
ceiling from cycles (`ProgramCycles.uncosted_kernels`).

`matmul_flops` counts the FLOPs of every dot_general of a lowered (not yet optimized) program by
its source location, for a table by part of the model: the optimized program fuses and rewrites
dots into convolutions whose FLOPs are not written anywhere.

Imports no jax: it reads program text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
          "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}  # fmt: skip
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
# Instructions that move no data of their own (or only name another's); a loop or a call is
# costed by what its computations run.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
         "conditional", "after-all", "opt-barrier"}  # fmt: skip
# The custom call of a Pallas TPU (Mosaic) kernel.
PALLAS_TARGET = "tpu_custom_call"


def shape_bytes(text: str) -> int:
    """Bytes of every array shape written in `text` ('f32[2,3]' is 24; tuples add up)."""
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        total += math.prod(int(d) for d in filter(None, dims.split(","))) * _BYTES[dtype]
    return total


def _computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    """({name: its instruction lines}, the entry's name) of an HLO module's text."""
    computations, entry, current = {}, None, None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations[header.group(2)] = []
            if header.group(1):
                entry = header.group(2)
        elif current is not None and line.startswith("  "):
            current.append(line)
    return computations, entry


def _split_operands(rest: str) -> tuple[str, str]:
    """An instruction's text after its opening parenthesis -> (operands, attributes)."""
    depth, end = 1, 0
    while end < len(rest) and depth:
        depth += {"(": 1, ")": -1}.get(rest[end], 0)
        end += 1
    return rest[: end - 1], rest[end:]


def _kernel_cost(attributes: str) -> dict | None:
    """The cost estimate a Pallas call states in its backend config ({flops, transcendentals,
    bytes_accessed} as numbers), or None where it states none."""
    found = re.search(r'"cost_estimate":(\{[^{}]*\})', attributes)
    if not found:
        return None
    cost = json.loads(found.group(1))
    return {k: float(cost.get(k, 0)) for k in ("flops", "transcendentals", "bytes_accessed")}


def instructions(hlo: str) -> list[dict]:
    """The instructions an optimized program runs, each once per time it runs.

    Walks the entry computation and what it runs (loop bodies and conditions, called
    computations; not the insides of fusions). Each row: name, op, shape (its result's), cycles
    (the compiler's estimated_cycles; 0 where it gives none), bytes (operands and results, as
    XLA's cost analysis counts them), op_name (the source's name stack), repeat (how many times
    it runs: the product of the known trip counts of the loops around it; 1 outside loops),
    in_unknown_loop (inside a loop whose trip count the program does not state: its repeat
    counts that loop once), kernel (a Pallas call's stated cost, else None; kernel_target is
    True for every Pallas call, costed or not).
    """
    computations, entry = _computations(hlo)
    rows: list[dict] = []

    def walk(name: str, repeat: int, seen: tuple[str, ...], unknown: bool) -> None:
        lines = computations.get(name, [])
        parsed = [m.groups() for m in map(_INSTRUCTION.match, lines) if m]
        sizes = {inst: shape_bytes(shape) for inst, shape, _, _ in parsed}
        for inst, shape, op, rest in parsed:
            operands, attributes = _split_operands(rest)
            if op in ("while", "call", "conditional"):
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', attributes)
                times = repeat * (int(trips.group(1)) if trips and op == "while" else 1)
                inner_unknown = unknown or (op == "while" and not trips)
                targets = re.findall(
                    r"\b(?:body|condition|to_apply|true_computation|false_computation)="
                    r"%?([\w.\-]+)",
                    attributes,
                )
                targets += re.findall(r"%([\w.\-]+)", _braced(attributes, "branch_computations"))
                for target in dict.fromkeys(targets):
                    if target in computations and target not in seen:
                        walk(target, times, (*seen, target), inner_unknown)
                continue
            if op in _FREE:
                continue
            read = sum(sizes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", operands))
            cycles = re.search(r'"estimated_cycles":"(\d+)"', attributes)
            op_name = re.search(r'op_name="([^"]*)"', attributes)
            pallas = op == "custom-call" and f'custom_call_target="{PALLAS_TARGET}"' in attributes
            rows.append({
                "name": inst,
                "op": op,
                "shape": shape.split("{")[0],
                "cycles": int(cycles.group(1)) if cycles else 0,
                "bytes": read + shape_bytes(shape),
                "op_name": op_name.group(1) if op_name else "",
                "repeat": repeat,
                "in_unknown_loop": unknown,
                "kernel_target": pallas,
                "kernel": _kernel_cost(attributes) if pallas else None,
            })  # fmt: skip

    if entry is not None:
        walk(entry, 1, (entry,), False)
    return rows


def _braced(text: str, key: str) -> str:
    """The `{...}` that follows `key=` in an instruction's attributes ('' where absent)."""
    found = re.search(re.escape(key) + r"=\{([^}]*)\}", text)
    return found.group(1) if found else ""


def kernel_cycles(cost: dict, generation) -> float:
    """A Pallas call's cycles at its own roofline on one device of `generation` (a
    topology.Generation): max(its FLOPs / the peak, its HBM bytes / the bandwidth) in seconds,
    times the clock. The kernel is assumed as fast as the chip allows: a ceiling, not a time."""
    seconds = max(
        cost["flops"] / generation.bf16_flops_per_device,
        cost["bytes_accessed"] / generation.hbm_bytes_per_second_per_device,
    )
    return seconds * generation.clock_hz


def row_cycles(row: dict, generation) -> float:
    """One instruction's cycles, each run counted: the compiler's estimate, or for a Pallas call
    its roofline (0 for a Pallas call that states no cost: see uncosted_kernels)."""
    if row["kernel_target"]:
        cycles = kernel_cycles(row["kernel"], generation) if row["kernel"] else 0.0
    else:
        cycles = row["cycles"]
    return cycles * row["repeat"]


@dataclasses.dataclass(frozen=True)
class ProgramCycles:
    """An optimized program's time by the compiler's model, in cycles of one device.

    cycles: compiler_cycles + kernel_cycles, or None where the program's time cannot be
    counted: a Pallas call states no cost, or a loop does not state its trip count (the cost
    programs of the dry run have no loop: their layers are unrolled and they run one step);
    compiler_cycles: the sum of every instruction's estimated_cycles, each run counted;
    kernels: the Pallas calls run, kernel_cycles their rooflines' sum, uncosted_kernels those
    that state no cost; unknown_loops: instructions inside loops of unstated trip counts.
    """

    cycles: float | None
    compiler_cycles: float
    kernels: int
    kernel_cycles: float
    uncosted_kernels: int
    unknown_loops: int


def program_cycles(hlo: str, generation) -> ProgramCycles:
    """The compiler's model of an optimized TPU program's time on `generation`'s devices."""
    rows = instructions(hlo)
    compiler = sum(r["cycles"] * r["repeat"] for r in rows if not r["kernel_target"])
    kernels = [r for r in rows if r["kernel_target"]]
    kernel = sum(row_cycles(r, generation) for r in kernels)
    uncosted = sum(r["repeat"] for r in kernels if r["kernel"] is None)
    unknown = sum(1 for r in rows if r["in_unknown_loop"])
    return ProgramCycles(
        cycles=None if uncosted or unknown else compiler + kernel,
        compiler_cycles=compiler,
        kernels=sum(r["repeat"] for r in kernels),
        kernel_cycles=kernel,
        uncosted_kernels=uncosted,
        unknown_loops=unknown,
    )


# ------------------------------------------------------------------ FLOPs of a lowered program

_LOC_NAME = re.compile(r'^#(loc\d*) = loc\("((?:[^"\\]|\\.)*)"')
_LOC_CALLSITE = re.compile(r"^#(loc\d*) = loc\(callsite\(#(loc\d*) at ")
_LOC_FUSED = re.compile(r"^#(loc\d*) = loc\(fused\[#(loc\d*)")
_FUNC = re.compile(r"^\s*func\.func (?:public |private )?@([\w.\-$]+)\(")
_CALL = re.compile(r"(?:func\.)?call @([\w.\-$]+)\(.*?(?:loc\(#(loc\d*)\))?\s*$")
_DOT = re.compile(
    r"stablehlo\.dot_general .*?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\].*?"
    r": \((tensor<[^>]*>), tensor<[^>]*>\) -> (tensor<[^>]*>)(?:.*loc\(#(loc\d*)\))?"
)


def _dims(tensor: str) -> list[int]:
    """tensor<32x512x768xbf16> -> [32, 512, 768] (a scalar tensor<f32> -> [])."""
    return [int(d) for d in tensor.removeprefix("tensor<").split("x")[:-1]]


def matmul_flops(lowered_text: str) -> list[tuple[str, float]]:
    """(source name, FLOPs) of every dot_general a lowered program runs, each time it runs.

    `lowered_text` is `jax.jit(f).lower(...).as_text(debug_info=True)` (StableHLO with source
    locations). A dot's FLOPs are 2 x its result's elements x the contracted elements; a
    function called twice counts twice. Pallas calls are left out (their FLOPs are their stated
    cost: `instructions`' kernel).
    """
    names, aliases = {}, {}
    for line in lowered_text.splitlines():
        if m := _LOC_NAME.match(line):
            names[m.group(1)] = m.group(2)
        elif m := _LOC_CALLSITE.match(line) or _LOC_FUSED.match(line):
            aliases[m.group(1)] = m.group(2)

    def name(loc: str | None) -> str:
        for _ in range(64):  # a chain of callsites ends at a named location
            if loc is None or loc in names:
                break
            loc = aliases.get(loc)
        return names.get(loc, "") if loc else ""

    functions: dict[str, dict] = {}
    current = None
    for line in lowered_text.splitlines():
        if m := _FUNC.match(line):
            current = functions[m.group(1)] = {"dots": [], "calls": []}
            continue
        if current is None:
            continue
        if m := _DOT.search(line):
            contracting = [int(i) for i in m.group(1).replace(" ", "").split(",") if i]
            lhs, result = _dims(m.group(2)), _dims(m.group(3))
            flops = 2.0 * math.prod(result) * math.prod(lhs[i] for i in contracting)
            current["dots"].append((name(m.group(4)), flops))
        elif m := _CALL.search(line):
            current["calls"].append((m.group(1), name(m.group(2))))

    out: list[tuple[str, float]] = []

    def expand(fn: str, prefix: str, depth: int) -> None:
        # A called function's locations name its ops from its own start: the call's name
        # stack comes first.
        if fn not in functions or depth > 64:
            return
        out.extend((prefix + dot_name, flops) for dot_name, flops in functions[fn]["dots"])
        for callee, call_name in functions[fn]["calls"]:
            expand(callee, f"{prefix}{call_name}/" if call_name else prefix, depth + 1)

    expand("main", "", 0)
    return out
