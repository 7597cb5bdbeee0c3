"""The pre-training objectives' names, without jax: validate.py checks objective.name with them
in moments, before jax is imported. registry.py maps each to its module's `Objective`."""

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
DEFAULT = "electra"  # what a config without objective.name trains
