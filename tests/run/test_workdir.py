"""workdir: only empty, new or our own folders are taken, and one process holds each at a time."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from electra_jax.errors import ConfigError
from electra_jax.run import workdir
from electra_jax.store import paths
from tests.conftest import ROOT, subprocess_env

_FINETUNING = {"task": "SST-2", "model": {}, "learning_rate": 0, "batch_size": 32, "seq_length": 8}


def test_a_bucket_that_does_not_answer_is_named_as_such_not_as_unwritable(monkeypatch):
    # deadline.NoAnswer is what paths raises for a request past its deadline
    # (tests/store/test_deadline.py); "not writable" would send the user to the permissions.
    from electra_jax.store import deadline, paths

    def silent(path):
        raise deadline.NoAnswer(path, 60)

    monkeypatch.setattr(paths, "exists", silent)
    with pytest.raises(ConfigError, match=r"^--workdir gs://bucket/run: no answer within 60s"):
        workdir.check_workdir("gs://bucket/run")


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
        "from electra_jax.run import workdir\n"
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


def _foreign_config_beside(entry):
    """Another program's config.json beside a folder named as ours (checkpoints/, tokenizer/)."""

    def make(path):
        (path / entry).mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"lr": 0.1, "layers": 3, "model": {}}))

    return make


def _our_shaped_finetuning_config_with_other_files(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(_FINETUNING))
    (path / "thesis.tex").write_text("mine")


def _checkpoints_without_config_or_marker(path):
    (path / "checkpoints" / "3").mkdir(parents=True)


def _hidden_foreign_file(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(_FINETUNING))
    (path / ".git").mkdir()


