"""Tests of electra_jax.store.filenames: each name is spelled there and nowhere else in the
package."""

import pathlib

import electra_jax
from electra_jax.config import finetune_keys, pretrain_keys
from electra_jax.config.schema import flatten
from electra_jax.store import filenames

PACKAGE = pathlib.Path(electra_jax.__file__).parent


def _names() -> dict[str, str]:
    return {k: v for k, v in vars(filenames).items() if k.isupper() and isinstance(v, str)}


def test_no_two_names_are_one_file():
    names = _names()
    assert len(set(names.values())) == len(names), names


def test_no_other_module_spells_a_file_name():
    """A quoted name elsewhere would be a second home: a rename here would miss it. Short
    folder names that are also words of configs ("data", "hf", "wandb") are left out."""
    spelled = {v for v in _names().values() if "." in v or len(v) > 5}
    assert {"config.json", "tokenizer", "tensorboard", "checkpoints"} <= spelled
    # The schema declares config keys, some named as the files they point at (fine-tuning's
    # `tokenizer`): a key is not a file name.
    keys = {k.name for k in pretrain_keys.KEYS} | {
        key
        for family in ("glue", "squad")
        for key in flatten(finetune_keys.defaults(family).to_dict())
    }
    found = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if module == pathlib.Path(filenames.__file__):
            continue
        text = module.read_text(encoding="utf-8")
        names = spelled - keys if module.parent.name == "config" else spelled
        found += [f"{module.relative_to(PACKAGE)}: {v}" for v in names if f'"{v}"' in text]
    assert not found, found
