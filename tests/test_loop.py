"""End to end on the builtin corpus with the micro model: train, log, checkpoint, resume."""

import json
import os

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


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    """Tokenizer and prepared shards made once, reused through data.tokenizer / data.cache_dir."""
    root = tmp_path_factory.mktemp("data")
    cfg = micro_config()
    cfg.data.cache_dir = str(root / "cache")
    cfg.train.num_steps = 1
    loop.train(cfg, str(root / "first"))
    return str(root / "first" / "tokenizer" / "spm.model"), cfg.data.cache_dir


def _config(shared_data):
    cfg = micro_config()
    cfg.data.tokenizer, cfg.data.cache_dir = shared_data
    return cfg


@pytest.mark.slow
def test_train_writes_the_workdir_and_resumes_exactly(shared_data, tmp_path):
    cfg = _config(shared_data)
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
    cfg = _config(shared_data)
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
