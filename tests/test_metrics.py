import json

from electra_jax import metrics
from electra_jax.model import spec_from_config
from tests.conftest import load_config


def test_flops_count_by_hand_for_one_layer():
    cfg = load_config("small")
    cfg.model.num_layers = 1
    spec = spec_from_config(cfg.model, cfg.generator, 1000)
    b, length, n = 2, 16, 3
    f = metrics.count_flops(spec, b, length, n)
    e, h, ff, hg, fg = 128, 256, 1024, 64, 256
    disc = b * length * (2 * e * h + 8 * h * h + 4 * h * ff + 4 * length * h + 2 * h * h + 2 * h)
    gen = b * length * (2 * e * hg + 8 * hg * hg + 4 * hg * fg + 4 * length * hg)
    gen += b * n * (2 * hg * e + 2 * e * 1000)
    assert f["discriminator"] == 3 * disc and f["generator"] == 3 * gen
    assert f["total"] == 3 * (disc + gen)


def test_peak_lookup_and_override():
    assert metrics.peak_flops_per_device("TPU v4") == 275e12
    assert metrics.peak_flops_per_device("NVIDIA H200") == 989e12
    assert metrics.peak_flops_per_device("cpu") is None
    assert metrics.peak_flops_per_device("cpu", 1e11) == 1e11


def test_writer_keeps_rows_up_to_the_resume_step(tmp_path):
    w = metrics.MetricsWriter(str(tmp_path), enabled=True)
    for s in (1, 2, 3):
        w.write(s, {"loss": float(s), "mfu": None})
    w.close()
    w = metrics.MetricsWriter(str(tmp_path), enabled=True, resume_step=2)
    w.write(3, {"loss": 30.0, "mfu": None})
    w.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert rows[0]["mfu"] is None


def test_writer_on_other_processes_writes_nothing(tmp_path):
    w = metrics.MetricsWriter(str(tmp_path), enabled=False)
    w.write(1, {"loss": 1.0})
    w.close()
    assert list(tmp_path.iterdir()) == []
