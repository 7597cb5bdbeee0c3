"""dry_run: the --dry_run summary from shapes, and the ahead-of-time compile."""

from electra_jax import dry_run
from tests.conftest import micro_config


def test_describe_reports_the_dry_run_fields():
    config = micro_config()
    config.model.scan_layers = False  # XLA's cost analysis counts a scanned layer once
    summary = dry_run.describe(config)
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
    # Compiled ahead of time: XLA's memory plan and FLOP count come with it. At this size
    # LayerNorm, softmax and the optimizer are a fair share of the work, which the analytic
    # count (matmuls only) leaves out.
    assert summary["memory_per_device_bytes"] > summary["memory_state_bytes"] > 0
    assert 1.0 < summary["xla_flops_per_step"] / summary["flops_per_step"] < 1.3
    config.model.scan_layers = True
    assert dry_run.compile_report(config, config.data.vocab_size)["xla_flops_per_step"] is None
