"""benchmarks/studies/learning_curves/learning_curves.py: curves of both sides over seeds, the
prior, the summary line."""

import json
import math

import pytest

from benchmarks.studies.learning_curves import learning_curves as lc


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _two_seeds(tmp_path):
    workdirs = []
    for seed in range(2):
        w = tmp_path / f"s{seed}"
        w.mkdir()
        for side, name in lc.SIDES.items():
            offset = 0.1 * seed + (0.5 if side == "reference" else 0.0)
            rows = [
                {
                    "step": step,
                    "gen_loss": 7.0 - step / 100 + offset,
                    "disc_loss": 0.4 - step / 1000,
                    "disc_recall": step / 1000,
                    "gen_accuracy": step / 500,
                    "replaced_fraction": 0.125,
                }
                for step in range(10, 110, 10)
            ]
            rows.append({"step": 5, "loss": 1.0})  # a row without the curves' keys is skipped
            _write(w / name, rows)
        workdirs.append(str(w))
    return workdirs


def test_curves_bands_prior_and_summary(tmp_path):
    workdirs = _two_seeds(tmp_path)
    data = lc.curves(workdirs, smooth_rows=1)
    assert data["electra_jax"]["gen_loss"]["steps"] == list(range(10, 110, 10))
    assert math.isclose(data["reference"]["gen_loss"]["runs"][1][0], 7.0 - 0.1 + 0.1 + 0.5)
    expected_prior = -(0.125 * math.log(0.125) + 0.875 * math.log(0.875))
    assert math.isclose(data["electra_jax"]["prior"]["runs"][0][0], expected_prior)
    summary = lc.tail_summary(data, tail=1)
    assert summary["electra_jax"]["gen_loss"] == {
        "mean": 6.05,
        "spread": 0.1,
        "runs": 2,
        "last_step": 100,
    }
    assert summary["reference"]["gen_loss"]["mean"] == 6.55
    assert lc.smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    out = tmp_path / "curves.png"
    lc.plot(data, str(out), "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_draws_one_curve_per_workdir_and_side(tmp_path, capsys):
    workdirs = _two_seeds(tmp_path)
    out = tmp_path / "each.png"
    lc.main([*workdirs, "--out", str(out), "--each", "--smooth", "1", "--tail", "1"])
    summary = json.loads(capsys.readouterr().out)
    assert sorted(summary) == ["s0", "s0 reference", "s1", "s1 reference"]
    assert summary["s1"]["gen_loss"] == {"mean": 6.1, "spread": 0.0, "runs": 1, "last_step": 100}
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_to_plot_names_the_files_it_read(tmp_path, capsys):
    """It said "nothing to plot" without naming the file that was missing."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(SystemExit) as e:
        lc.main([str(tmp_path / "w"), "--out", str(tmp_path / "x.png")])
    line = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in line
    assert f"{tmp_path}/w/metrics.jsonl holds no row with disc_loss" in line
    assert f"{tmp_path}/w/hf_reference_metrics.jsonl does not exist" in line
    assert not (tmp_path / "x.png").exists()
