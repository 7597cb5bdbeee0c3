"""launch/tpu_vm.sh against a fake `gcloud` on PATH that logs every call and reports the slice
(or the queued resource) in the state the test sets: READY, PREEMPTED, not found. No network."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "launch" / "tpu_vm.sh"

# The fake keeps the slice's state in FAKE_STATE (NOT_FOUND: none) and the queued resource's
# states to report, one per describe, in FAKE_QUEUE (the last one repeats).
FAKE_GCLOUD = r"""
import json, os, pathlib, sys

args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
state = pathlib.Path(os.environ["FAKE_STATE"])
queue = pathlib.Path(os.environ["FAKE_QUEUE"])
words = [a for a in args if not a.startswith("-")]
kind, verb = words[2], words[3]  # compute tpus KIND VERB NAME ...


def not_found():
    print(f"ERROR: (gcloud.compute.tpus.{kind}.{verb}) NOT_FOUND: {words[4]} was not found",
          file=sys.stderr)
    sys.exit(1)


if kind == "tpu-vm" and verb == "describe":
    if state.read_text() == "NOT_FOUND":
        not_found()
    print(state.read_text())
elif kind == "tpu-vm" and verb == "scp":  # what the archive holds, for the test to read
    import tarfile

    with tarfile.open(words[4]) as archive:
        shipped = archive.getnames()
    pathlib.Path(os.environ["FAKE_SHIPPED"]).write_text(json.dumps(shipped))
elif kind == "tpu-vm" and verb == "create":
    state.write_text("READY")
elif kind == "tpu-vm" and verb == "delete":
    state.write_text("NOT_FOUND")
elif kind == "queued-resources" and verb == "describe":
    states = queue.read_text().split()
    if states[0] == "NOT_FOUND":
        not_found()
    queue.write_text(" ".join(states[1:] or states))
    print(states[0])
elif kind == "queued-resources" and verb == "create":
    queue.write_text("WAITING_FOR_RESOURCES PROVISIONING ACTIVE")
elif kind == "queued-resources" and verb == "delete":
    queue.write_text("NOT_FOUND")
