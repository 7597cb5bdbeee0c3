"""remat_auto: train.remat='auto''s choice of policy, its compiles and its record in the workdir."""

import json
import types

import jax
import numpy as np
import pytest

from electra_jax.config import pretrain_keys, schema
from electra_jax.model import networks, sharding
from electra_jax.pretraining import dry_run, fit, program, remat_auto, runner, topology
from electra_jax.pretraining.optimizer_step import DEFAULT_SPECIAL
from electra_jax.store import filenames
from tests.conftest import micro_config
from tests.pretraining.test_topology import libtpu_env, needs_libtpu  # noqa: F401  (a fixture)

GIB = 2**30


def _fake(needs: dict):
    """A measure over made-up figures ({policy: GiB; or ('refused', GiB or None) where the
    compiler refuses it, saying how much it needs or not}), and the policies it was asked for,
    in order."""
    asked = []

    def measure(policy):
        asked.append(policy)
        need = needs[policy]
        if isinstance(need, tuple):
            return (None if need[1] is None else int(need[1] * GIB)), None
        return int(need * GIB), f"compiled {policy}"

    return measure, asked


def test_the_order_is_every_policy_that_auto_may_take_fastest_first():
    assert remat_auto.ORDER[0] == "none" and remat_auto.ORDER[-1] == "full"
    assert set(remat_auto.ORDER) <= set(networks.REMAT_CHOICES)
    # Every choice of the schema's rule is a policy of the model's, and 'auto'.
    rule = schema.by_name(pretrain_keys.KEYS)["train.remat"].rule
    assert set(rule) == {*networks.REMAT_CHOICES, remat_auto.AUTO}


def test_the_first_policy_that_fits_is_taken_and_none_after_it_is_compiled():
    needs = {
        "none": ("refused", 36.7),
        "save_matmuls": ("refused", None),
        "save_projections": 27.1,
        "save_qkv_ffn": 25.0,
    }
    measure, asked = _fake({**needs, "full": 12.0})
    choice = remat_auto.choose(measure, 32 * GIB, "64 x TPU v4", hint="a smaller batch")
    assert choice.policy == "save_projections" and choice.compiled == "compiled save_projections"
    assert asked == ["none", "save_matmuls", "save_projections"]
    assert [t.fits for t in choice.trials] == [False, False, True]
    line = choice.line
    assert "\n" not in line and line.startswith("train.remat=auto: 'save_projections' for 64 x TPU")
    assert line.endswith(
        "(32.00 GiB each): 'none' 36.70 GiB of temporaries alone (XLA: RESOURCE_EXHAUSTED), "
        "'save_matmuls' more than the compiler can place (XLA: RESOURCE_EXHAUSTED) do not fit; "
        "'save_projections' 27.10 GiB fits"
    )
    assert choice.trials[0].refused and choice.trials[0].compiled is None
    # 'none' first when it fits: nothing else compiled.
    measure, asked = _fake({"none": 3.0})
    assert remat_auto.choose(measure, 32 * GIB, "8 x TPU v4", "").policy == "none"
    assert asked == ["none"]


def test_nothing_fitting_is_one_line_naming_what_else_to_change():
    config = micro_config()
    config.train.remat = "auto"
    mesh = sharding.make_mesh(config.mesh)
    hint = fit.fix_hint(config, mesh)
    assert "train.batch_size" in hint and "train.remat" not in hint  # auto tried every policy
    measure, asked = _fake(dict.fromkeys(remat_auto.ORDER, 40.0))
    with pytest.raises(remat_auto.NothingFits) as e:
        remat_auto.choose(measure, 32 * GIB, "64 x TPU v4", hint)
    line = str(e.value)
    assert asked == list(remat_auto.ORDER) and "\n" not in line
    assert line.startswith("train.remat=auto: no policy fits 64 x TPU v4 (32.00 GiB each)")
    assert "'full' 40.00 GiB" in line and line.endswith(hint)
    assert isinstance(e.value, schema.ConfigError)  # the commands' one line and exit 2


def test_without_a_known_limit_it_is_none_and_nothing_is_compiled(monkeypatch):
    config = micro_config()
    config.train.remat = "auto"
    mesh = sharding.make_mesh(config.mesh)
    monkeypatch.setattr(fit, "compile_need", None)  # a compile would fail
    choice = program.resolve_remat(config, config.data.vocab_size, mesh)
    assert choice.policy == "none" and choice.trials == () and choice.compiled is None
    assert "no memory limit is known for cpu devices, so nothing was compiled" in choice.line


