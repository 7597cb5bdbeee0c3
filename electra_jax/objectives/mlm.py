"""BERT's masked language model as an objective (the paper's baseline): no generator; the
discriminator-sized network reads the masked ids and predicts the originals at the chosen slots.
Shapes as in core.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from electra_jax.objectives.core import FlopParts, Objective, mlm_loss, no_decisions, zero
from electra_jax.objectives.electra import metrics_with


def mlm_sums(batch, corruption, mlm_fn, key) -> dict[str, jax.Array]:
    """BERT's MLM: the discriminator-sized network reads the masked ids (80% [MASK], 10% random,
    10% kept: `corruption_probs`) and predicts the originals at the chosen slots; no
    generator. mlm_fn(ids [B, L], positions [B, N], key) -> ([B, L], [B, N, V] logits)."""
    m = corruption.masked
    _, logits = mlm_fn(m.input_ids, m.positions, key)
    loss, correct = mlm_loss(logits, m.targets, m.weights)
    none = zero()
    return {
        "gen_loss": none,
        "gen_correct": none,
        "gen_count": loss.count,
        "disc_loss": none,
        **no_decisions(batch["input_mask"]),
        "mlm_loss": loss.total,
        "mlm_correct": correct.total,
        "mlm_count": loss.count,
    }


def mlm_objective_loss(sums, denominators, *, gen_weight, disc_weight):
    """The network's MLM mean over the masked slots alone."""
    masked = jnp.maximum(denominators[0], 1.0)
    return sums["mlm_loss"] / masked


def corruption_probs(mask_token_prob: float) -> tuple[float, float]:
    """BERT's 80% [MASK] / 10% random token (10% kept), whatever objective.mask_token_prob."""
    return 0.8, 0.1


def mlm_flops(p: FlopParts) -> tuple[int, int]:
    """No generator: the discriminator-sized network and its MLM head at the slots."""
    return 0, p.discriminator + p.mlm_head_slots


MLM = Objective(
    name="mlm",
    sums=lambda batch, corruption, nets, keys, **_: mlm_sums(batch, corruption, nets.mlm, keys[2]),
    loss=mlm_objective_loss,
    metrics=metrics_with(mlm_objective_loss),
    flops=mlm_flops,
    corruption_probs=corruption_probs,
    mlm_head=True,
    has_generator=False,
    trains_rtd_head=False,
    evaluates_mlm=True,
)
