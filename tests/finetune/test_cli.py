"""python -m electra_jax.finetune: bad input is one line on stderr and exit code 2; a diverged
run is one line and exit code 1, with no results written."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env
from tests.finetune.test_loop import _sst2

TINY = [
    "--config.vocab_size=40",
    "--config.seq_length=16",
    "--config.batch_size=16",
    "--config.model.hidden_size=32",
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.embedding_size=32",
]


def _finetune(workdir, *flags):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "electra_jax.finetune",
            "--config=configs/glue.py",
            *flags,
            f"--workdir={workdir}",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def _one_error_line(out) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    return lines[0]


def test_malformed_row_is_one_line_and_exit_2(tmp_path):
    data = tmp_path / "CoLA"
    data.mkdir()
    (data / "train.tsv").write_text("gj04\t1\t\tFine.\ngj04\t1\tNo label column.\n")
    (data / "dev.tsv").write_text("gj04\t1\t\tFine.\n")
    out = _finetune(tmp_path / "w", "--config.task=CoLA", f"--config.data_dir={data}")
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and "train.tsv line 2: 3 tab-separated fields" in lines[0]


@pytest.mark.parametrize(
    "flag,expected",
    [
        ("--config.num_epochs=inf", "config.num_epochs=inf must be finite and >= 0"),
        ("--config.learning_rate=nan", "config.learning_rate=nan must be finite and >= 0"),
    ],
)
def test_a_non_finite_setting_is_one_line_and_exit_2(tmp_path, flag, expected):
    out = _finetune(tmp_path / "w", f"--config.data_dir={tmp_path}", flag)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), out.stderr[-2000:]


def test_a_diverged_run_is_one_line_exit_1_and_writes_no_results(tmp_path):
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    workdir = tmp_path / "w"
    out = _finetune(
        workdir,
        f"--config.data_dir={data}",
        "--config.num_epochs=1",
        "--config.learning_rate=1e10",
        "--config.log_every_steps=1",
        *TINY,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    # Progress lines, then the one error line.
    line = _one_error_line(out)
    assert "fine-tuning diverged" in line and "lower config.learning_rate" in line, line
    assert not (workdir / "eval_results.json").exists()
    assert not (workdir / "dev_predictions.jsonl").exists()