@pytest.mark.parametrize(
    "make,expected",
    [
        (_foreign_config_beside("checkpoints"), "its config.json is not a run's"),
        (_foreign_config_beside("tokenizer"), "its config.json is not a run's"),
        (_our_shaped_finetuning_config_with_other_files, r"no electra_jax command writes \(thesis"),
        (_checkpoints_without_config_or_marker, "put its config.json back"),
        (_hidden_foreign_file, "not an electra_jax workdir"),
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


def test_the_marker_makes_a_folder_ours_whatever_else_it_holds(tmp_path):
    # Refused without the marker (another program's config.json beside checkpoints/), the same
    # folder is a workdir once a run of ours has marked it: the marker, not the contents, decides.
    path = tmp_path / "w"
    _foreign_config_beside("checkpoints")(path)
    assert workdir.kind_of(str(path)) is None
    (path / workdir.MARKER).write_text(json.dumps({"kind": workdir.PRETRAIN, "format": 1}))
    assert workdir.kind_of(str(path)) == workdir.PRETRAIN


@pytest.mark.parametrize(
    "name", [".lock", "config.json", "metrics.jsonl", "tokenizer", ".electra_jax", "eval.jsonl"]
)
def test_a_link_where_a_run_writes_is_refused_and_its_target_untouched(tmp_path, name):
    path = tmp_path / "w"
    workdir.claim(str(path), workdir.PRETRAIN).release()
    outside = tmp_path / "outside"
    outside.write_text("a user's file")
    if (path / name).exists():
        (path / name).unlink()
    (path / name).symlink_to(outside)
    # A marker that is a link to a user's file reads as a damaged marker: refused as not ours.
    link = f"{re.escape(name)} is a symbolic link .*remove"
    expected = "marker is damaged" if name == workdir.MARKER else link
    with pytest.raises(ConfigError, match=expected):
        workdir.claim(str(path), workdir.PRETRAIN)
    assert outside.read_text() == "a user's file"


def test_the_lock_is_never_opened_through_a_link(tmp_path):
    # The folder holds only the link: no claim check sees a workdir, the open itself refuses.
    path = tmp_path / "w"
    path.mkdir()
    outside = tmp_path / "outside"
    outside.write_text("a user's file")
    (path / ".lock").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"\.lock is a symbolic link"):
        workdir.claim(str(path), workdir.PRETRAIN)
    assert outside.read_text() == "a user's file"


def test_workdirs_written_before_the_marker_are_recognised(tmp_path):
    pre = tmp_path / "pre"
    (pre / "checkpoints" / "3").mkdir(parents=True)
    config = {"model": {}, "generator": {}, "train": {"num_steps": 6}, "data": {"source": "x"}}
    (pre / "config.json").write_text(json.dumps(config))
    (pre / "my_notes.txt").write_text("a user's file beside a run")
    (pre / ".DS_Store").write_bytes(b"")  # hidden ones too
    assert workdir.kind_of(str(pre)) == workdir.PRETRAIN
    prepared_only = tmp_path / "prepared"  # what `prepare` wrote before the first train
    (prepared_only / "tokenizer").mkdir(parents=True)
    (prepared_only / "tokenizer" / "spm.model").write_bytes(b"x")
    (prepared_only / "data").mkdir()
    assert workdir.kind_of(str(prepared_only)) == workdir.PRETRAIN
    fine = tmp_path / "fine"
    fine.mkdir()
    (fine / "config.json").write_text(json.dumps(_FINETUNING))
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


def test_whole_file_writes_never_follow_a_link(tmp_path):
    # paths.write_atomic's temporary file and paths.append_text's file: a link there (a
    # careless script's, or one put after the claim) is refused, the file it points at kept.
    outside = tmp_path / "outside"
    outside.write_text("a user's file")
    target = tmp_path / "metrics.jsonl"
    tmp = tmp_path / f"metrics.jsonl.tmp{os.getpid()}"
    tmp.symlink_to(outside)
    with pytest.raises(paths.LinkRefused, match=r"metrics.jsonl.tmp\d+ is a symbolic link"):
        paths.write_atomic(str(target), "row\n")
    tmp.unlink()
    target.symlink_to(outside)
    for write in (paths.write_atomic, paths.append_text):
        with pytest.raises(paths.LinkRefused, match=r"metrics.jsonl is a symbolic link"):
            write(str(target), "row\n")
    with pytest.raises(paths.LinkRefused), paths.open_file(str(target), "w") as f:
        f.write("row\n")
    assert outside.read_text() == "a user's file"
    assert not target.exists() or target.is_symlink()


def test_checkpoints_and_data_may_live_elsewhere_through_a_link(tmp_path):
    # A folder for the run's bulk on another disk is the user's choice of storage, not a file
    # of theirs: a link to a folder there is followed; a link to a file at that name is not.
    path = tmp_path / "w"
    workdir.claim(str(path), workdir.PRETRAIN).release()
    scratch = tmp_path / "scratch"
    for name in ("checkpoints", "data", "tensorboard"):
        (scratch / name).mkdir(parents=True)
        (path / name).symlink_to(scratch / name)
    workdir.claim(str(path), workdir.PRETRAIN).release()
    (path / "data").unlink()
    (tmp_path / "a_file").write_text("mine")
    (path / "data").symlink_to(tmp_path / "a_file")
    with pytest.raises(ConfigError, match="data is a symbolic link"):
        workdir.claim(str(path), workdir.PRETRAIN)


def test_a_hard_link_is_never_truncated_or_appended_to(tmp_path):
    # A hard link is the same file elsewhere: appending to it, or truncating it as a temporary,
    # would change the user's file as surely as writing through a symbolic link.
    outside = tmp_path / "outside"
    outside.write_text("a user's file")
    path = tmp_path / "w"
    path.mkdir()
    os.link(outside, path / "config_changes.jsonl")
    with pytest.raises(paths.LinkRefused, match="has 2 hard links"):
        paths.append_text(str(path / "config_changes.jsonl"), "row\n")
    os.link(outside, path / f"config.json.tmp{os.getpid()}")
    with pytest.raises(paths.LinkRefused, match="has 3 hard links"):
        paths.write_atomic(str(path / "config.json"), "{}\n")
    fresh = tmp_path / "fresh"  # holds only the lock: nothing before the open refuses it
    fresh.mkdir()
    os.link(outside, fresh / ".lock")
    with pytest.raises(ConfigError, match=r"\.lock has 4 hard links"):
        workdir.claim(str(fresh), workdir.PRETRAIN)
    assert outside.read_text() == "a user's file"


def test_nothing_is_claimed_inside_a_folder_another_run_manages(tmp_path):
    run = tmp_path / "run"
    workdir.claim(str(run), workdir.PRETRAIN).release()
    (run / "checkpoints").mkdir()
    for inside in ("checkpoints/x", "data/cache", "tensorboard/a/b", ".lock/x"):
        assert workdir.inside_managed(str(run / inside)) == (str(run), inside.split("/")[0])
        with pytest.raises(ConfigError, match=r"is inside .*, which the run in .* manages"):
            workdir.claim(str(run / inside), workdir.PRETRAIN)
    assert sorted(os.listdir(run / "checkpoints")) == []
    # Beside the managed folders, or under a folder that is no run's, is free.
    assert workdir.inside_managed(str(run / "hf")) is None
    assert workdir.inside_managed(str(tmp_path / "other" / "checkpoints" / "x")) is None
    workdir.claim(str(run / "hf" / "nested-run"), workdir.PRETRAIN).release()
