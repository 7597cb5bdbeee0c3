"""The pre-training objectives' names, without jax: validate.py checks objective.name with them
in moments, before jax is imported. registry.py maps each to its module's `Objective`."""

from electra_jax.config import pretrain_keys, schema

OBJECTIVES = (
    "electra",
    "mlm",
    "electra_15",
    "replaced_mlm",
    "all_tokens_mlm",
    "two_stage",
    "adversarial",
    "electra_mlm",
)
# What a config without objective.name trains: the schema's default.
DEFAULT = schema.by_name(pretrain_keys.KEYS)["objective.name"].default
