"""The command line: dry run, and bad input as one line with exit code 2."""

import json
import sys

import pytest

from tests import command_server
from tests.conftest import ROOT, heavy_imports_at_exit, subprocess_env


def _run(*args, timeout=120):
    return command_server.run(
        [sys.executable, "-m", "electra_jax.train", *args],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=timeout,
    )


def test_dry_run_prints_one_json_line():
    out = _run("--config=configs/small.py", "--dry_run", "--nocompile")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(summary["discriminator_params"] - 13.5e6) / 13.5e6 < 0.03
    assert summary["generator_hidden_size"] == 64 and summary["batch_size"] == 128


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["--config.model.hidden_sz=3"],
            "unknown config key model.hidden_sz (did you mean model.hidden_size?)",
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


def _one_line_exit_2(out, expected):
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            # No held-out evaluation: its batch of 12 would not divide tiny.py's 256 rows.
            ["--config.train.batch_size=12", "--config.eval.every_steps=0"],
            "train.batch_size=12 is not divisible by the 8 data-parallel devices",
        ),
        (["--config.mesh.fsdp=3"], "mesh.fsdp=3 does not divide 8 devices"),
    ],
)
def test_batch_and_mesh_that_do_not_fit_8_devices(tmp_path, args, expected):
    out = command_server.run(
        [sys.executable, "-m", "electra_jax.train", "--config=configs/tiny.py"]
        + [f"--workdir={tmp_path / 'w'}", *args],
        cwd=ROOT,
        env=subprocess_env(devices=8),
        timeout=120,
    )
    _one_line_exit_2(out, expected)


def test_tokenizer_with_another_vocabulary(tmp_path, tmp_path_factory):
    from tests.pretraining.test_runner import prepare_shared_data

    tokenizer, _ = prepare_shared_data(tmp_path_factory)  # 300 pieces; tiny.py asks for 4096
    out = _run(
        "--config=configs/tiny.py", f"--workdir={tmp_path}", f"--config.data.tokenizer={tokenizer}"
    )
    line = _one_line_exit_2(out, "has 300 pieces but data.vocab_size=4096")
    assert "set data.vocab_size=300" in line


def test_workdir_of_another_model_fails_before_restoring(tmp_path):
    from tests.conftest import micro_config

    (tmp_path / "config.json").write_text(json.dumps(micro_config().to_dict()))
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)  # would be restored
    out = _run("--config=configs/tiny.py", f"--workdir={tmp_path}")
    line = _one_line_exit_2(out, f"{tmp_path}/config.json describes a different model")
    assert "data.seq_length=32 there vs 128 now" in line and "model.hidden_size" in line
    assert "new --workdir" in line
    # Refused before the claim (resume.plan without it): nothing written, no marker, no lock.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "config.json"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["3"]


