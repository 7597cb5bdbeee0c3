"""launch/_rules.sh, the rules every launcher holds as the Python commands do (flags in both of
absl's forms and given once, switches 0 or 1, whole numbers, workdirs, the compilation cache
beside a workdir), on their own and through each launcher with recording fakes. No network."""

import os
import subprocess

import pytest

from tests import test_launch_slurm
from tests.conftest import ROOT

RULES = ROOT / "launch" / "_rules.sh"


def _bash(args: list, env: dict, cwd=None) -> subprocess.CompletedProcess:
    """bash ARGS in the environment `env` adds to this one's (less the launchers' switches)."""
    full = {k: v for k, v in os.environ.items() if k not in ("SPOT", "QUEUED", "POLL_SECONDS")}
    kwargs = dict(env={**full, **env}, cwd=cwd, capture_output=True, text=True, timeout=60)
    return subprocess.run(["bash", *map(str, args)], **kwargs)


def _fake(bin_dir, name: str, text: str) -> dict:
    """A command `name` in bin_dir running `text`; the PATH that finds it first."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
    (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _rule(call: str, **env) -> subprocess.CompletedProcess:
    """`call` (a rule with its arguments) in bash with the rules sourced."""
    script = f'set -euo pipefail\nsource {str(RULES)!r}\nout=$({call})\nprintf "%s" "$out"\n'
    return _bash(["-c", script], env)


@pytest.mark.parametrize(
    "call, out",
    [
        ("flag_value workdir --config=c.py --workdir=/r/x", "/r/x"),
        ("flag_value workdir --config=c.py --workdir /r/x --seed=1", "/r/x"),  # absl's other form
        ("flag_value workdir --config=c.py", ""),
        ("flag_value config.data.cache_dir --config.data.cache_dir gs://b/c", "gs://b/c"),
        ("cache_beside /runs/x", "/runs/jax_compilation_cache"),
        ("cache_beside gs://b/runs/x/", "gs://b/runs/jax_compilation_cache"),
        ("cache_beside gs://bucket", ""),  # a whole bucket: nothing beside it
        ("cache_beside gs://bucket/", ""),
        ("switch SPOT", "0"),
        ("whole_number POLL_SECONDS 60 0 86400", "60"),
        ("check_workdir gs://my-bucket.x/runs", ""),
    ],
)
def test_what_the_rules_accept(call, out):
    done = _rule(call)
    assert (done.returncode, done.stdout, done.stderr) == (0, out, "")


@pytest.mark.parametrize(
    "call, env, says",
    [
        ("flag_value workdir --workdir=/a --workdir /b", {}, "--workdir is given 2 times"),
        ("flag_value workdir --config=c.py --workdir", {}, "--workdir needs a value"),
        ("switch SPOT", {"SPOT": "yes"}, "SPOT=yes: give SPOT=1 (on) or SPOT=0 (off)"),
        ("switch QUEUED", {"QUEUED": "true"}, "QUEUED=true: give QUEUED=1"),
        ("whole_number POLL_SECONDS 60 0 86400", {"POLL_SECONDS": "abc"}, "POLL_SECONDS=abc must"),
        ("whole_number POLL_SECONDS 60 0 86400", {"POLL_SECONDS": "1e3"}, "from 0 to 86400"),
        ("check_workdir gs://My_Bucket/runs", {}, "'My_Bucket' is not a Cloud Storage bucket"),
        ("check_workdir s3://b/runs", {}, "a local path or gs://BUCKET/PATH"),
        ("check_workdir ''", {}, "--workdir=... is required"),
    ],
)
def test_what_the_rules_refuse_in_one_line(call, env, says):
    done = _rule(call, **env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr


def _tpu_vm(tmp_path, run="gs://b/runs/large", *flags, **env) -> subprocess.CompletedProcess:
    """tpu_vm.sh with a gcloud that records that it was called: a refusal calls none."""
    path = _fake(tmp_path / "bin", "gcloud", f"touch {tmp_path / 'called'}")
    script = ROOT / "launch" / "tpu_vm.sh"
    args = [script, "electra", "us-central2-b", "v4-16", run, "--config=c.py", *flags]
    return _bash(args, {**env, **path, "REPO": "https://x/e.git"})


@pytest.mark.parametrize(
    "run, flags, env, says",
    [
        ("gs://b/runs/large", (), {"SPOT": "yes"}, "SPOT=yes: give SPOT=1"),
        ("gs://b/runs/large", (), {"POLL_SECONDS": "abc"}, "POLL_SECONDS=abc must be"),
        ("gs://MyBucket/runs", (), {}, "capitals are not allowed"),
        ("gs://b/runs", ("--workdir", "gs://b/x"), {}, "drop --workdir"),
        ("gs://b/runs", ("--config.data.cache_dir", "/local"), {}, "cache_dir=/local must be gs"),
        ("gs://b/runs", ("--config.seed=1", "--config.data.cache_dir"), {}, "needs a value"),
    ],
)
def test_tpu_vm_refuses_before_calling_gcloud(tmp_path, run, flags, env, says):
    out = _tpu_vm(tmp_path, run, *flags, **env)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert not (tmp_path / "called").exists()


def test_slurm_keeps_a_bucket_roots_cache_in_the_run_and_reads_both_flag_forms(tmp_path):
    """dirname of gs://BUCKET made the local path gs:/jax_compilation_cache."""
    out, (calls, cache), _ = test_launch_slurm._run(
        tmp_path / "a", "--config=c.py", "--workdir", "gs://bucket", FAKE_NO_TASKS="1"
    )
    assert out.returncode == 0 and cache == [""], out.stderr
    assert calls == ["--kill-on-bad-exit=1 python -m electra_jax.train --config=c.py --workdir "
                     "gs://bucket"]  # fmt: skip
    out, _, _ = test_launch_slurm._run(tmp_path / "b", "--config=c.py", "--workdir=gs://B/x")
    assert out.returncode == 2 and "'B' is not a Cloud Storage bucket name" in out.stderr


def test_local_multiprocess_makes_no_local_tree_for_a_bucket_workdir(tmp_path):
    """It made ./gs:/... and wrote its processes' logs there."""
    env = _fake(tmp_path / "bin", "python", 'echo "$@" >> "$FAKE_LOG"')
    env.update(FAKE_LOG=str(tmp_path / "calls"), TMPDIR=str(tmp_path))  # its logs' folder
    script = ROOT / "launch" / "local_multiprocess.sh"
    args = [script, "2", "--config=c.py", "--workdir", "gs://b/runs/mp"]
    out = _bash(args, env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "gs:").exists()
    assert "processes 1 to 1 log into " in out.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2 and all("--workdir gs://b/runs/mp" in c for c in calls)
