"""dry_run: the --dry_run summary from shapes, and the ahead-of-time compile."""

import json
import re

import jax
import pytest

from electra_jax.errors import ConfigError
from electra_jax.pretraining import dry_run, topology
from tests.conftest import ROOT, micro_config, run_command
from tests.pretraining.test_topology import libtpu_env, needs_libtpu  # noqa: F401  (a fixture)


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


@pytest.mark.slow
@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_compiled_by_the_tpu_compiler_for_a_slice_that_is_not_here():
    """One slice, with the cost compiles (two slices without them, through the command:
    test_the_fit_alone_for_two_slices_compiles_the_runs_program_only)."""
    config = micro_config()
    target = topology.resolve("v5e:2x2")
    summary = dry_run.describe(config, target=target)
    _check_the_slices_fields(summary, config, slices=1)
    assert jax.devices()[0].platform == "cpu"  # and nothing of this machine's changed
    assert summary["ceiling_compile_seconds"] > 0
    # The unrolled cost compiles count about what the analytic count does (at this size
    # LayerNorm, softmax and the optimizer add a fair share), and the ceiling follows from them.
    assert 1.0 < summary["xla_flops_per_step"] / summary["flops_per_step"] < 1.5
    bound = summary["step_seconds_bound"]
    peak = topology.resolve("v5e:2x2").generation.bf16_flops_per_device * summary["devices"]
    assert summary["mfu_ceiling"] == round(summary["flops_per_step"] / (bound * peak), 4)
    assert "across slices" not in summary["cost_method"]
    # The ceiling from the compiler's cycles: a time per instruction, at the chip's clock,
    # never faster than the roofline of the totals (each instruction is bound by its own).
    clock = topology.resolve("v5e:2x2").generation.clock_hz
    seconds = summary["step_seconds_from_cycles"]
    assert seconds == summary["estimated_cycles_per_step"] / clock
    assert summary["mfu_ceiling_cycles"] == round(summary["flops_per_step"] / (seconds * peak), 4)
    assert 0 < summary["mfu_ceiling_cycles"] <= summary["mfu_ceiling"]
    assert summary["pallas_calls_per_step"] == 0
    assert "estimated cycles" in summary["mfu_ceiling_cycles_from"]


def _check_the_slices_fields(summary: dict, config, slices: int) -> None:
    """What a dry run for `slices` v5e:2x2 slices reports of them and of the run's program."""
    assert summary["platform"] == "tpu" and summary["device_kind"] == "TPU v5 lite"
    assert summary["devices"] == summary["chips"] == 4 * slices
    assert summary["hosts"] == slices and summary["slices"] == slices
    assert summary["mesh"] == {"data": 4 * slices, "fsdp": 1}
    # The run's own program: K steps per call, each device with its share of the batch.
    steps = config.train.steps_per_call
    assert summary["program"] == (f"{steps} steps per call" if steps > 1 else "one step per call")
    assert summary["batch_per_device"] * 4 * slices == config.train.batch_size
    used = summary["memory_per_device_bytes"]
    assert used >= summary["memory_state_bytes"] > 0 and summary["fits"]
    assert summary["headroom_bytes"] == summary["hbm_per_device_bytes"] - used


def test_the_cost_compiles_known_to_crash_libtpu_are_named(monkeypatch):
    """TPU7x's cost compiles crash libtpu 0.0.42.1's compiler (SIGSEGV, no exception to catch):
    the dry run leaves them out there and says why, and tries them with any other libtpu and
    for every other generation. (A micro dry run for tpu7x-8 takes 23-41 s on 2 shared cores,
    over the suite's budget for one test; the TPU7x compile the suite runs is
    test_compiled_costs' matmul.)"""
    tpu7x, v5e = topology.resolve("tpu7x-8").generation, topology.resolve("v5e:2x2").generation
    monkeypatch.setattr(dry_run.importlib.metadata, "version", lambda name: "0.0.42.1")
    reason = dry_run.cost_compiles_crash(tpu7x)
    assert "libtpu 0.0.42.1" in reason and "tpu7x" in reason and "\n" not in reason
    assert dry_run.cost_compiles_crash(v5e) is None
    monkeypatch.setattr(dry_run.importlib.metadata, "version", lambda name: "0.0.43")
    assert dry_run.cost_compiles_crash(tpu7x) is None


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_a_step_that_does_not_fit_is_one_line():
    config = micro_config()
    config.train.batch_size = 2**20
    config.train.steps_per_call = 1
    with pytest.raises(dry_run.DoesNotFit) as e:
        dry_run.describe(config, target=topology.resolve("v5e:2x2"))
    line = str(e.value)
    assert "\n" not in line and "RESOURCE_EXHAUSTED" in line
    need, have = (float(x) for x in re.findall(r"([\d.]+)G (?:of HBM|available)", line))
    assert need > have > 0
    for setting in ("train.batch_size", "train.grad_accum_steps", "mesh.fsdp", "train.remat"):
        assert setting in line


def test_the_command_refuses_a_bad_name_and_lone_flags():
    out = run_command(
        "electra_jax.train", "--config=configs/tiny.py", "--dry_run", "--topology=v4-100"
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert topology.ACCEPTED in out.stderr
    out = run_command("electra_jax.train", "--config=configs/tiny.py", "--topology=v4-128")
    assert out.returncode == 2 and "add --dry_run" in out.stderr
    out = run_command(
        "electra_jax.train", "--config=configs/tiny.py", "--dry_run", "--num_slices=2"
    )
    assert out.returncode == 2 and "--num_slices needs --topology" in out.stderr


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_the_batch_is_checked_against_the_slice_before_compiling():
    config = micro_config()
    config.train.batch_size = 6  # 4 devices on one slice, 8 on two
    with pytest.raises(ConfigError, match="train.batch_size=6 is not divisible by the 8 "):
        dry_run.describe(config, target=topology.resolve("v5e:2x2", num_slices=2))


@pytest.mark.slow
@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_the_fit_alone_for_two_slices_compiles_the_runs_program_only(tmp_path):
    """--noceiling, through the command: the run's program is compiled for the slices (the
    fit), the cost compiles are not, and the summary says so rather than giving a ceiling.
    One step per call: one compile."""
    config_file = tmp_path / "micro.py"
    config_file.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.micro import micro_config\n"
        "\n\ndef get_config():\n    return micro_config()\n"
    )
    out = run_command(
        "electra_jax.train", f"--config={config_file}", "--dry_run", "--topology=v5e:2x2",
        "--num_slices=2", "--noceiling", "--config.train.steps_per_call=1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    config = micro_config()
    config.train.steps_per_call = 1
    _check_the_slices_fields(summary, config, slices=2)
    assert summary["compile_seconds"] > 0
    assert summary["ceiling_compile_seconds"] is None and summary["cost_method"] is None
    assert summary["mfu_ceiling"] is None and summary["mfu_ceiling_cycles"] is None