@pytest.mark.slow
def test_dry_run_compiles_large_width_with_fsdp_on_eight_devices():
    """Ahead-of-time compile on 8 simulated devices: FSDP leaves 1/8 of the state per device.

    The large config's widths and batch (2048 x 512, 64 micro-batches) at 2 of its 24 layers,
    which compiles in seconds; benchmarks/RESULTS.md has the full model's figures.
    """
    out = command_server.run(
        [
            sys.executable,
            "-m",
            "electra_jax.train",
            "--config=configs/large.py",
            "--dry_run",
            "--config.model.num_layers=2",
            "--config.mesh.fsdp=8",
            "--config.train.grad_accum_steps=64",
        ],
        cwd=ROOT,
        env=subprocess_env(devices=8),
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["devices"] == 8 and s["mesh"] == {"data": 1, "fsdp": 8}
    # Parameters and both Adam moments, float32, split 8 ways (vectors stay whole: < 1%).
    expected = 3 * 4 * s["total_params"] / 8
    assert expected <= s["memory_state_bytes"] < 1.02 * expected + 2 * 2048 * 512 * 4
    assert s["memory_per_device_bytes"] > s["memory_state_bytes"] + s["memory_temp_bytes"] * 0.9
    assert s["xla_flops_per_step"] is None  # not counted under accumulation


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--coordinator_address=garbage"], "--coordinator_address=garbage is not host:port"),
        (["--coordinator_address=host:99999"], "is not host:port"),
        (["--coordinator_address=127.0.0.1:1234"], "needs --num_processes and --process_id"),
        (["--num_processes=0", "--process_id=0"], "--num_processes=0 must be >= 1"),
        (["--num_processes=2", "--process_id=2"], "--process_id=2 must be in [0, --num_processes"),
        (["--peer_timeout_seconds=0"], "--peer_timeout_seconds=0 must be >= 1"),
        (["--num_processes=2", "--process_id=1"], "need --coordinator_address (or none"),
    ],
)
def test_multihost_flags_that_cannot_work_are_one_line(tmp_path, args, expected):
    out = _run("--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}", *args)
    _one_line_exit_2(out, expected)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("x = 1\n", "has no get_config() function"),
        ("def get_config():\n    return 5\n", "get_config() returned int, not an ml_collections"),
        ("def get_config(:\n", "is not valid Python (invalid syntax, line 1)"),
    ],
)
def test_config_files_that_give_no_config_are_one_line(tmp_path, text, expected):
    path = tmp_path / "my_config.py"
    path.write_text(text)
    for extra in ([], ["--config.train.num_steps=3"]):  # an override must not take the blame
        out = _run(f"--config={path}", f"--workdir={tmp_path / 'w'}", *extra)
        line = _one_line_exit_2(out, expected)
        assert str(path) in line


def test_a_folder_that_is_not_a_workdir_is_refused_untouched(tmp_path):
    hf = tmp_path / "hf_model"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "electra"}')
    out = _run("--config=configs/tiny.py", f"--workdir={hf}")
    _one_line_exit_2(out, "is a Hugging Face model folder")
    assert sorted(p.name for p in hf.iterdir()) == ["config.json"]
    assert (hf / "config.json").read_text() == '{"model_type": "electra"}'


@pytest.mark.parametrize("what", ["a file", "a Hugging Face model folder"])
def test_a_workdir_the_run_cannot_take_is_refused_before_jax_is_imported(tmp_path, what):
    target = tmp_path / "target"
    if what == "a file":
        target.write_text("notes")
    else:
        target.mkdir()
        (target / "config.json").write_text('{"model_type": "electra"}')
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.train", "--config=configs/tiny.py", f"--workdir={target}"
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    assert stderr.strip().startswith(f"error: --workdir {target} is "), stderr


def test_a_key_allowed_to_change_twice_is_refused_before_jax_is_imported(tmp_path):
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.train",
        "--config=configs/tiny.py",
        f"--workdir={tmp_path / 'run'}",
        "--allow_change=data.source, train.learning_rate,data.source",
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    assert stderr == "error: --allow_change names 'data.source' twice; name each once\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "case,args,expected",
    [
        ("another optimizer", ["--config.train.adam_eps=0.001"], "resuming with other settings"),
        ("fewer steps", ["--config.train.num_steps=2"], "is below step 3"),
        ("only damaged checkpoints", [], "holds only checkpoints set aside as damaged"),
        ("an export at checkpoints/99", [], "orbax would take it for checkpoint 99"),
    ],
)
def test_a_resume_the_run_would_refuse_is_refused_before_jax_is_imported(
    tmp_path, case, args, expected
):
    from tests.conftest import micro_config

    config_file = tmp_path / "config.py"
    config_file.write_text("from tests.micro import micro_config as get_config\n")
    workdir = tmp_path / "w"
    checkpoints = workdir / "checkpoints"
    (checkpoints / ("3.corrupt" if case == "only damaged checkpoints" else "3") / "state").mkdir(
        parents=True
    )
    (workdir / "config.json").write_text(json.dumps(micro_config().to_dict()))
    if case == "an export at checkpoints/99":
        (checkpoints / "99").mkdir()
        (checkpoints / "99" / "model.safetensors").write_bytes(b"")
    before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.train", f"--config={config_file}", f"--workdir={workdir}", *args
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], stderr
    assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before
