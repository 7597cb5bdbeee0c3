"""Checkpoints that cannot be restored are moved aside, never deleted; the previous one is used."""

import asyncio
import gc
import json
import logging
import os
import shutil

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from electra_jax.store import checkpoint_steps, checkpointing


def _cfg(keep=5, keep_every_steps=0):
    return ml_collections.ConfigDict(
        {"keep": keep, "every_steps": 1, "keep_every_steps": keep_every_steps}
    )


def _iterator(position=0):
    """Batches of 4 counting up, `position` of them read (a run's position at that step)."""
    it = iter(grain.MapDataset.range(1000).batch(4).to_iter_dataset())
    for _ in range(position):
        next(it)
    return it


def _state(step):
    w = np.random.default_rng(step).normal(size=(64, 64))  # incompressible, unlike a constant
    return {"step": jnp.asarray(step, jnp.int32), "w": jnp.asarray(w, jnp.float32)}


def _abstract():
    shapes = jax.eval_shape(lambda: _state(0))
    sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return checkpointing.abstract_with_shardings(
        shapes, jax.tree_util.tree_map(lambda _: sh, shapes)
    )


def _write(workdir, steps, cfg=None):
    """Checkpoints at `steps`; the iterator has yielded `step` batches when step is saved."""
    manager = checkpointing.make_manager(workdir, cfg or _cfg())
    it = _iterator()
    done = 0
    for step in steps:
        while done < step:
            next(it)
            done += 1
        checkpointing.save(manager, step, _state(step), it)
        manager.wait_until_finished()
    manager.close()


def _restore(workdir):
    lines = []
    manager = checkpointing.make_manager(workdir, _cfg())
    it = _iterator()
    try:
        state = checkpointing.restore_latest(manager, _abstract(), it, log=lines.append)
    finally:
        manager.close()
    return state, it, lines


def test_restore_returns_newest_state_and_iterator_position(tmp_path):
    _write(str(tmp_path), [2, 5])
    state, it, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 5
    np.testing.assert_array_equal(state["w"], _state(5)["w"])
    assert list(next(it)) == [20, 21, 22, 23]  # the sixth batch: the position of step 5
    assert lines == []


