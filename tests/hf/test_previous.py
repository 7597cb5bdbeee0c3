"""hf/previous.py: what an export folder holds before an export writes into it, read without
jax (the export command's refusals of a bad --out rely on it)."""

from tests.conftest import heavy_imports_of


def test_importing_it_imports_neither_jax_nor_flax():
    assert heavy_imports_of("electra_jax.hf.previous") == []
