"""wandb_mirror: metrics rows and the config mirrored to W&B, in W&B's offline mode (nothing is
sent anywhere); what W&B wrote is read back from its own run files."""

import glob
import json
import os
import struct

import pytest

from electra_jax import validate
from electra_jax.config.schema import flatten
from electra_jax.errors import ConfigError
from electra_jax.pretraining import metrics
from tests.conftest import micro_config

NEEDS_WANDB = "W&B mirroring needs wandb (pip install -e '.[wandb]')"


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, its settings and caches under tmp_path, WANDB_DIR unset."""
    pytest.importorskip("wandb", reason=NEEDS_WANDB)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))


def _records(path):
    """The protobuf records of a W&B run file (run-ID.wandb): a ':W&B' header of 7 bytes, then
    LevelDB's log format (32 KB blocks; records of crc, length, kind, data, split across
    blocks as first, middle, last pieces)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    block, pos, pieces = 32 * 1024, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # W&B writes one or the other


def _offline_runs(workdir):
    """[(run id, config {key: value}, history rows without W&B's own keys)] of each start."""
    runs = []
    for path in sorted(
        glob.glob(
            os.path.join(workdir, "wandb", "start-*", "wandb", "offline-run-*", "run-*.wandb")
        )
    ):
        run_id, config, rows = None, {}, []
        for record in _records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "config":
                config.update({_key(u): json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                row = {_key(i): json.loads(i.value_json) for i in record.history.item}
                rows.append({k: v for k, v in row.items() if not k.startswith("_")})
        runs.append((run_id, config, rows))
    return runs


def _write(workdir, config, resume_step, rows):
    writer = metrics.MetricsWriter(str(workdir), True, resume_step=resume_step, config=config)
    for step, row in rows:
        writer.write(step, row)
    writer.close()
    # W&B's service writes the run's file after finish() returns; its teardown waits for it, as
    # the end of a training process does.
    import wandb

    wandb.teardown()


def test_rows_and_config_are_mirrored_and_a_resume_attaches_to_the_same_run(tmp_path, offline):
    config = micro_config()
    config.log.wandb_project = "electra-jax-test"
    workdir = tmp_path / "run"
    workdir.mkdir()
    _write(workdir, config, 0, [(s, {"loss": 1.0 / s, "mfu": None}) for s in (1, 2, 3)])
    # Resumed from the checkpoint of step 2, with a setting a resume may change.
    config.log.every_steps = 5
    _write(workdir, config, 2, [(s, {"loss": 1.0 / s, "mfu": None}) for s in (3, 4)])

    record = json.loads((workdir / "wandb.json").read_text())
    assert record["project"] == "electra-jax-test"
    (first_id, first_config, first_rows), (second_id, second_config, second_rows) = _offline_runs(
        workdir
    )
    assert first_id == second_id == record["id"]  # one W&B run: the resume attached to it
    # Rows as metrics.jsonl has them (nulls left out), with the step as a field.
    assert first_rows == [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    assert second_rows == [{"step": s, "loss": 1.0 / s} for s in (3, 4)]
    assert metrics.read_rows(str(workdir / "metrics.jsonl")) == [
        {"step": s, "loss": 1.0 / s, "mfu": None} for s in (1, 2, 3, 4)
    ]
    # The config, as config.json holds it; the resume's own settings on the second start.
    expected = micro_config()
    expected.log.wandb_project = "electra-jax-test"
    assert flatten(first_config) == flatten(expected.to_dict())
    assert second_config["log"]["every_steps"] == 5


def test_no_project_starts_nothing(tmp_path, offline):
    _write(tmp_path, micro_config(), 0, [(1, {"loss": 1.0})])
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "tensorboard"]


def test_a_wandb_that_cannot_start_is_one_warning_and_the_run_goes_on(
    tmp_path, offline, monkeypatch, capsys
):
    import wandb

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)\ncall wandb.login")

    monkeypatch.setattr(wandb, "init", refuse)
    config = micro_config()
    config.log.wandb_project = "electra-jax-test"
    _write(tmp_path, config, 0, [(1, {"loss": 1.0})])
    err = capsys.readouterr().err
    assert err == (
        "warning: W&B: cannot start the run (api_key not configured (no-tty) call wandb.login); "
        "metrics go to metrics.jsonl and TensorBoard only\n"
    )
    assert metrics.read_rows(str(tmp_path / "metrics.jsonl")) == [{"step": 1, "loss": 1.0}]


def test_a_project_without_wandb_installed_is_refused_before_the_run(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    config = micro_config()
    config.log.wandb_project = "electra"
    with pytest.raises(ConfigError, match=r"needs wandb: pip install -e '\.\[wandb\]'"):
        validate.check_config(config)
    config.log.wandb_project = ""
    validate.check_config(config)


def test_wandb_starts_and_finishes_within_stated_deadlines(tmp_path, monkeypatch):
    """W&B's start and its final uploads are given the deadlines docs/reliability.md states,
    instead of a finish that blocks until every upload is done."""
    import wandb

    from electra_jax.pretraining import wandb_mirror

    asked = {}

    def fake_init(**kwargs):
        asked.update(kwargs)
        raise RuntimeError("no network here")  # the mirror's one warning line, no run

    monkeypatch.setattr(wandb, "init", fake_init)
    config = micro_config()
    config.log.wandb_project = "electra-jax-test"
    warnings = []
    assert wandb_mirror.Mirror.start(str(tmp_path), config, warnings.append) is None
    assert asked["settings"].init_timeout == wandb_mirror.INIT_TIMEOUT_SECONDS == 90.0
    assert asked["settings"].finish_timeout == wandb_mirror.FINISH_TIMEOUT_SECONDS > 0
    assert len(warnings) == 1 and "no network here" in warnings[0]
