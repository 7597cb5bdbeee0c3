"""The fine-tuning keys: each family's table in its config's order, what complete() leaves to the
family check, and the resume rule fine-tuning reads from them."""

import ml_collections

from electra_jax.config import finetune_keys, schema
from tests.conftest import load_config


def test_each_family_config_is_its_tables_defaults_and_passes_its_rules():
    for family in ("glue", "squad"):
        config = load_config(family)
        assert config.to_dict() == finetune_keys.defaults(family).to_dict()
        schema.check_values(config, finetune_keys.TABLES[family], prefix="config.")
        for key in finetune_keys.TABLES[family]:
            assert key.doc and key.resume in (schema.FREE, schema.ALLOW, schema.KEEP), key.name


def test_a_key_both_families_have_differs_only_where_squad_says():
    glue, squad = (schema.by_name(finetune_keys.TABLES[f]) for f in ("glue", "squad"))
    assert glue["seq_length"].default == 128 and squad["seq_length"].default == 512
    assert glue["num_epochs"].rule == ">= 0" and squad["num_epochs"].rule == "> 0"
    assert glue["adam_eps"] == squad["adam_eps"]


def test_complete_leaves_a_familys_own_keys_to_the_family_check():
    config = load_config("glue")
    with config.unlocked():
        config.family = "squad"
        del config["dropout_rate"]
    done = finetune_keys.complete(config)
    assert done.dropout_rate == 0.1  # a key both have: filled in
    assert "version" not in done and "doc_stride" not in done  # SQuAD's own: still missing
    unknown = ml_collections.ConfigDict({"family": "ner"})
    assert finetune_keys.complete(unknown) is unknown


def test_the_resume_rule_of_a_fine_tuning():
    assert set(finetune_keys.free_on_resume()) == {
        "checkpoint.every_steps",
        "checkpoint.keep",
        "log_every_steps",
    }
    assert set(finetune_keys.allowed_changes()) == {"data_dir", "init_from"}
    assert all(finetune_keys.allowed_changes().values())  # each says what it lets differ
