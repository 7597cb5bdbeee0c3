"""ELECTRA with BERT's MLM on the discriminator ('electra_mlm'): ELECTRA's step, plus a second
pass of the discriminator-sized network over the generator's masked input (the [MASK] tokens
say where to predict), its MLM head predicting the originals at the masked slots, weighted by
objective.disc_mlm_weight (faded to 0 over objective.disc_mlm_steps when set, as 'electra''s).

Why a second pass: 'electra' with objective.disc_mlm_weight > 0 predicts the originals from the
corrupted sequence it reads for detection, a harder task than MLM's (no [MASK] marks the slot,
the generator's sample sits there); at small compute that term raised the reading of context
but not the features (benchmarks/studies/compute_sweep/NOTES.md, third part), while MLM alone is
the objective whose linear probe moves. This objective asks whether detection on top of MLM's
own task adds to it at equal counted FLOPs; the second pass is counted (about 1.9x ELECTRA's
step at tiny.py's shape). Shapes as in core.py.
"""

from __future__ import annotations

import jax

from electra_jax.objectives.core import FlopParts, Networks, Objective, mlm_loss
from electra_jax.objectives.electra import ELECTRA, electra_metrics


def electra_mlm_sums(
    batch, corruption, nets: Networks, keys, *, temperature=1.0, sampler="inverse_cdf"
) -> dict[str, jax.Array]:
    """ELECTRA's sums (the discriminator reading the corrupted ids) plus `disc_mlm_loss` and
    `disc_mlm_correct`: the MLM head at the masked slots of a second pass over the masked ids
    (nets.mlm(ids [B, L], positions [B, N], key) -> (_, logits [B, N, V])), its own dropout."""
    detection = nets._replace(mlm=None)  # 'electra''s step, its discriminator alone
    sums = ELECTRA.sums(
        batch, corruption, detection, keys, temperature=temperature, sampler=sampler
    )
    m = corruption.masked
    _, logits = nets.mlm(m.input_ids, m.positions, jax.random.fold_in(keys[2], 1))
    loss, correct = mlm_loss(logits, m.targets, m.weights)
    return {**sums, "disc_mlm_loss": loss.total, "disc_mlm_correct": correct.total}


def electra_mlm_flops(p: FlopParts) -> tuple[int, int]:
    """ELECTRA's parts (the discriminator and its replaced-token head at every token), plus the
    second pass: the encoder at every token and the MLM head at the slots."""
    return p.generator, p.discriminator + p.rtd_head + p.discriminator + p.mlm_head_slots


ELECTRA_MLM = Objective(
    name="electra_mlm",
    sums=electra_mlm_sums,
    loss=ELECTRA.loss,  # adds disc_mlm_weight x the MLM mean, as for 'electra''s own term
    metrics=electra_metrics,
    flops=electra_mlm_flops,
    begin_step=ELECTRA.begin_step,
    mlm_head=True,
    evaluates_mlm=True,  # held-out mlm_accuracy, comparable with 'mlm''s
    mlm_reads_masked=True,
)
