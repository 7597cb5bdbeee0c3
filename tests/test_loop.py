"""End to end on the builtin corpus with the micro model: train, log, checkpoint, resume."""

import json
import math
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from electra_jax import loop, metrics
from tests.conftest import micro_config

FIELDS = {
    "step",
    "loss",
    "gen_loss",
    "disc_loss",
    "gen_accuracy",
    "disc_accuracy",
    "replaced_fraction",
    "learning_rate",
    "grad_norm",
    "tokens_per_sec",
    "mfu",
    "elapsed_sec",
}


_SHARED: dict = {}


def prepare_shared_data(tmp_path_factory) -> tuple[str, str]:
    """(tokenizer path, cache dir) of the micro config, made once per session for all modules."""
    if "paths" not in _SHARED:
        root = tmp_path_factory.mktemp("data")
        cfg = micro_config()
        cfg.data.cache_dir = str(root / "cache")
        cfg.train.num_steps = 1
        loop.train(cfg, str(root / "first"))
        _SHARED["paths"] = (str(root / "first" / "tokenizer" / "spm.model"), cfg.data.cache_dir)
    return _SHARED["paths"]


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    """Tokenizer and prepared shards made once, reused through data.tokenizer / data.cache_dir."""
    return prepare_shared_data(tmp_path_factory)


def config_with(shared_data):
    """The micro config reading the shared tokenizer and prepared data."""
    cfg = micro_config()
    cfg.data.tokenizer, cfg.data.cache_dir = shared_data
    return cfg


@pytest.mark.slow
def test_train_writes_the_workdir_and_resumes_exactly(shared_data, tmp_path):
    cfg = config_with(shared_data)
    straight = tmp_path / "straight"
    last = loop.train(cfg, str(straight))
    rows = metrics.read_rows(str(straight / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert set(rows[0]) >= FIELDS
    assert rows[0]["mfu"] is None  # no known peak for a CPU
    assert last["loss"] == rows[-1]["loss"]
    assert json.loads((straight / "config.json").read_text())["model"]["hidden_size"] == 64
    assert sorted(os.listdir(straight / "checkpoints")) == ["3", "6"]
    assert os.listdir(straight / "tensorboard")

    # Stop at step 4 (checkpoint 3 and 4 exist), then the same call finishes the run.
    resumed = tmp_path / "resumed"
    loop.train(cfg, str(resumed), stop_after=4)
    loop.train(cfg, str(resumed))
    again = metrics.read_rows(str(resumed / "metrics.jsonl"))
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(rows, again, strict=True):
        for k in ("loss", "gen_loss", "disc_loss", "grad_norm", "gen_accuracy"):
            assert a[k] == b[k], (a["step"], k)


@pytest.mark.slow
def test_resume_drops_rows_logged_after_the_last_checkpoint(shared_data, tmp_path):
    cfg = config_with(shared_data)
    workdir = tmp_path / "w"
    loop.train(cfg, str(workdir), stop_after=3)
    # A crash after step 3 could have logged steps 4-5 without checkpointing them.
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss": -1.0}) + "\n")
        f.write('{"step": 5, "lo')  # torn last line
    loop.train(cfg, str(workdir))
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[3]["loss"] != -1.0


@pytest.mark.slow
def test_nan_stops_the_run_naming_the_step_and_the_last_good_checkpoint(shared_data, tmp_path):
    cfg = config_with(shared_data)
    cfg.train.debug_nan_at_step = 4  # the update of step 5 is NaN
    cfg.log.every_steps = 2
    workdir = tmp_path / "w"
    with pytest.raises(loop.NonFiniteError) as e:
        loop.train(cfg, str(workdir))
    message = str(e.value)
    assert "at step 5 (found checking steps 5-6" in message, message
    assert f"last good checkpoint: {workdir / 'checkpoints' / '3'}" in message
    assert "nan_policy='skip'" in message
    # Checkpoint 6 (due at step 6) was never written: its state descends from the NaN update.
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]
    assert [r["step"] for r in metrics.read_rows(str(workdir / "metrics.jsonl"))] == [2, 4]


@pytest.mark.slow
def test_nan_policy_skip_keeps_the_state_and_counts_the_skip(shared_data, tmp_path):
    cfg = config_with(shared_data)
    cfg.train.nan_policy = "skip"
    cfg.train.debug_nan_at_step = 4
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 1, 10
    workdir = tmp_path / "w"
    loop.train(cfg, str(workdir))
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped_updates"] for r in rows] == [0, 0, 0, 0, 1, 0]
    assert math.isnan(rows[4]["loss"])
    assert math.isfinite(rows[5]["loss"]) and math.isfinite(rows[5]["grad_norm"])

    def saved(step):
        path = workdir / "checkpoints" / str(step) / "state"
        return ocp.StandardCheckpointer().restore(path)

    after4, after5, after6 = saved(4), saved(5), saved(6)
    # The skipped update kept params and optimizer state but still counted the step.
    assert int(after5["step"]) == 5
    for part in ("params", "opt_state"):
        a, b, c = (jax.tree_util.tree_leaves(x[part]) for x in (after4, after5, after6))
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), part
        assert not all(np.array_equal(x, y) for x, y in zip(b, c, strict=True)), part
        assert all(np.isfinite(x).all() for x in c if np.issubdtype(x.dtype, np.floating))


def test_describe_reports_the_dry_run_fields():
    summary = loop.describe(micro_config())
    for key in (
        "discriminator_params",
        "generator_params",
        "generator_hidden_size",
        "batch_size",
        "seq_length",
        "learning_rate",
        "mask_prob",
        "flops_per_step",
    ):
        assert key in summary
    assert summary["generator_hidden_size"] == 16 and summary["flops_per_step"] > 0
