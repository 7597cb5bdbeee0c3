"""compile.cache_dir: where the cache is. That a restart loads the compiled step from it and a
changed config compiles its own is tested with the goodput of a killed and resumed run
(tests/test_goodput.py), which is the same restart."""

import os

from electra_jax.pretraining import compile_cache


def test_the_cache_folder_follows_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    workdir = str(tmp_path / "w")
    assert compile_cache.folder("", workdir) == os.path.join(workdir, "compile_cache")
    assert compile_cache.folder("gs://b/cache", workdir) == "gs://b/cache"
    assert compile_cache.folder("off", workdir) is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/jax_cache")
    assert compile_cache.folder("", workdir) == "/shared/jax_cache"
