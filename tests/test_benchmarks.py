import json
import subprocess
import sys

from tests.conftest import ROOT, subprocess_env


def test_train_step_benchmark_prints_one_json_line():
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/train_step.py",
            "--config=configs/tiny.py",
            "--batch=4",
            "--seq=32",
            "--steps=2",
            "--warmup=1",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["finite"] and row["batch"] == 4 and row["seq"] == 32
    assert row["tokens_per_sec"] > 0 and row["median_s_per_step"] > 0
    assert row["mfu"] is None  # no known peak for a CPU
    # configs/tiny.py inherits 4 steps per call: the 2 timed steps are one whole call of 4.
    assert row["steps_per_call"] == 4 and row["steps"] == 4