@pytest.mark.slow  # two compiles by the TPU compiler
@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_a_real_choice_for_a_compile_only_tpu_slice_and_the_dry_run_reports_it(monkeypatch):
    """The micro config at 8 rows of 256 tokens a device (its activations then outweigh its
    state: 10.7 MB without remat, 9.7 MB with 'full', by libtpu 0.0.42.1; at 4 rows of 256 the
    TPU compiler's plan is smaller without remat, 2.1 MB against 9.6; at 16 rows of 256 each
    compile took half as long again), compiled for a v5e:2x2 slice that is not here: 'none'
    fits a chip's 16 GiB. With the budget lowered below what 'none' needs, the dry run
    compiles the next candidate, takes it, and reports it and its program; 'none' is not
    compiled again (its program is the setup's)."""
    config = micro_config()
    config.train.remat, config.train.steps_per_call = "auto", 1
    config.train.batch_size, config.data.seq_length = 32, 256
    target = topology.resolve("v5e:2x2")
    devices = topology.compile_only_devices(target)
    # The dry run's mesh over the very devices of this one (each description makes new ones).
    monkeypatch.setattr(topology, "compile_only_devices", lambda target: devices)
    mesh = program.checked_mesh(config, process_count=1, devices=devices)
    vocab, uniform = config.data.vocab_size, dry_run._uniform(config.data.vocab_size)
    with dry_run._without_persistent_cache():
        first = program.resolve_remat(config, vocab, mesh, unigram_cdf=uniform)
    assert first.policy == "none" and len(first.trials) == 1, first.line
    assert "for 4 x TPU v5 lite (16.00 GiB each): 'none' " in first.line
    need = first.trials[0].need_bytes
    # Two candidates keep it to one more compile; 'full' keeps the least.
    monkeypatch.setattr(remat_auto, "ORDER", ("none", "full"))
    monkeypatch.setattr(remat_auto, "device_memory", lambda devices: (need - 1, "4 x lowered"))
    summary = dry_run.describe(config, target=target, costs=False)
    assert summary["remat"] == "full", summary["remat_auto"]
    line = summary["remat_auto"]
    assert line.startswith("train.remat=auto: 'full' for 4 x lowered (") and "(1 compile," in line
    assert summary["memory_per_device_bytes"] < need - 1 and summary["fits"]
    chosen = program.setup_step(
        remat_auto.with_policy(config, "full"), vocab, mesh, unigram_cdf=uniform
    )
    # The program reported is the one compiled to choose, held by the chosen policy's setup.
    reported = fit.memory(chosen.compiled["step"])["memory_per_device_bytes"]
    assert chosen.spec.remat == "full" and reported == summary["memory_per_device_bytes"]


def _record(workdir) -> dict:
    return json.loads((workdir / filenames.REMAT_RECORD).read_text())


def test_the_record_is_reused_on_the_same_devices_and_the_choice_made_again_on_others(
    tmp_path, monkeypatch
):
    config = micro_config()
    config.train.remat = "auto"
    mesh = sharding.make_mesh(config.mesh)
    lines = []

    def for_run(resolve=lambda: program.resolve_remat(config, config.data.vocab_size, mesh)):
        lines.clear()
        return remat_auto.for_run(str(tmp_path), config, mesh, resolve, lines.append, True)

    assert for_run().policy == "none"  # a CPU: no limit known, nothing compiled
    record = _record(tmp_path)
    devices = {"kind": jax.devices()[0].device_kind, "count": 1, "memory_per_device_bytes": None}
    assert record["made_for"]["devices"] == devices and record["policy"] == "none"
    assert record["made_for"]["settings"]["train.batch_size"] == config.train.batch_size

    # The same devices and settings: the recorded policy, and no candidate compiled.
    record["policy"] = "save_projections"
    (tmp_path / filenames.REMAT_RECORD).write_text(json.dumps(record))
    assert for_run(resolve=None).policy == "save_projections"  # choosing again would fail
    assert len(lines) == 1 and "'save_projections', as chosen for these devices" in lines[0]

    # Other devices: chosen again, with one line saying what changed, and recorded.
    record["made_for"]["devices"] = {"kind": "TPU v4", "count": 64, "memory_per_device_bytes": GIB}
    (tmp_path / filenames.REMAT_RECORD).write_text(json.dumps(record))
    assert for_run().policy == "none"
    assert lines[0] == (
        "train.remat=auto: choosing again: devices 64 x TPU v4 of 1.00 GiB then, "
        f"1 x {devices['kind']} now (since {tmp_path / filenames.REMAT_RECORD})"
    )
    assert _record(tmp_path)["made_for"]["devices"] == devices

    # Another batch on the same devices: chosen again too.
    config.train.batch_size = 16
    for_run()
    assert "train.batch_size=8 then, 16 now" in lines[0]

    # A damaged record: named in one line, the choice made again and recorded whole.
    (tmp_path / filenames.REMAT_RECORD).write_text('{"policy": "no')
    assert for_run().policy == "none"
    assert lines[0].startswith(f"warning: {tmp_path / filenames.REMAT_RECORD} cannot be read")
    assert _record(tmp_path)["policy"] == "none"


def test_the_run_calls_the_program_compiled_to_choose_and_records_the_choice(tmp_path, monkeypatch):
    """With a memory limit known (a stand-in for a GPU's), the run's setup for 'auto' is the
    chosen policy's, holding the program compiled from abstract shapes to choose it, which takes
    the run's real state and batches; the choice is recorded with its trials. (Two steps per
    call: the program of test_runner's whole calls of 2, from the compilation cache.)"""
    config = micro_config()
    config.train.remat, config.train.steps_per_call = "auto", 2
    mesh = sharding.make_mesh(config.mesh)
    monkeypatch.setattr(remat_auto, "device_memory", lambda devices: (2**40, "1 x cpu (1 TiB)"))
    run = types.SimpleNamespace(config=config, workdir=str(tmp_path))
    setup, seconds = runner._setup(run, config.data.vocab_size, mesh, DEFAULT_SPECIAL, None)
    assert setup.spec.remat == "none" and seconds > 0
    compiled = setup.compiled["multi_step"]  # train.steps_per_call > 1: the whole call's
    record = _record(tmp_path)
    assert record["policy"] == "none" and record["line"].startswith("train.remat=auto: 'none'")
    assert [t["policy"] for t in record["trials"]] == ["none"] and record["trials"][0]["fits"]
    state = program.init_on_mesh(setup)
    rows = np.zeros((config.train.steps_per_call, config.train.batch_size, 32), np.int32)
    batch = sharding.global_batches(
        [{"input_ids": r + 5, "segment_ids": r, "input_mask": r + 1} for r in rows], mesh
    )
    state, step_metrics = compiled(state, batch)
    assert int(state.step) == config.train.steps_per_call
    assert np.all(np.isfinite(jax.device_get(step_metrics["loss"])))