# Files without which a checkpoint cannot be read (others, such as commit_success.txt, are
# redundant: orbax restores correct values without them, which the test also checks).
@pytest.mark.parametrize(
    "victim,damage",
    [
        ("state/manifest.ocdbt", "delete"),
        ("state/d/*", "truncate"),  # the array data
        ("position/position.json", "truncate"),  # the input position
        ("commit_success.txt", "delete"),  # redundant: step 5 still restores, correctly
    ],
)
def test_damaged_latest_is_moved_aside_and_the_previous_one_used(tmp_path, victim, damage):
    _write(str(tmp_path), [2, 5])
    (path,) = (tmp_path / "checkpoints" / "5").glob(victim)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    else:
        os.remove(path)
    state, it, lines = _restore(str(tmp_path))
    if victim == "commit_success.txt":
        assert int(state["step"]) == 5 and lines == []
        np.testing.assert_array_equal(state["w"], _state(5)["w"])
        return
    assert int(state["step"]) == 2
    np.testing.assert_array_equal(state["w"], _state(2)["w"])
    assert list(next(it)) == [8, 9, 10, 11]  # the iterator follows the restored step
    assert len(lines) == 1 and lines[0].startswith("warning: checkpoint 5 cannot be restored")
    assert str(tmp_path / "checkpoints" / "5.corrupt") in lines[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5.corrupt"]
    # Kept for inspection, and orbax does not list it as a step when the run goes on.
    manager = checkpointing.make_manager(str(tmp_path), _cfg())
    assert manager.all_steps() == [2]
    checkpointing.save(manager, 5, _state(5), _iterator(5))
    manager.wait_until_finished()
    manager.close()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5", "5.corrupt"]
    assert int(_restore(str(tmp_path))[0]["step"]) == 5


def test_no_good_checkpoint_is_one_clear_error_and_nothing_is_deleted(tmp_path):
    _write(str(tmp_path), [2, 5])
    for step in ("2", "5"):
        os.remove(tmp_path / "checkpoints" / step / "state" / "manifest.ocdbt")
    with pytest.raises(checkpointing.CheckpointError, match="no checkpoint in .* can be restored"):
        _restore(str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2.corrupt", "5.corrupt"]


def _unretrieved_task_failure(message: str) -> None:
    """What orbax leaves when a restore fails: a read task whose error nobody retrieved, which
    asyncio reports (a logged ERROR with a traceback) when the garbage collector finds it."""

    async def read():
        raise ValueError(message)

    loop = asyncio.new_event_loop()
    task = loop.create_task(read())
    loop.run_until_complete(asyncio.sleep(0))  # the task runs and fails; nobody awaits it
    loop.close()
    del task
    gc.collect()


def _unretrieved_future_failure(message: str) -> None:
    """The same left by a read that tensorstore failed from its own thread: a future (not a
    task) whose error has no traceback, reported as "Future exception was never retrieved"."""
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(ValueError(message))
    loop.close()
    del future
    gc.collect()


def test_late_reports_of_a_damaged_checkpoints_reads_are_dropped(tmp_path, caplog):
    _write(str(tmp_path), [2, 5])
    for step in ("2", "5"):
        os.remove(tmp_path / "checkpoints" / step / "state" / "manifest.ocdbt")
    with pytest.raises(checkpointing.CheckpointError):
        _restore(str(tmp_path))
    # The restore's own failed reads report when the collector finds them: before the window
    # below, so that it holds only the four reports made in it.
    gc.collect()
    damaged = tmp_path / "checkpoints" / "5" / "state"
    other = tmp_path / "elsewhere" / "5" / "state"
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _unretrieved_task_failure(f'NOT_FOUND: Metadata at "w/.zarray" in "{damaged}/"')
        _unretrieved_future_failure(f'NOT_FOUND: Metadata at "w/.zarray" in "{damaged}/"')
        _unretrieved_task_failure(f'NOT_FOUND: Metadata at "w/.zarray" in "{other}/"')
        _unretrieved_future_failure(f'NOT_FOUND: Metadata at "w/.zarray" in "{other}/"')
    reports = [r for r in caplog.records if r.name == "asyncio"]
    # The other folder's failures are not ours to hide: exactly those two are still reported.
    assert [r.getMessage().splitlines()[0] for r in reports] == [
        "Task exception was never retrieved",
        "Future exception was never retrieved",
    ]
    assert all(str(other) in str(r.exc_info[1]) for r in reports)


def test_an_unfinished_save_is_not_a_step(tmp_path):
    _write(str(tmp_path), [2])
    # What a process killed mid-save leaves: orbax's temporary folder, never renamed.
    tmp = tmp_path / "checkpoints" / "5.orbax-checkpoint-tmp-1234567"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "half").write_bytes(b"\0" * 10)
    state, _, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 2 and lines == []
    assert not tmp.exists()  # cleaned when the next run opened the manager
    assert not checkpoint_steps.has_checkpoints(str(tmp_path / "elsewhere"))
    assert checkpoint_steps.has_checkpoints(str(tmp_path))
    assert checkpoint_steps.saved_steps(str(tmp_path)) == [2]
    assert checkpoint_steps.saved_steps(str(tmp_path / "elsewhere")) == []


def test_empty_workdir_restores_nothing(tmp_path):
    state, _, lines = _restore(str(tmp_path))
    assert state is None and lines == []
    assert os.listdir(tmp_path / "checkpoints") == []


def _restore_as(workdir, abstract):
    manager = checkpointing.make_manager(workdir, _cfg())
    try:
        return checkpointing.restore_latest(manager, abstract, _iterator(), log=print)
    finally:
        manager.close()


def _other_state(step):
    return {**_state(step), "w": jnp.zeros((32, 64), jnp.float32), "extra": jnp.zeros(3)}


def test_a_checkpoint_of_another_state_is_a_mismatch_and_nothing_is_moved(tmp_path):
    _write(str(tmp_path), [2, 5])
    shapes = jax.eval_shape(lambda: _other_state(0))
    sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = checkpointing.abstract_with_shardings(
        shapes, jax.tree_util.tree_map(lambda _: sh, shapes)
    )
    with pytest.raises(checkpointing.CheckpointMismatch) as e:
        _restore_as(str(tmp_path), abstract)
    assert e.value.step == 5
    assert e.value.differences == [
        "w: (64, 64) saved, (32, 64) now",
        "extra: in the config's state only",
    ]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5"]
    # The right state still restores the newest.
    assert int(_restore(str(tmp_path))[0]["step"]) == 5


def test_a_machine_error_moves_nothing(tmp_path, monkeypatch):
    """Permission denied, a full disk, no memory: the files are fine, the machine is not."""
    _write(str(tmp_path), [2, 5])

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", "state/d/abc")

    monkeypatch.setattr(checkpointing.ocp.CheckpointManager, "restore", denied)
    with pytest.raises(checkpointing.CheckpointError, match="cannot be read on this machine") as e:
        _restore(str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5"]
    # The advice is the errno's: a permission, not space or memory.
    assert str(e.value).endswith(
        "(Permission denied); nothing was moved: make its files readable (their permissions), "
        "then run again"
    )


def test_a_workdir_whose_checkpoints_were_all_set_aside_does_not_start_over(tmp_path):
    _write(str(tmp_path), [2, 5])
    for step in ("2", "5"):
        os.remove(tmp_path / "checkpoints" / step / "state" / "manifest.ocdbt")
    with pytest.raises(checkpointing.CheckpointError):
        _restore(str(tmp_path))
    # The next run finds no step, only what was set aside: it says so instead of starting over.
    assert checkpointing.set_aside(str(tmp_path)) == ["2.corrupt", "5.corrupt"]
    with pytest.raises(checkpointing.CheckpointError, match="set aside as damaged"):
        _restore(str(tmp_path))


def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    _write(str(tmp_path), [2])
    manager = checkpointing.make_manager(str(tmp_path), _cfg())
    real_save = checkpointing.ocp.CheckpointManager.save

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "checkpoints"))

    try:
        checkpointing.ocp.CheckpointManager.save = full
        with pytest.raises(checkpointing.CheckpointError) as e:
            checkpointing.save(manager, 5, _state(5), _iterator())
    finally:
        checkpointing.ocp.CheckpointManager.save = real_save
        manager.close()
    message = str(e.value)
    assert "could not be written" in message and "No space left on device" in message
    assert "checkpoint 2 is intact" in message and "\n" not in message
    assert int(_restore(str(tmp_path))[0]["step"]) == 2


