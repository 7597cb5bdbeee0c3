"""Objective name -> its `Objective` (core.py): all the train step, the held-out evaluation and
the FLOP count ask of an objective. Adding one is a module and a line here (and its name in
catalog.py, which validate.py reads without jax); docs/development.md shows it."""

from __future__ import annotations

from electra_jax.config import pretrain_keys, schema
from electra_jax.objectives import ablations, adversarial, electra, electra_mlm, mlm, two_stage
from electra_jax.objectives.catalog import OBJECTIVES
from electra_jax.objectives.core import Objective

REGISTRY: dict[str, Objective] = {
    o.name: o
    for o in (
        electra.ELECTRA,
        mlm.MLM,
        ablations.ELECTRA_15,
        ablations.REPLACED_MLM,
        ablations.ALL_TOKENS_MLM,
        two_stage.TWO_STAGE,
        adversarial.ADVERSARIAL,
        electra_mlm.ELECTRA_MLM,
    )
}


def get(name: str) -> Objective:
    """The objective called `name` (config.objective.name); ValueError for another name."""
    if name not in REGISTRY:
        raise ValueError(f"objective.name={name!r}: use one of {', '.join(OBJECTIVES)}")
    return REGISTRY[name]


def _section(objective_cfg) -> dict:
    """An objective section (a ConfigDict or a config.json's dict) with the keys it lacks as the
    schema says a config without them meant (schema.upgrade: 'electra', no MLM term)."""
    return schema.upgrade({"objective": dict(objective_cfg)}, pretrain_keys.KEYS)["objective"]


def of_config(objective_cfg) -> Objective:
    """The objective an objective section (a ConfigDict or a config.json's dict) names."""
    return get(_section(objective_cfg)["name"])


def model_heads(objective_cfg) -> dict[str, bool]:
    """The heads the model needs for an objective section: spec_from_config's mlm_head and
    policy_baseline."""
    section = _section(objective_cfg)
    objective = get(section["name"])
    return {
        "mlm_head": objective.needs_mlm_head(section["disc_mlm_weight"]),
        "policy_baseline": objective.policy_baseline,
    }
