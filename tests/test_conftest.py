"""The suite's own helpers: what keeps its shared compilation cache whole, what its workers
share, and the order they take the tests in."""

import os
import subprocess
import sys
import zlib

import pytest

from tests.conftest import (
    ROOT,
    built_once,
    drop_cut_cache_entries,
    run_python,
    slow_first,
    subprocess_env,
)


def test_entries_cut_short_are_dropped_and_whole_ones_kept(tmp_path):
    whole = zlib.compress(b"an executable" * 1000)
    (tmp_path / "jit_step-aaa-cache").write_bytes(whole)
    (tmp_path / "jit_step-bbb-cache").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "jit_step-ccc-cache").write_bytes(b"not zlib at all")
    (tmp_path / "jit_step-aaa-atime").write_bytes(b"12345678")  # not an entry: left alone
    assert drop_cut_cache_entries(str(tmp_path)) == ["jit_step-bbb-cache", "jit_step-ccc-cache"]
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["jit_step-aaa-atime", "jit_step-aaa-cache"]
    assert drop_cut_cache_entries(str(tmp_path / "missing")) == []


# Compiles a small program with the cache in argv[1]; prints the file size limit, then "hit" or
# "miss" as jax's cache monitoring reports it.
_PROBE = """
import resource, sys
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None
)
print(resource.getrlimit(resource.RLIMIT_FSIZE)[0])
jax.jit(lambda x: x * 3.0 + 1.0)(jax.numpy.ones(7)).block_until_ready()
print("hit" if hits else "miss")
"""


def _probe(cache, limit: int = 0) -> list[str]:
    out = run_python("-c", _PROBE, str(cache), timeout=120, file_size_limit=limit)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_a_command_under_a_file_size_limit_reads_the_cache_and_writes_nothing_to_it(tmp_path):
    # A file size limit cuts jax's write of a new entry short (the cause of the entries above).
    cache = tmp_path / "cache"
    assert _probe(cache, limit=123_456) == ["123456", "miss"]
    assert not cache.exists() or not list(cache.iterdir())  # nothing written under the limit
    assert _probe(cache)[1] == "miss"  # without the limit: compiled and written
    written = sorted(p.name for p in cache.iterdir())
    assert any(n.endswith("-cache") for n in written), written
    assert _probe(cache, limit=123_456) == ["123456", "hit"]  # read under the limit
    assert sorted(p.name for p in cache.iterdir()) == written


class _Factory:
    """tmp_path_factory's one method built_once asks, at a folder of the test's own."""

    def __init__(self, base):
        self.base = base

    def getbasetemp(self):
        return self.base


def test_built_once_builds_one_folder_for_every_worker_and_never_after_a_failure(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "made").write_text("once")

    workers = [_Factory(tmp_path / "gw0"), _Factory(tmp_path / "gw1")]
    got = [built_once(w, "shared", build) for w in workers]
    assert got == [tmp_path / "shared"] * 2 and calls == [tmp_path / "shared"]
    assert (tmp_path / "shared" / "made").read_text() == "once"

    def fail(folder):
        calls.append(folder)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        built_once(workers[0], "broken", fail)
    with pytest.raises(RuntimeError, match="broken failed in another test"):
        built_once(workers[1], "broken", fail)
    assert calls[1:] == [tmp_path / "broken"]  # the second asked, and was not built again


class _Item:
    def __init__(self, nodeid, slow=False):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name):
        return self.slow if name == "slow" else None


def test_slow_tests_go_first_those_of_modules_with_few_of_them_before_the_tables():
    names = ["a.py::f", "t.py::c[1]", "t.py::c[2]", "b.py::e", "a.py::g", "c.py::h"]
    slow = {"t.py::c[1]", "t.py::c[2]", "b.py::e", "c.py::h"}
    items = [_Item(n, n in slow) for n in names]
    order = [i.nodeid for i in slow_first(items)]
    assert order == ["b.py::e", "c.py::h", "t.py::c[1]", "t.py::c[2]", "a.py::f", "a.py::g"]


def test_the_tests_run_with_the_suites_jax_settings():
    # Set in the environment by conftest.py, read by jax when a test module first imports it.
    import jax

    assert jax.config.jax_compilation_cache_dir == os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert jax.config.jax_persistent_cache_min_compile_time_secs == float(
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]
    )
    # A flag without a context manager, read the way jax lets one read those.
    want = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() in ("1", "true")
    assert jax.config.read("jax_disable_most_optimizations") == want


def test_collection_keeps_the_rewritten_test_modules_where_bytecode_may_not_be_written(tmp_path):
    env = dict(subprocess_env(), PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp_path))
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]
    out = subprocess.run(
        [*argv, "-p", "no:cacheprovider", "tests/test_conftest.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    kept = tmp_path / f"electra_jax-tests-pyc-{os.getuid()}"
    # pytest's rewrite of the module's asserts, tagged with pytest's version.
    assert list(kept.rglob("test_conftest.*pytest*.pyc")), sorted(kept.rglob("*"))[:5]
    # And outside collection, the environment's choice again.
    assert sys.dont_write_bytecode == bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
