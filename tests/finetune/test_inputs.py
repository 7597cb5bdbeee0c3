"""finetune/inputs.py through the runner: a fine-tuning records what it read from outside its
workdir (task files, init_from at a fixed step and its weights' digest) and holds a resume to it,
unless --allow_change names the change, which is then recorded in config_changes.jsonl."""

import json
import shutil

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax.errors import ConfigError
from electra_jax.finetune import fit, initial, inputs, loop, saved
from electra_jax.pretraining.optimizer_step import TrainState
from electra_jax.store import checkpoint_steps, checkpointing
from tests.finetune.test_loop import _config, _sst2
from tests.micro import micro_config


def _glue(tmp_path, **overrides):
    """12 steps of SST-2 with checkpoints every 4."""
    data = _sst2(tmp_path / "SST-2", n_train=80, n_dev=24)
    settings = dict(max_train_examples=64, log_every_steps=5, **{"checkpoint.every_steps": 4})
    return _config(data, **{**settings, **overrides})


def _model_json(workdir) -> dict:
    return json.loads((workdir / saved.MODEL_FILE).read_text())


def _changes(workdir) -> list[dict]:
    path = workdir / inputs.CHANGES_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cut_before_the_first_checkpoint(config, workdir, monkeypatch):
    """A start killed once its records are written, before any step was saved."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(fit, "run_steps", killed)
        with pytest.raises(KeyboardInterrupt):
            loop.finetune(config, str(workdir))
    assert (workdir / saved.CONFIG_FILE).exists()
    assert not checkpoint_steps.has_checkpoints(str(workdir))


def test_flipped_labels_under_the_same_data_dir_are_refused_unless_allowed(tmp_path):
    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    assert loop.finetune(config, str(workdir), stop_after=5)["stopped_at"] == 5
    recorded = _model_json(workdir)["inputs"]["data_files"]
    train = tmp_path / "SST-2" / "train.tsv"
    assert set(recorded) == {str(train), str(tmp_path / "SST-2" / "dev.tsv")}
    assert recorded[str(train)] == inputs.file_facts(str(train))
    lines = train.read_text().splitlines()
    flipped = [lines[0]] + [f"{t}\t{1 - int(y)}" for t, y in (x.split("\t") for x in lines[1:])]
    train.write_text("\n".join(flipped) + "\n")  # same size, other labels
    before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
    with pytest.raises(ConfigError) as e:
        loop.finetune(config, str(workdir))
    assert str(e.value).startswith(
        f"--workdir {workdir}: the run started from other task files: {train} changed ("
    )
    assert "--allow_change=data_dir" in str(e.value)
    after = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
    assert after.keys() == before.keys() and after["model.json"] == before["model.json"]
    # Allowed: it goes on with the new files from its checkpoint, and says so.
    results = loop.finetune(config, str(workdir), allow_changes=("data_dir",))
    assert results["steps"] == 12
    (row,) = _changes(workdir)
    assert row["step"] == 5 and list(row["changes"]) == ["inputs.data_files"]
    assert row["changes"]["inputs.data_files"]["to"][str(train)] == inputs.file_facts(str(train))
    assert _model_json(workdir)["inputs"]["data_files"][str(train)] == inputs.file_facts(str(train))
    with pytest.raises(ConfigError, match=r"--allow_change=tokenizer: a fine-tuning's resume may"):
        loop.finetune(config, str(workdir), allow_changes=("tokenizer",))
    # Finished, then asked again after its dev.tsv changed: refused, saying what changed (it
    # gave back the old results with exit 0 and no line); allowed, the results with a warning.
    dev = tmp_path / "SST-2" / "dev.tsv"
    dev.write_text(dev.read_text() + "the river ran\t1\n")
    with pytest.raises(ConfigError) as e:
        loop.finetune(config, str(workdir))
    assert str(e.value).startswith(
        f"--workdir {workdir} holds this run, finished on other task files: {dev} changed ("
    )
    assert loop.finetune(config, str(workdir), allow_changes=("data_dir",))["steps"] == 12


def _pretraining_run(tmp_path, tmp_path_factory):
    from tests.test_export import make_workdir

    run = make_workdir(tmp_path_factory)
    copy = tmp_path / "pretrained"
    shutil.copytree(run["path"], copy)
    return run, copy


def test_init_from_is_read_at_the_step_the_run_started_from(
    tmp_path, tmp_path_factory, monkeypatch
):
    """A start cut short before its first checkpoint, resumed after its pre-training went on
    from checkpoint 6 to 9: the resume reads checkpoint 6 again, as model.json says."""
    run, pretrained = _pretraining_run(tmp_path, tmp_path_factory)
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    config = _config(data, init_from=str(pretrained), num_epochs=1.0, **{"model.hidden_size": 64})
    workdir = tmp_path / "w"
    read = []
    original = initial._load_pretrained
    monkeypatch.setattr(
        initial, "_load_pretrained", lambda path: read.append(path) or original(path)
    )
    _cut_before_the_first_checkpoint(config, workdir, monkeypatch)
    record = _model_json(workdir)
    assert record["pretraining"]["step"] == 6
    assert record["inputs"]["init_from"]["load"] == f"{pretrained}@6"
    # The pre-training goes on: a checkpoint 9 of other weights.
    params = jax.tree_util.tree_map(lambda x: np.asarray(x) + 1.0, run["params"])
    tx = optax.sgd(0.1)
    manager = checkpointing.make_manager(str(pretrained), micro_config().checkpoint)
    state = TrainState(jnp.int32(9), params, tx.init(params), jax.random.PRNGKey(9))
    checkpointing.save(
        manager, 9, state, iter(grain.MapDataset.range(8).batch(4).to_iter_dataset())
    )
    manager.wait_until_finished()
    manager.close()
    results = loop.finetune(config, str(workdir))
    assert read == [str(pretrained), f"{pretrained}@6"]
    assert results["init_source"] == f"{pretrained} (checkpoint 6)"
    assert _model_json(workdir)["pretraining"]["step"] == 6 and not _changes(workdir)


def test_other_weights_under_the_same_init_from_are_refused_unless_allowed(
    tmp_path, tmp_path_factory, monkeypatch
):
    from safetensors.numpy import load_file, save_file

    from tests.test_export import make_export

    export = tmp_path / "export"
    shutil.copytree(make_export(tmp_path_factory), export)
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    config = _config(data, init_from=str(export), num_epochs=1.0, **{"model.hidden_size": 64})
    workdir = tmp_path / "w"
    _cut_before_the_first_checkpoint(config, workdir, monkeypatch)
    first = _model_json(workdir)["inputs"]["init_from"]
    assert first["load"] == str(export) and len(first["weights_sha256"]) == 64
    # The export is written again from other weights.
    weights = export / "discriminator" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in sorted(tensors) if "encoder.layer.0" in n)  # in the encoder
    tensors[name] = tensors[name] + 0.5
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ConfigError) as e:
        loop.finetune(config, str(workdir))
    assert str(e.value).startswith(
        f"--workdir {workdir}: the pre-trained weights at {export} are not the ones the run "
        "started from (another digest)"
    )
    loop.finetune(config, str(workdir), allow_changes=("init_from",))
    (row,) = _changes(workdir)
    assert list(row["changes"]) == ["inputs.init_from"] and row["step"] == 0
    now = _model_json(workdir)["inputs"]["init_from"]["weights_sha256"]
    assert row["changes"]["inputs.init_from"]["to"]["weights_sha256"] == now
    assert now != first["weights_sha256"]


def _a_run_from_before_the_record(tmp_path):
    """(config, workdir) of a run stopped at step 5 whose model.json has no inputs record."""
    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    loop.finetune(config, str(workdir), stop_after=5)
    record = _model_json(workdir)
    del record["inputs"]
    (workdir / saved.MODEL_FILE).write_text(json.dumps(record))
    return config, workdir


def test_a_run_from_before_the_record_resumes_and_gets_one(tmp_path):
    config, workdir = _a_run_from_before_the_record(tmp_path)
    loop.finetune(config, str(workdir))
    assert _model_json(workdir)["inputs"]["data_files"] and not _changes(workdir)


def test_a_data_dir_moved_under_a_run_from_before_the_record_is_recorded(tmp_path):
    """The allowed change of the setting itself is recorded whether or not model.json has its
    inputs record (config_changes.jsonl and config.json), so the next rerun needs no flag."""
    config, workdir = _a_run_from_before_the_record(tmp_path)
    moved = tmp_path / "moved"
    shutil.copytree(config.data_dir, moved)
    was, config.data_dir = config.data_dir, str(moved)
    results = loop.finetune(config, str(workdir), allow_changes=("data_dir",))
    assert _changes(workdir) == [
        {"step": 5, "changes": {"data_dir": {"from": was, "to": str(moved)}}}
    ]
    assert json.loads((workdir / saved.CONFIG_FILE).read_text())["data_dir"] == str(moved)
    assert loop.finetune(config, str(workdir)) == results


def test_the_weights_digest_follows_the_values_not_the_container():
    a = {"x": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}, "b": np.zeros(2)}
    same = {"b": np.zeros(2), "x": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    assert inputs.weights_digest(a) == inputs.weights_digest(same)
    other = {"x": {"kernel": np.arange(6, dtype=np.float32).reshape(3, 2)}, "b": np.zeros(2)}
    assert inputs.weights_digest(a) != inputs.weights_digest(other)  # another shape
    nudged = {"x": {"kernel": a["x"]["kernel"] + 1e-7}, "b": np.zeros(2)}
    assert inputs.weights_digest(a) != inputs.weights_digest(nudged)
