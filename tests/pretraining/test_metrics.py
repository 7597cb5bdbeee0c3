import json
import types

import pytest

from electra_jax.model.networks import spec_from_config
from electra_jax.objectives.catalog import OBJECTIVES
from electra_jax.pretraining import dry_run, metrics, program
from tests.conftest import load_config, micro_config


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


def test_flops_count_by_objective_by_hand():
    cfg = load_config("small")
    cfg.model.num_layers = 1
    spec = spec_from_config(cfg.model, cfg.generator, 1000)
    b, length, n = 2, 16, 3
    f = {name: metrics.count_flops(spec, b, length, n, name) for name in OBJECTIVES}
    e, h, v = 128, 256, 1000
    rtd_head, mlm_head = 2 * h * h + 2 * h, 2 * h * e + 2 * e * v
    electra = f["electra"]
    encoder = electra["discriminator"] - 3 * b * length * rtd_head
    assert f["electra_15"] == electra
    assert f["mlm"]["generator"] == 0
    assert f["mlm"]["discriminator"] == encoder + 3 * b * n * mlm_head
    assert f["replaced_mlm"]["generator"] == electra["generator"]
    assert f["replaced_mlm"]["discriminator"] == f["mlm"]["discriminator"]
    assert f["all_tokens_mlm"]["discriminator"] == (
        electra["discriminator"] + 3 * b * length * mlm_head
    )
    # electra_mlm: ELECTRA's parts plus a second pass, the encoder and the MLM head at the slots.
    assert f["electra_mlm"]["generator"] == electra["generator"]
    assert f["electra_mlm"]["discriminator"] == (
        electra["discriminator"] + f["mlm"]["discriminator"]
    )
    assert f["adversarial"]["discriminator"] == electra["discriminator"]
    # The baseline: a 1-unit dense on the 64-wide generator states at each slot.
    assert f["adversarial"]["generator"] == electra["generator"] + 3 * b * n * 2 * 64
    for counts in f.values():
        assert counts["total"] == counts["generator"] + counts["discriminator"]
    with pytest.raises(ValueError, match="objective.name="):
        metrics.count_flops(spec, b, length, n, "bert")


@pytest.mark.parametrize("name", OBJECTIVES)
def test_flops_count_matches_xla_cost_analysis(name):
    # Wide enough (hidden 128, 64 tokens) that matmuls dominate XLA's count as they do at scale;
    # XLA also counts elementwise work, the optimizer and the masking, hence the 10% margin.
    config = micro_config()
    config.model.hidden_size, config.model.intermediate_size = 128, 512
    config.model.embedding_size, config.data.seq_length = 64, 64
    config.objective.name = name
    config.model.scan_layers = False  # XLA's cost analysis counts a scanned layer once
    if name == "electra_mlm":  # its MLM pass weighted in, as it trains
        config.objective.disc_mlm_weight = 1.0
    if name == "two_stage":  # a generator of the discriminator's shape (128: 2 heads of 64)
        config.generator.hidden_fraction, config.model.num_heads = 1.0, 2
        config.objective.two_stage_steps = 1
    vocab = 1000
    spec, _, _, _, num_slots = program.build(config, vocab)
    counted = metrics.count_flops(
        spec, config.train.batch_size, config.data.seq_length, num_slots, name
    )["total"]
    xla = dry_run.compile_report(config, vocab)["xla_flops_per_step"]
    assert abs(xla / counted - 1) < 0.10, (name, xla, counted)


def test_peak_lookup_and_override():
    assert metrics.peak_flops_per_device("TPU v4") == 275e12
    # One core of a v3 chip (123 TFLOP/s for its two): the slices the paper configs name.
    assert metrics.peak_flops_per_device("TPU v3") == 123e12 / 2
    assert metrics.peak_flops_per_device("TPU v5 lite") == 197e12
    assert metrics.peak_flops_per_device("NVIDIA H200") == 989e12
    assert metrics.peak_flops_per_device("TPU7x") == 2307e12 / 2  # each TensorCore a device
    assert metrics.peak_flops_per_device("cpu") is None
    assert metrics.peak_flops_per_device("cpu", 1e11) == 1e11


@pytest.mark.parametrize(
    "kind, peak",
    [
        # jax's device_kind is the CUDA device name.
        ("NVIDIA H100 80GB HBM3", 989e12),  # the SXM card
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA GB200", 2500e12),  # not B200's
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),  # not L4's
        ("NVIDIA L40", None),  # neither
        ("NVIDIA RTX 6000 Ada Generation", None),
    ],
)
def test_gpu_peaks_by_device_kind(kind, peak):
    assert metrics.peak_flops_per_device(kind) == peak
    for _, source in metrics.GPU_PEAKS.values():
        assert source.startswith("https://www.nvidia.com/")


def test_an_accelerator_without_a_peak_is_one_line_naming_the_setting():
    device = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA L40")
    line = metrics.unknown_peak_line(device)
    assert "\n" not in line and "'NVIDIA L40'" in line and "log.peak_flops" in line
    assert metrics.unknown_peak_line(device, 181e12) is None  # set: nothing to say
    known = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA L40S")
    assert metrics.unknown_peak_line(known) is None
    cpu = types.SimpleNamespace(platform="cpu", device_kind="cpu")
    assert metrics.unknown_peak_line(cpu) is None  # no MFU is expected on a CPU


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