def test_keep_every_steps_keeps_the_multiples_beside_the_newest(tmp_path):
    # keep=2 alone would leave [10, 12]; every 4th step survives too, across managers (a resume).
    workdir = str(tmp_path)
    cfg = _cfg(keep=2, keep_every_steps=4)
    _write(workdir, [2, 4, 6], cfg)
    _write(workdir, [8, 10, 12], cfg)
    steps = sorted(
        int(n) for n in os.listdir(checkpoint_steps.checkpoint_dir(workdir)) if n.isdigit()
    )
    assert steps == [4, 8, 10, 12]
    _write(str(tmp_path / "plain"), [2, 4, 6, 8], _cfg(keep=2))
    plain = os.listdir(checkpoint_steps.checkpoint_dir(str(tmp_path / "plain")))
    assert sorted(int(n) for n in plain if n.isdigit()) == [6, 8]


def test_environment_errors_are_told_by_errno_in_orbax_and_tensorstore_words():
    text = "Failed to write 137660 bytes to file 8: File too large [os_error_code='27']"
    assert checkpointing._environment_errno(ValueError(f"OUT_OF_RANGE: {text}")) == 27
    assert checkpointing._environment_errno(ValueError("RESOURCE_EXHAUSTED: ...")) == 28
    assert checkpointing._environment_errno(OSError(30, "Read-only file system")) == 30
    assert checkpointing._environment_errno(ValueError("[Errno 2] No such file")) is None
    assert checkpointing._environment_errno(KeyError("params")) is None


