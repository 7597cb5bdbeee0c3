"""Checkpoints that cannot be restored are moved aside, never deleted; the previous one is used."""

import asyncio
import gc
import logging
import os

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from electra_jax import checkpointing


def _cfg(keep=5, keep_every_steps=0):
    return ml_collections.ConfigDict(
        {"keep": keep, "every_steps": 1, "keep_every_steps": keep_every_steps}
    )


def _iterator():
    return iter(grain.MapDataset.range(1000).batch(4).to_iter_dataset())


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
        ("data/process_0-of-1.json", "truncate"),  # the iterator position
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
    checkpointing.save(manager, 5, _state(5), _iterator())
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
    assert not checkpointing.has_checkpoints(str(tmp_path / "elsewhere"))
    assert checkpointing.has_checkpoints(str(tmp_path))
    assert checkpointing.saved_steps(str(tmp_path)) == [2]
    assert checkpointing.saved_steps(str(tmp_path / "elsewhere")) == []


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
    steps = sorted(int(n) for n in os.listdir(checkpointing.checkpoint_dir(workdir)) if n.isdigit())
    assert steps == [4, 8, 10, 12]
    _write(str(tmp_path / "plain"), [2, 4, 6, 8], _cfg(keep=2))
    plain = os.listdir(checkpointing.checkpoint_dir(str(tmp_path / "plain")))
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
    from electra_jax import loop
    from tests.conftest import micro_config_file, run_command
    from tests.test_loop import config_with, prepare_shared_data

    tokenizer, cache_dir = prepare_shared_data(tmp_path_factory)
    cfg = config_with((tokenizer, cache_dir))
    cfg.train.num_steps = 3
    workdir = tmp_path / "w"
    loop.train(cfg, str(workdir))
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
    assert keep(record("/electra_jax/loop.py", full))  # not orbax's
    assert keep(record(orbax, full, logging.WARNING))  # below ERROR: absl's verbosity decides
