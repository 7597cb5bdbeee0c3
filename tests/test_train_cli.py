"""The command line: dry run, and bad input as one line with exit code 2."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env


def _run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "electra_jax.train", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_dry_run_prints_one_json_line():
    out = _run("--config=configs/small.py", "--dry_run")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(summary["discriminator_params"] - 13.5e6) / 13.5e6 < 0.03
    assert summary["generator_hidden_size"] == 64 and summary["batch_size"] == 128


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["--config.model.hidden_sz=3"],
            'unknown config key --config.model.hidden_sz; did you mean "hidden_size"',
        ),
        (["--config.train.batch_size=abc"], "--config.train.batch_size=abc"),
        (
            ["--config.model.num_heads=3"],
            "model.hidden_size=128 is not divisible by model.num_heads=3",
        ),
        (["--config.data.seq_length=1024"], "data.seq_length=1024"),
        (["--config.train.learning_rate=0"], "train.learning_rate=0.0 must be > 0"),
        (["--config.train.num_steps=0"], "train.num_steps=0 must be >= 1"),
        (["--config.generator.hidden_fraction=0.001"], "generator.hidden_fraction=0.001"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(args, expected):
    out = _run("--config=configs/tiny.py", "--dry_run", *args)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert expected in lines[0]


def test_missing_config_file_and_unwritable_workdir(tmp_path):
    out = _run("--config=configs/nope.py", "--dry_run")
    assert out.returncode == 2 and "configs/nope.py" in out.stderr
    blocked = tmp_path / "file"
    blocked.write_text("x")
    out = _run("--config=configs/tiny.py", f"--workdir={blocked}/sub")
    assert out.returncode == 2 and "not writable" in out.stderr and "Traceback" not in out.stderr