@pytest.mark.slow
def test_a_full_disk_during_a_save_through_train_is_one_line_without_orbax_tracebacks(
    tmp_path, tmp_path_factory
):
    """A file size limit stands in for a full disk (SIGXFSZ ignored: writes fail with EFBIG):
    checkpoint 3 is written without it, then the save of step 6 meets it. orbax reports the
    failure from each of its threads, hundreds of lines; the command says it in one, and
    --verbose shows them all."""
    from electra_jax.pretraining import runner
    from tests.conftest import micro_config_file, run_command
    from tests.pretraining.test_runner import config_with, prepare_shared_data

    tokenizer, cache_dir = prepare_shared_data(tmp_path_factory)
    cfg = config_with((tokenizer, cache_dir))
    workdir = tmp_path / "w"
    # The commands' own config, stopped early: they load the step this compiles from the
    # compilation cache (they write nothing to it, so a program of their own was compiled anew
    # by each of them).
    runner.train(cfg, str(workdir), stop_after=3)
    config = micro_config_file(tmp_path / "config.py", (tokenizer, cache_dir))

    def train(*flags):  # every data file of a checkpoint is larger; metrics.jsonl is not
        return run_command(
            "electra_jax.train",
            f"--config={config}",
            f"--workdir={workdir}",
            *flags,
            timeout=300,
            file_size_limit=60_000,
        )

    out = train()
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) < 12 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[-1] == (
        f"error: a checkpoint could not be written to {workdir / 'checkpoints'} (File too "
        "large); checkpoint 3 is intact: raise the file size limit (ulimit -f) or use a "
        "filesystem without one, then run the same command to resume"
    )
    assert sorted(n for n in os.listdir(workdir / "checkpoints") if n.isdigit()) == ["3"]
    verbose = train("--verbose")
    assert verbose.returncode != 0 and verbose.stderr.count("Traceback") > 3


def test_only_orbax_reports_of_an_environment_failure_are_dropped():
    """quiet_write_failures hides that failure's echoes, never other errors."""
    import logging

    keep = checkpointing._OrbaxWriteFailureFilter().filter

    def record(pathname, message, level=logging.ERROR):
        return logging.LogRecord("absl", level, pathname, 1, message, None, None)

    orbax = "/site-packages/orbax/checkpoint/_src/futures/future.py"
    full = "raised an exception: OUT_OF_RANGE: ... File too large [os_error_code='27']"
    assert not keep(record(orbax, full))
    assert not keep(record("/asyncio/base_events.py", f"Task exception: orbax/x.py {full}"))
    assert keep(record(orbax, "raised an exception: KeyError: 'params'"))  # not the machine's
    assert keep(record("/electra_jax/pretraining/runner.py", full))  # not orbax's
    assert keep(record(orbax, full, logging.WARNING))  # below ERROR: absl's verbosity decides


# ------------------------------------------------------------------- layouts and error kinds


def _write_legacy(workdir, steps, states=({"next_index": None},)):
    """Checkpoints as written before the `position` item: Grain's per-process iterator files
    (`data/process_<i>-of-<N>.json`, N = len(states); a None next_index is the step's)."""
    manager = checkpointing.make_manager(workdir, _cfg())
    for step in steps:
        items = {"state": checkpointing.ocp.args.StandardSave(_state(step))}
        items["data"] = grain.checkpoint.CheckpointSave(_iterator())
        manager.save(step, args=checkpointing.ocp.args.Composite(**items), force=True)
        manager.wait_until_finished()
        data = os.path.join(checkpoint_steps.checkpoint_dir(workdir), str(step), "data")
        os.remove(os.path.join(data, "process_0-of-1.json"))
        for i, state in enumerate(states):
            state = {k: step if v is None else v for k, v in state.items()}
            with open(os.path.join(data, f"process_{i}-of-{len(states)}.json"), "w") as f:
                json.dump(state, f)
    manager.close()


