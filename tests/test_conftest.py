"""The suite's own helpers: what keeps its shared compilation cache whole."""

import zlib

from tests.conftest import drop_cut_cache_entries, run_python


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