"""

TRAIN = ["--config=configs/large.py", "--config.train.num_steps=10", "--config.seed=1"]


def _launch(
    tmp_path,
    *,
    slice_state="READY",
    queue="NOT_FOUND",
    repo="https://x/e.git",
    fake=None,
    script=SCRIPT,
    **env,
):
    """Runs the script; returns (the completed process, the fake's calls as argv lists)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "gcloud.py").write_text(fake or FAKE_GCLOUD)
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'gcloud.py'))}"
        ' "$@"\n'
    )
    gcloud.chmod(0o755)
    (tmp_path / "state").write_text(slice_state)
    (tmp_path / "queue").write_text(queue)
    full = {k: v for k, v in os.environ.items() if k not in ("QUEUED", "SPOT", "RUNTIME", "REPO")}
    full.update(
        env,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_LOG=str(tmp_path / "calls"),
        FAKE_STATE=str(tmp_path / "state"),
        FAKE_QUEUE=str(tmp_path / "queue"),
        FAKE_SHIPPED=str(tmp_path / "shipped"),
        POLL_SECONDS="0",
    )
    if repo:
        full["REPO"] = repo
    out = subprocess.run(
        ["bash", str(script), "electra", "us-central2-b", "v4-16", "gs://b/runs/large", *TRAIN],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = tmp_path / "calls"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return out, calls


def _verbs(calls):
    """'tpu-vm describe', 'queued-resources create', ... for each call (flags left out)."""
    return [" ".join([a for a in c if not a.startswith("-")][2:4]) for c in calls]


def _flag(call, name):
    [value] = [a.split("=", 1)[1] for a in call if a.startswith(f"--{name}=")]
    return value


def _check_install_and_train(calls):
    *_, install, train = calls
    for call in (install, train):
        assert call[:5] == ["compute", "tpus", "tpu-vm", "ssh", "electra"]
        assert "--worker=all" in call and "--zone=us-central2-b" in call
    setup = _flag(install, "command")
    # Python 3.11 (setup.py's python_requires) in a venv, the versions of the TPU image's lock,
    # which pins every package the TPU extras resolve to (libtpu among them).
    assert "uv venv -q --python 3.11 ~/electra_venv" in setup
    assert "-c ~/electra_jax/constraints-tpu.txt" in setup and "'[tpu,gcs]'" in setup
    lock = (SCRIPT.parents[1] / "constraints-tpu.txt").read_text().splitlines()
    assert [line for line in lock if line.startswith("libtpu==")], "the lock pins no libtpu"
    command = _flag(train, "command")
    assert "~/electra_venv/bin/python -m electra_jax.train --workdir=gs://b/runs/large" in command
    assert shlex.split(command.split("electra_jax.train", 1)[1])[1:] == TRAIN
    assert "JAX_COMPILATION_CACHE_DIR=gs://b/runs/jax_compilation_cache" in command
    for remote in (setup, command):  # what each worker's shell gets parses as a command line
        assert subprocess.run(["bash", "-n", "-c", remote]).returncode == 0, remote


def test_a_ready_slice_is_reused(tmp_path):
    out, calls = _launch(tmp_path, slice_state="READY")
    assert out.returncode == 0, out.stderr
    assert _verbs(calls) == ["tpu-vm describe", "tpu-vm ssh", "tpu-vm ssh"]
    _check_install_and_train(calls)


def test_a_preempted_slice_is_deleted_and_created_again(tmp_path):
    out, calls = _launch(tmp_path, slice_state="PREEMPTED", SPOT="1")
    assert out.returncode == 0, out.stderr
    assert _verbs(calls) == [
        "tpu-vm describe",
        "tpu-vm delete",
        "tpu-vm create",
        "tpu-vm ssh",
        "tpu-vm ssh",
    ]
    create = calls[2]
    assert "--spot" in create and _flag(create, "accelerator-type") == "v4-16"
    assert _flag(create, "version") == "tpu-ubuntu2204-base"
    _check_install_and_train(calls)


def test_a_missing_slice_is_created_and_this_checkout_shipped(tmp_path):
    out, calls = _launch(tmp_path, slice_state="NOT_FOUND", repo=None)
    assert out.returncode == 0, out.stderr
    verbs = _verbs(calls)
    assert verbs == ["tpu-vm describe", "tpu-vm create", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh"]
    assert calls[2][5] == "electra:~/" and "--worker=all" in calls[2]
    _check_install_and_train(calls)


def test_the_checkout_is_shipped_without_its_runs_caches_or_virtual_environment(tmp_path):
    checkout = tmp_path / "checkout"
    kept = ["launch/tpu_vm.sh", "launch/_rules.sh", "configs/large.py", "electra_jax/train.py"]
    kept += ["constraints-tpu.txt"]
    left = [".venv/bin/python", "venv/bin/python", "runs/large/metrics.jsonl", ".whl/a.whl"]
    left += [".git/HEAD", "electra_jax/__pycache__/train.cpython-311.pyc"]
    for name in kept + left:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_bytes((ROOT / name).read_bytes() if name in kept[:2] else b"x")
    out, _ = _launch(tmp_path, repo=None, script=checkout / "launch" / "tpu_vm.sh")
    assert out.returncode == 0, out.stderr
    shipped = {n.removeprefix("./") for n in json.loads((tmp_path / "shipped").read_text())}
    assert set(kept) <= shipped
    assert not [n for n in shipped if n.split("/")[0] in {".venv", "venv", "runs", ".whl", ".git"}]
    assert not [n for n in shipped if "__pycache__" in n]


@pytest.mark.parametrize("before", ["NOT_FOUND", "SUSPENDED"])
def test_queued_resources_are_requested_and_waited_for(tmp_path, before):
    out, calls = _launch(tmp_path, queue=before, QUEUED="1", SPOT="1")
    assert out.returncode == 0, out.stderr
    again = ["queued-resources delete"] if before == "SUSPENDED" else []
    assert _verbs(calls) == [
        "queued-resources describe",
        *again,
        "queued-resources create",
        # WAITING_FOR_RESOURCES, PROVISIONING, then ACTIVE
        *["queued-resources describe"] * 3,
        "tpu-vm ssh",
        "tpu-vm ssh",
    ]
    create = calls[1 + len(again)]
    assert create[4] == "electra" and _flag(create, "node-id") == "electra" and "--spot" in create
    assert _flag(create, "runtime-version") == "tpu-ubuntu2204-base"
    assert out.stderr.count("checking again in 0s") == 2
    _check_install_and_train(calls)


def test_a_failure_other_than_not_found_stops_the_script(tmp_path):
    refusing = FAKE_GCLOUD.replace(
        "kind, verb =",
        "print('ERROR: PERMISSION_DENIED', file=sys.stderr); sys.exit(1)\nkind, verb =",
    )
    out, calls = _launch(tmp_path, fake=refusing, PROJECT="p")
    assert out.returncode == 1 and "PERMISSION_DENIED" in out.stderr
    # Nothing created or deleted on a describe that failed for another reason than NOT_FOUND.
    assert _verbs(calls) == ["tpu-vm describe"] and "--project=p" in calls[0]