def test_a_checkpoint_from_before_the_position_item_resumes_on_its_layout(tmp_path):
    _write_legacy(str(tmp_path), [2, 5])
    state, it, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 5 and lines == []
    assert list(next(it)) == [20, 21, 22, 23]
    assert checkpointing.saved_layout(str(tmp_path)) == (5, {"processes": 1})


def test_a_checkpoint_of_another_process_count_is_restored_not_set_aside(tmp_path):
    """Two processes' files, read by one: the file this process would have had under Grain's
    own handler (process_0-of-1.json) is missing, which is no damage."""
    _write_legacy(str(tmp_path), [2, 5], states=({"next_index": None}, {"next_index": None}))
    state, it, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 5
    assert list(next(it)) == [20, 21, 22, 23]
    assert lines == [
        "checkpoint 5 was written by 2 processes; resuming it on 1 process x 1 device (the same "
        "global batches and random stream)"
    ]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5"]


def test_a_checkpoint_this_layout_cannot_continue_is_refused_naming_both_and_kept(tmp_path):
    """Per-process positions that differ (no run of this version writes them) cannot be
    carried to another process count: one line, both layouts, nothing moved."""
    _write_legacy(str(tmp_path), [5], states=({"next_index": 5}, {"next_index": 4}))
    with pytest.raises(checkpointing.CheckpointLayoutError) as e:
        _restore(str(tmp_path))
    message = str(e.value)
    assert "written by 2 processes" in message and "this run has 1 process x 1 device" in message
    assert "\n" not in message and "nothing was moved" in message
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["5"]


def test_the_position_records_the_layout_that_wrote_it(tmp_path):
    _write(str(tmp_path), [2, 5])
    with open(tmp_path / "checkpoints" / "5" / "position" / "position.json") as f:
        position = json.load(f)
    assert position == {"data": {"next_index": 5}, "layout": {"processes": 1, "devices": 1}}
    assert checkpointing.saved_layout(str(tmp_path)) == (5, position["layout"])
    assert checkpointing.layout_text({"processes": 2, "devices": 8}) == "2 processes x 4 devices"


def _garbage(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(max(size, 16)))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


# Each kind of file damage the restore can meet: (what is done, to which files of step 5).
_DAMAGE = {
    "array data truncated": ("state/d/*", _truncate),
    "array data overwritten with garbage": ("state/d/*", _garbage),
    "array index (ocdbt manifest) missing": ("state/manifest.ocdbt", os.remove),
    "a process's part of the array index missing": ("state/ocdbt.process_0", shutil.rmtree),
    "tree metadata missing": ("state/_METADATA", os.remove),
    "tree metadata garbage": ("state/_METADATA", _garbage),
    "position file missing": ("position/position.json", os.remove),
    "position file garbage": ("position/position.json", _garbage),
    "position of another shape": (
        "position/position.json",
        lambda p: p.write_text('{"layout": {"processes": 1, "devices": 1}}'),
    ),
}


@pytest.mark.parametrize("kind", sorted(_DAMAGE))
def test_each_kind_of_damage_sets_the_checkpoint_aside(tmp_path, kind):
    victim, damage = _DAMAGE[kind]
    _write(str(tmp_path), [2, 5])
    for path in (tmp_path / "checkpoints" / "5").glob(victim):
        damage(path)
    state, it, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 2 and list(next(it)) == [8, 9, 10, 11]
    assert len(lines) == 1 and lines[0].startswith("warning: checkpoint 5 cannot be restored")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5.corrupt"]


