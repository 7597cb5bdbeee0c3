"""python -m electra_jax.finetune: bad input is one line on stderr and exit code 2."""

import subprocess
import sys

from tests.conftest import ROOT, subprocess_env


def test_malformed_row_is_one_line_and_exit_2(tmp_path):
    data = tmp_path / "CoLA"
    data.mkdir()
    (data / "train.tsv").write_text("gj04\t1\t\tFine.\ngj04\t1\tNo label column.\n")
    (data / "dev.tsv").write_text("gj04\t1\t\tFine.\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "electra_jax.finetune",
            "--config=configs/glue.py",
            "--config.task=CoLA",
            f"--config.data_dir={data}",
            f"--workdir={tmp_path / 'w'}",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and "train.tsv line 2: 3 tab-separated fields" in lines[0]
