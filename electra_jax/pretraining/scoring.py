"""Held-out evaluation during pre-training: the compiled evaluation a run keeps (`Evaluator`,
made by `build`), and the readings a workdir holds.

Every `eval.every_steps` and at the last step, the runner evaluates the parameters on the
held-out slice of the prepared data (data/heldout.py) with one compiled program
(optimizer_step.eval_step, the readings in eval_pass.py), and adds the readings to that step's
row of metrics.jsonl and TensorBoard under an `eval/` prefix. `python -m electra_jax.evaluate`
evaluates kept checkpoints the same way, after the fact, into WORKDIR/eval.jsonl;
`read_rows(workdir)` joins both sources.

A mixture's run (data.mixture) holds out rows of every part: the readings over all of them keep
their keys, and each part's own follow as `eval/NAME/...` (NAME: the part's name, mixture.py),
read by the same program on that part's rows, with the same frequent pieces and unigram
distribution (counted on the blend's training rows).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import jax

from electra_jax.data import heldout as heldout_lib
from electra_jax.data import pipeline
from electra_jax.data.shards import PreparedMixture
from electra_jax.model import sharding
from electra_jax.pretraining import eval_pass, metrics
from electra_jax.pretraining.optimizer_step import SpecialTokens, eval_step
from electra_jax.store import filenames, paths

PREFIX = "eval/"
EVAL_FILE = filenames.EVAL_FILE


@dataclasses.dataclass
class Evaluator:
    """The compiled held-out evaluation of one model over one set of held-out batches."""

    program: Any  # compiled (params, [E, B, L] batches, frequent [V], unigram cdf [V]) -> scalars
    batches: dict  # global [E, B, L] arrays
    pieces: tuple  # (frequent: bool [V], unigram_cdf: float32 [V]), replicated
    every: int  # eval.every_steps (0: only when asked)
    compile_seconds: float
    reused: bool = False  # the program was compiled by an earlier run of the same setup
    # A mixture's parts: (name, its program, its [E, B, L] batches) each, read after the whole.
    parts: tuple = ()
    runs: int = 0
    seconds: float = 0.0
    warned: bool = False

    def due(self, step: int, last_step: int) -> bool:
        """Whether the row of `step` gets an evaluation: every `every` steps and at the end."""
        return self.every > 0 and (step % self.every == 0 or step == last_step)

    def run(self, params) -> dict:
        """The held-out readings of `params` as `eval/` keys (None where undefined), with
        `eval/seconds`; logs one warning line the first time the states collapse."""
        t0 = time.time()
        values = jax.device_get(self.program(params, self.batches, *self.pieces))
        parts = [
            (f"{name}/", jax.device_get(program(params, batches, *self.pieces)))
            for name, program, batches in self.parts
        ]
        seconds = time.time() - t0
        self.runs += 1
        self.seconds += seconds
        row = {}
        for name, read in [("", values), *parts]:
            for key, value in read.items():
                value = float(value)
                row[PREFIX + name + key] = value if math.isfinite(value) else None
        row[PREFIX + "seconds"] = seconds
        cosine = row.get(PREFIX + "collapse_cosine")
        if cosine is not None and cosine > eval_pass.COLLAPSE_WARNING and not self.warned:
            self.warned = True
            metrics.log(
                f"warning: the discriminator's states are collapsing (mean cosine {cosine:.2f} "
                f"between held-out tokens, above {eval_pass.COLLAPSE_WARNING}): they all point "
                "one way, which fine-tuning inherits; see docs/ablations.md for the recipe "
                "settings that keep them apart"
            )
        return row


def build(
    *,
    model,
    num_slots: int,
    objective_cfg,
    abstract_params,
    params_sharding,
    mesh,
    prepared,
    heldout_examples: int,
    batch_size: int,
    every: int,
    special: SpecialTokens,
    process_index: int = 0,
    process_count: int = 1,
    compiled: dict | None = None,
) -> Evaluator:
    """The held-out batches on the mesh, the frequent pieces and the unigram distribution of
    the training rows, and the eval step compiled for `params_sharding` (ahead of the first
    use, so its time is its own). `special`: the ids of the tokenizer that made `prepared`.
    `compiled`: the programs of the run's setup (program.StepSetup.compiled), where the eval
    step compiled once is kept for the next run of the same setup in this process. Of a
    shards.PreparedMixture, the held-out rows of every part, and each part's readings too."""
    mixed = isinstance(prepared, PreparedMixture)
    each = [
        pipeline.heldout_batches(part, heldout_examples, batch_size, process_index, process_count)
        for part in (prepared.parts if mixed else [prepared])
    ]
    if not all(each):
        raise ValueError(
            f"data.heldout_examples={heldout_examples} holds no whole batch of {batch_size}"
        )
    batches = sharding.global_batches([b for part in each for b in part], mesh)
    sample = pipeline.training_sample(prepared, heldout_examples)
    vocab = model.spec.vocab_size
    pieces = (
        heldout_lib.frequent_pieces(sample["input_ids"], vocab, tuple(special)),
        heldout_lib.unigram_cdf(sample["input_ids"], vocab, tuple(special)),
    )
    pieces = jax.device_put(pieces, sharding.replicated(mesh))
    fn = jax.jit(
        functools.partial(
            eval_step,
            model=model,
            objective_cfg=objective_cfg,
            num_slots=num_slots,
            special=special,
        ),
        in_shardings=(params_sharding, sharding.stacked_batch_sharding(mesh), None, None),
        out_shardings=sharding.replicated(mesh),
    )
    placed = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        abstract_params,
        params_sharding,
    )
    t0 = time.time()
    # The parts' programs are of one shape (as many held-out rows each): compiled once.
    compiled = {} if compiled is None else compiled
    program, reused = _compiled(fn, placed, batches, pieces, compiled)
    parts = []
    if mixed:
        for name, part in zip(prepared.names, each, strict=True):
            part_batches = sharding.global_batches(part, mesh)
            part_program, _ = _compiled(fn, placed, part_batches, pieces, compiled)
            parts.append((name, part_program, part_batches))
    return Evaluator(program, batches, pieces, every, time.time() - t0, reused, parts=tuple(parts))


def _compiled(fn, placed, batches, pieces, compiled: dict) -> tuple[Any, bool]:
    """(the eval step compiled for `batches`' shapes, whether `compiled` held it already)."""
    # The held-out rows' count is the prepared data's, not the setup's: part of the name.
    name = ("eval", tuple(sorted((k, v.shape) for k, v in batches.items())))
    program = compiled.get(name)
    if program is not None:
        return program, True
    program = fn.lower(placed, batches, *pieces).compile()
    compiled[name] = program
    return program, False


# ------------------------------------------------------------------------------ reading rows


def eval_rows(rows: list[dict]) -> list[dict]:
    """The rows of `rows` that hold held-out readings, as {step, eval/...} dicts."""
    return [
        {"step": r["step"], **{k: v for k, v in r.items() if k.startswith(PREFIX)}}
        for r in rows
        if any(k.startswith(PREFIX) for k in r)
    ]


def read_rows(workdir: str) -> list[dict]:
    """Every held-out reading of a run, by step: those its training logged to metrics.jsonl and
    those `python -m electra_jax.evaluate` wrote to eval.jsonl (which wins for a step both
    hold: it is the later reading)."""
    logged = metrics.read_rows(paths.join(workdir, filenames.METRICS_FILE))
    by_step = {r["step"]: r for r in eval_rows(logged)}
    for r in metrics.read_rows(paths.join(workdir, EVAL_FILE)):
        by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]
