"""workdir: only empty, new or our own folders are taken, and one process holds each at a time."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from electra_jax import workdir
from electra_jax.validate import ConfigError
from tests.conftest import ROOT, subprocess_env


def test_a_new_folder_gets_the_marker_and_the_lock(tmp_path):
    path = str(tmp_path / "run")
    with workdir.claimed(path, workdir.PRETRAIN, command="test") as held:
        assert held.kind == workdir.PRETRAIN
        marker = json.loads((tmp_path / "run" / workdir.MARKER).read_text())
        assert marker["kind"] == workdir.PRETRAIN
        holder = json.loads((tmp_path / "run" / workdir.LOCK).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "test"
        # A second claim, even from this process (another open file), is refused by name.
        with pytest.raises(ConfigError) as e:
            workdir.claim(path, workdir.PRETRAIN)
        message = str(e.value)
        assert f"is in use by test (pid {os.getpid()} on host" in message and "\n" not in message
    # Released at the end of the block: the next run takes it.
    workdir.claim(path, workdir.PRETRAIN).release()
    assert workdir.kind_of(path) == workdir.PRETRAIN


def test_the_lock_dies_with_its_process(tmp_path):
    """SIGKILL (or the OOM killer) leaves no stale lock: a rerun takes the workdir at once."""
    path = str(tmp_path / "run")
    code = (
        "import sys\n"
        "from electra_jax import workdir\n"
        f"workdir.claim({path!r}, workdir.PRETRAIN, command='holder')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"  # held until killed (or this test's end closes the pipe), not a time
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(ConfigError, match=rf"in use by holder \(pid {holder.pid} on host"):
            workdir.claim(path, workdir.PRETRAIN)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    workdir.claim(path, workdir.PRETRAIN).release()


def _hf_folder(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "electra"}))
    (path / "model.safetensors").write_bytes(b"weights")


def _other_files(path):
    path.mkdir()
    (path / "important.txt").write_text("mine")
    (path / "sub").mkdir()


def _json_list_config(path):
    path.mkdir()
    (path / "config.json").write_text("[1, 2]")


def _damaged_marker_only(path):
    path.mkdir()
    (path / workdir.MARKER).write_text("{trunc")
    (path / "notes.txt").write_text("mine")


@pytest.mark.parametrize(
    "make,expected",
    [
        (_hf_folder, "is a Hugging Face model folder"),
        (_other_files, r"not an electra_jax workdir \(it holds important.txt, sub\)"),
        (_json_list_config, "not an electra_jax workdir"),
        (_damaged_marker_only, "marker is damaged"),
    ],
)
def test_a_folder_that_is_not_ours_is_refused_and_left_untouched(tmp_path, make, expected):
    path = tmp_path / "folder"
    make(path)
    before = {p: p.read_bytes() if p.is_file() else None for p in path.rglob("*")}
    with pytest.raises(ConfigError, match=expected):
        workdir.claim(str(path), workdir.PRETRAIN)
    after = {p: p.read_bytes() if p.is_file() else None for p in path.rglob("*")}
    assert after == before  # no marker, no lock file, nothing rewritten


def test_a_workdir_of_the_other_kind_is_refused(tmp_path):
    pre, fine = str(tmp_path / "pre"), str(tmp_path / "fine")
    workdir.claim(pre, workdir.PRETRAIN).release()
    workdir.claim(fine, workdir.FINETUNE).release()
    with pytest.raises(ConfigError, match="is a pre-training workdir; a fine-tuning run would"):
        workdir.claim(pre, workdir.FINETUNE)
    with pytest.raises(ConfigError, match="is a fine-tuning workdir; a pre-training run would"):
        workdir.claim(fine, workdir.PRETRAIN)


def test_workdirs_written_before_the_marker_are_recognised(tmp_path):
    pre = tmp_path / "pre"
    (pre / "checkpoints" / "3").mkdir(parents=True)
    config = {"model": {}, "generator": {}, "train": {}, "data": {}}
    (pre / "config.json").write_text(json.dumps(config))
    (pre / "my_notes.txt").write_text("a user's file beside a run")
    assert workdir.kind_of(str(pre)) == workdir.PRETRAIN
    prepared_only = tmp_path / "prepared"  # what `prepare` wrote before the first train
    (prepared_only / "tokenizer").mkdir(parents=True)
    (prepared_only / "data").mkdir()
    assert workdir.kind_of(str(prepared_only)) == workdir.PRETRAIN
    fine = tmp_path / "fine"
    fine.mkdir()
    (fine / "config.json").write_text(json.dumps({"task": "SST-2", "model": {}}))
    (fine / "eval_results.json").write_text("{}")
    assert workdir.kind_of(str(fine)) == workdir.FINETUNE
    # Claiming one adds the marker and keeps everything else.
    workdir.claim(str(pre), workdir.PRETRAIN).release()
    assert (pre / "my_notes.txt").read_text() == "a user's file beside a run"
    assert json.loads((pre / workdir.MARKER).read_text())["kind"] == workdir.PRETRAIN


def test_paths_that_cannot_be_workdirs_are_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        workdir.claim(str(a_file), workdir.PRETRAIN)
    not_utf8 = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run\xff")
    with pytest.raises(ConfigError, match="is not valid UTF-8") as e:
        workdir.claim(not_utf8, workdir.PRETRAIN)
    assert "\n" not in str(e.value)
    assert not os.path.exists(os.fsencode(str(tmp_path)) + b"/run\xff")


def test_other_processes_of_a_multihost_run_only_check(tmp_path):
    path = str(tmp_path / "run")
    held = workdir.claim(path, workdir.PRETRAIN, lock=False)
    assert not os.path.exists(path)  # nothing written by a process that does not hold the lock
    held.release()
    with workdir.claimed(path, workdir.PRETRAIN):
        # Process 0 holds it; process 1 of the same run checks and goes on.
        workdir.claim(path, workdir.PRETRAIN, lock=False).release()
    started = time.time()
    workdir.claim(path, workdir.PRETRAIN).release()
    assert time.time() - started < 5


def test_the_markers_temporary_is_ours_while_another_process_looks(tmp_path):
    """The other processes of a multi-host run check the folder while process 0 writes the
    marker (jsonio.write_atomic: MARKER.tmp<pid>, then a rename): it is not someone else's."""
    path = tmp_path / "w"
    path.mkdir()
    (path / workdir.LOCK).write_text("")
    (path / f"{workdir.MARKER}.tmp12345").write_text('{"kind": "pre-training"')
    assert workdir.kind_of(str(path)) == ""
    workdir.claim(str(path), workdir.PRETRAIN, lock=False)  # process 1's check passes
    (path / f"{workdir.MARKER}.tmpx").write_text("")  # not a temporary of ours
    assert workdir.kind_of(str(path)) is None