def test_a_missing_position_file_of_the_checkpoints_own_layout_is_damage(tmp_path):
    _write_legacy(str(tmp_path), [2, 5], states=({"next_index": None}, {"next_index": None}))
    os.remove(tmp_path / "checkpoints" / "5" / "data" / "process_1-of-2.json")
    state, _, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 2
    assert "lacks its input position file(s) process_1-of-2.json" in lines[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5.corrupt"]


# The machine's errors, raised where the restore reads (orbax's restore, or the files of a
# checkpoint from before the position item): none is damage.
_MACHINE = {
    "permission denied": (PermissionError(13, "Permission denied"), "make its files readable"),
    "full disk": (OSError(28, "No space left on device"), "free space"),
    "I/O error": (OSError(5, "Input/output error"), ""),
    "out of memory": (MemoryError(), ""),
    "tensorstore's words": (ValueError("PERMISSION_DENIED: reading state/d/abc"), "readable"),
}


@pytest.mark.parametrize("legacy", [False, True], ids=["position", "per-process files"])
@pytest.mark.parametrize("kind", sorted(_MACHINE))
def test_each_machine_error_moves_nothing(tmp_path, monkeypatch, kind, legacy):
    error, advice = _MACHINE[kind]
    if legacy:
        _write_legacy(str(tmp_path), [2, 5], states=({"next_index": None}, {"next_index": None}))
    else:
        _write(str(tmp_path), [2, 5])

    def fail(*args, **kwargs):
        raise error

    where = (
        (checkpointing.paths, "read_bytes")
        if legacy
        else (checkpointing.ocp.CheckpointManager, "restore")
    )
    monkeypatch.setattr(*where, fail)
    with pytest.raises(checkpointing.CheckpointError, match="cannot be read on this machine") as e:
        _restore(str(tmp_path))
    assert advice in str(e.value) and "nothing was moved" in str(e.value)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "5"]


# ------------------------------------------------------- folders in checkpoints/ not the run's


def _tree(path) -> dict:
    """{relative path: bytes, or None for a folder} of everything under `path`."""
    return {
        str(p.relative_to(path)): None if p.is_dir() else p.read_bytes()
        for p in sorted(path.rglob("*"))
    }


def test_folders_that_are_not_steps_are_left_alone_with_one_line(tmp_path):
    _write(str(tmp_path), [2, 5])
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(checkpoints / "5", checkpoints / "5_copy")  # a user's backup
    (checkpoints / "backup").mkdir()
    (checkpoints / "backup" / "notes.txt").write_text("a user's file")
    shutil.copytree(checkpoints / "2", checkpoints / "002")  # no step to orbax: a leading 0
    theirs = {n: _tree(checkpoints / n) for n in ("5_copy", "backup", "002")}
    state, it, lines = _restore(str(tmp_path))
    assert int(state["step"]) == 5 and list(next(it)) == [20, 21, 22, 23]
    assert lines == [
        f"{checkpoints} also holds 002, 5_copy and backup, which are not this run's "
        "checkpoints: left as they are"
    ]
    # The run goes on beside them: orbax neither lists nor deletes them (keep=1 drops 5 and 6).
    _write(str(tmp_path), [6, 7], _cfg(keep=1))
    assert sorted(os.listdir(checkpoints)) == ["002", "5_copy", "7", "backup"]
    assert {n: _tree(checkpoints / n) for n in theirs} == theirs
    assert checkpoint_steps.saved_steps(str(tmp_path)) == [7]


def _export_there(checkpoints):
    (checkpoints / "9" / "discriminator").mkdir(parents=True)
    (checkpoints / "9" / "export.json").write_text("{}")


def _file_there(checkpoints):
    (checkpoints / "9").write_text("a user's file")


def _other_digits(checkpoints):
    # orbax's step names are [1-9] then any of Unicode's decimal digits: '9' and ARABIC-INDIC
    # DIGIT NINE, a step 99 to it.
    shutil.copytree(checkpoints / "5", checkpoints / "9\u0669")


