"""compile.cache_dir: a restart loads the compiled step from jax's persistent cache, and a changed
config compiles its own. Told by jax's cache hits (the first row's compile_cache_hits) and the
cache's entries, not by timing."""

import os
import signal

import pytest

from electra_jax.pretraining import compile_cache, metrics
from tests import held
from tests.conftest import micro_config_file
from tests.pretraining.test_runner import prepare_shared_data
from tests.test_goodput import run, train_command


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def _entries(cache) -> set[str]:
    return {n for n in os.listdir(cache) if n.endswith("-cache")} if cache.exists() else set()


def _finish(proc) -> str:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return err


@pytest.mark.slow
def test_a_restart_loads_the_step_and_a_changed_config_compiles(shared_data, tmp_path):
    cache = tmp_path / "cache"
    settings = {
        "train.num_steps": 4,
        "train.steps_per_call": 1,
        "checkpoint.every_steps": 2,
        "compile.cache_dir": str(cache),
    }
    config = micro_config_file(tmp_path / "config.py", shared_data)
    workdir, hold_dir = tmp_path / "w", tmp_path / "hold"
    hold_dir.mkdir()
    # Preempted after step 3 (SIGTERM while held after step 2): a checkpoint, then exit 0.
    first = run(train_command(config, workdir, settings, hold_dir, "step=2"))
    held.wait_held(hold_dir, first)
    first.send_signal(signal.SIGTERM)
    held.release(hold_dir)
    _finish(first)
    compiled = _entries(cache)
    assert compiled  # the step, written by the first start
    err = _finish(run(train_command(config, workdir, settings)))
    assert "compiled the train step in" in err and "(from the compilation cache)" in err, err
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    starts = [r for r in rows if "restore_sec" in r]
    assert len(starts) == 2
    assert "compile_cache_hits" not in starts[0] and starts[1]["compile_cache_hits"] >= 1
    assert _entries(cache) == compiled  # nothing new to write

    # Another model: its step is not in the cache; it is compiled and written there.
    other = {**settings, "model.intermediate_size": 96}
    err = _finish(run(train_command(config, tmp_path / "other", other)))
    assert "(from the compilation cache)" not in err
    (row, *_) = metrics.read_rows(str(tmp_path / "other" / "metrics.jsonl"))
    assert "compile_cache_hits" not in row
    assert _entries(cache) > compiled


def test_the_cache_folder_follows_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    workdir = str(tmp_path / "w")
    assert compile_cache.folder("", workdir) == os.path.join(workdir, "compile_cache")
    assert compile_cache.folder("gs://b/cache", workdir) == "gs://b/cache"
    assert compile_cache.folder("GS://b/cache/", workdir) == "gs://b/cache"  # as etils reads it
    assert compile_cache.folder("off", workdir) is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/jax_cache")
    assert compile_cache.folder("", workdir) == "/shared/jax_cache"
