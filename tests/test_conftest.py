"""The suite's own helpers: what keeps its shared compilation cache whole."""

import subprocess
import sys
import zlib

from tests.conftest import ROOT, drop_cut_cache_entries, subprocess_env, with_file_size_limit


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


def test_a_command_under_a_file_size_limit_compiles_without_the_shared_cache(tmp_path):
    # A file size limit cuts jax's write of a new entry short (the cause of the entries above).
    probe = (
        "import os, resource\n"
        "print(resource.getrlimit(resource.RLIMIT_FSIZE)[0])\n"
        "import jax\n"
        "print(jax.config.jax_enable_compilation_cache)\n"
    )
    argv = with_file_size_limit([sys.executable, "-c", probe], 123_456)
    out = subprocess.run(
        argv, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["123456", "False"]