@pytest.mark.parametrize(
    "make,says",
    [
        (_export_there, "holds discriminator, export.json, not a checkpoint"),
        (_file_there, "is a file, not a checkpoint folder"),
        (_other_digits, "is named in digits that this run never writes"),
    ],
    ids=["an export", "a file", "non-ASCII digits"],
)
def test_an_entry_orbax_takes_for_a_step_that_is_no_checkpoint_is_refused_and_kept(
    tmp_path, make, says
):
    """Left in place, orbax would restore it (or set it aside as damage), delete it once older
    than checkpoint.keep, and fail to save step 9 (StepAlreadyExistsError)."""
    _write(str(tmp_path), [2, 5])
    checkpoints = tmp_path / "checkpoints"
    make(checkpoints)
    before = _tree(checkpoints)
    with pytest.raises(checkpointing.ForeignFolderError) as e:
        _restore(str(tmp_path))
    message = str(e.value)
    assert says in message and "orbax would take it for checkpoint 9" in message  # or 99
    assert f"move it out of {checkpoints}; nothing was changed" in message
    assert "\n" not in message
    assert _tree(checkpoints) == before


def test_a_checkpoint_renamed_by_hand_is_refused_naming_what_it_holds(tmp_path):
    """Found from its input position before orbax opens it: resumed, it would train steps 6 to 9
    again and fail to save step 9, which its own folder holds."""
    _write(str(tmp_path), [2, 5])
    checkpoints = tmp_path / "checkpoints"
    os.rename(checkpoints / "5", checkpoints / "9")
    before = _tree(checkpoints)
    with pytest.raises(checkpointing.ForeignFolderError) as e:
        _restore(str(tmp_path))
    assert str(e.value) == (
        f"{checkpoints}/9 holds the run's state at step 5 (its input position), not step 9: "
        "renamed or copied by hand, it would be resumed as the wrong step; rename it back to "
        f"{checkpoints}/5, or move it out of {checkpoints}; nothing was changed"
    )
    assert _tree(checkpoints) == before
    # A copy beside the original: the way out is to move it away.
    shutil.copytree(checkpoints / "9", checkpoints / "5")
    with pytest.raises(checkpointing.ForeignFolderError, match=r"\(.*/5 is there\)"):
        checkpointing.survey(str(checkpoints))


def test_a_renamed_checkpoint_without_a_position_is_found_by_its_state(tmp_path):
    """A state-only checkpoint (fine-tuning's) has no input position: its state's step says."""
    manager = checkpointing.make_manager(str(tmp_path), _cfg())
    for step in (2, 5):
        checkpointing.save(manager, step, _state(step), None)
        manager.wait_until_finished()
    manager.close()
    checkpoints = tmp_path / "checkpoints"
    os.rename(checkpoints / "5", checkpoints / "9")
    assert checkpointing.survey(str(checkpoints)) == []  # nothing to read it from before
    manager = checkpointing.make_manager(str(tmp_path), _cfg())
    try:
        with pytest.raises(checkpointing.ForeignFolderError, match="at step 5 \\(its train state"):
            checkpointing.restore_latest(manager, _abstract(), None)
    finally:
        manager.close()
    assert sorted(os.listdir(checkpoints)) == ["2", "9"]


def test_step_names_are_ascii_digits_as_orbax_writes_them(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for name in ("\u00b2", "007", "\u0669", "3", "4.corrupt", "\u00b2.corrupt"):
        (checkpoints / name).mkdir(parents=True)
    # '²' passes str.isdigit() and fails int(); '007' and '٩' are no names orbax gives a step.
    assert checkpoint_steps.saved_steps(str(tmp_path)) == [3]
    assert checkpointing.set_aside(str(tmp_path)) == ["4.corrupt"]
    others = ["007", "\u00b2", "\u00b2.corrupt", "\u0669"]
    assert checkpointing.survey(str(checkpoints)) == others


def test_a_step_folder_that_cannot_be_listed_is_left_to_the_restore(tmp_path, monkeypatch):
    """The survey cannot tell what it holds: no verdict (the restore names the machine's error
    in one line, as test_each_machine_error_moves_nothing checks)."""
    _write(str(tmp_path), [2, 5])
    checkpoints = str(tmp_path / "checkpoints")
    real = checkpointing.paths.listdir

    def listdir(path):
        if path != checkpoints:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(checkpointing.paths, "listdir", listdir)
    assert checkpointing.survey(checkpoints) == []
