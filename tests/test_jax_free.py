"""The modules listed as jax-free (tests/conftest.py: JAX_FREE_MODULES) import none of jax, flax,
orbax and grain: what the commands' early refusals, prepare's workers and `import electra_jax`
rely on."""

import pytest

from tests.conftest import JAX_FREE_MODULES, heavy_imports_of

# The commands that define their flags at import: absl takes each flag name once a process.
_OWN_FLAGS = ("electra_jax.train", "electra_jax.prepare", "electra_jax.finetune.__main__")


@pytest.mark.parametrize(
    "modules", [tuple(m for m in JAX_FREE_MODULES if m not in _OWN_FLAGS), *_OWN_FLAGS]
)
def test_the_jax_free_modules_import_none_of_the_heavy_ones(modules):
    modules = (modules,) if isinstance(modules, str) else modules
    if heavy_imports_of(*modules):  # one interpreter for them all; then which one did
        culprits = {m: heavy_imports_of(m) for m in modules}
        assert not {m: heavy for m, heavy in culprits.items() if heavy}
