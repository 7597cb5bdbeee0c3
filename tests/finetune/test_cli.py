"""python -m electra_jax.finetune: bad input is one line on stderr and exit code 2; a diverged
run is one line and exit code 1, with no results written."""

import sys

import pytest

from tests import command_server
from tests.conftest import ROOT, heavy_imports_at_exit, subprocess_env
from tests.finetune.test_loop import _sst2

TINY = [
    "--config.vocab_size=40",
    "--config.seq_length=16",
    "--config.batch_size=16",
    "--config.model.hidden_size=32",
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.embedding_size=32",
]


def _finetune(workdir, *flags):
    return command_server.run(
        [
            sys.executable,
            "-m",
            "electra_jax.finetune",
            "--config=configs/glue.py",
            *flags,
            f"--workdir={workdir}",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=180,
    )


def _one_error_line(out) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    "settings, says",
    [
        (["--config=configs/glue.py", "--config.task=SST-3"], "config.task='SST-3' is not a GLUE"),
        (["--config=configs/glue.py", "--config.family=ner"], "config.family='ner' is not a"),
        (
            ["--config=configs/glue.py", "--config.family=squad"],
            "config.family='squad' needs the keys version, doc_stride",
        ),
        (["--config=configs/squad.py", "--config.family=glue"], "needs the key task, which"),
        (
            ["--config=configs/glue.py", "--allow_change=seed"],
            "--allow_change=seed: a fine-tuning's resume may change only data_dir",
        ),
        (["--config=configs/glue.py", "--config.batch_size=0"], "config.batch_size=0 must be"),
        (["--config=configs/squad.py", "--config.version=3"], "config.version='3' is not a"),
        (["--config=configs/squad.py", "--config.n_best_size=999"], "n_best_size=999 exceeds"),
        (["--config=configs/glue.py", "--config.task=SST-2"], "--workdir {w} is a pre-training"),
    ],
)
def test_bad_settings_and_a_workdir_it_cannot_take_are_refused_before_jax(tmp_path, settings, says):
    """The settings (checks.check_config) and the workdir's claim are answered before jax,
    flax and orbax are imported: in a blink, one line, exit code 2, nothing written."""
    from electra_jax.run import workdir as workdir_lib

    workdir = tmp_path / "w"
    with workdir_lib.claimed(str(workdir), workdir_lib.PRETRAIN, command="electra_jax.train"):
        pass  # a pre-training workdir: its marker
    before = sorted(p.name for p in workdir.iterdir())
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.finetune", *settings, f"--config.data_dir={tmp_path}", f"--workdir={workdir}"
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert says.format(w=workdir) in stderr, stderr
    assert sorted(p.name for p in workdir.iterdir()) == before


def test_malformed_row_is_one_line_and_exit_2_before_jax(tmp_path):
    """A new run's task files are read before jax, flax and orbax are imported (reading.py)."""
    data = tmp_path / "CoLA"
    data.mkdir()
    (data / "train.tsv").write_text("gj04\t1\t\tFine.\ngj04\t1\tNo label column.\n")
    (data / "dev.tsv").write_text("gj04\t1\t\tFine.\n")
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.finetune",
        "--config=configs/glue.py",
        "--config.task=CoLA",
        f"--config.data_dir={data}",
        f"--workdir={tmp_path / 'w'}",
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert lines[0].startswith("error: ") and "train.tsv line 2: 3 tab-separated fields" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "flag,expected",
    [
        ("--config.num_epochs=inf", "config.num_epochs=inf must be a finite number"),
        ("--config.learning_rate=nan", "config.learning_rate=nan must be a finite number"),
    ],
)
def test_a_non_finite_setting_is_one_line_and_exit_2(tmp_path, flag, expected):
    out = _finetune(tmp_path / "w", f"--config.data_dir={tmp_path}", flag)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), out.stderr[-2000:]


def test_a_diverged_run_is_one_line_exit_1_and_writes_no_results(tmp_path):
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    workdir = tmp_path / "w"
    out = _finetune(
        workdir,
        f"--config.data_dir={data}",
        "--config.num_epochs=1",
        "--config.learning_rate=1e10",
        "--config.log_every_steps=1",
        *TINY,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    # Progress lines, then the one error line.
    line = _one_error_line(out)
    assert "fine-tuning diverged" in line and "lower config.learning_rate" in line, line
    assert not (workdir / "eval_results.json").exists()
    assert not (workdir / "dev_predictions.jsonl").exists()


def _run(workdir, config, *flags):
    return command_server.run(
        [sys.executable, "-m", "electra_jax.finetune", f"--config={config}", *flags]
        + [f"--workdir={workdir}"],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=180,
    )


def _files(workdir) -> dict:
    """Every file's bytes but the lock's (each run that holds the workdir names itself there)."""
    return {
        p: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished SST-2 and a finished SQuAD 1.1 fine-tuning, and the flags of each."""
    from tests.finetune.test_squad_data import write_squad
    from tests.finetune.test_squad_loop import _flags

    root = tmp_path_factory.mktemp("finished")
    glue = ["configs/glue.py", f"--config.data_dir={_sst2(root / 'SST-2', 16, 8)}", *TINY]
    glue.append("--config.num_epochs=1")
    squad = [
        "configs/squad.py",
        *_flags(version="1.1", data_dir=write_squad(root / "q", "1.1", 12, 3)),
    ]
    runs = {}
    for name, (config, *flags) in {"glue": glue, "squad": squad}.items():
        out = _run(root / name, config, *flags)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = (root / name, [config, *flags])
    return runs


@pytest.mark.parametrize("without_config", [False, True], ids=["config.json", "no config.json"])
@pytest.mark.parametrize(
    "into,other",
    [("glue", "squad"), ("squad", "glue"), ("glue", "glue:CoLA")],
    ids=["squad into glue", "glue into squad", "CoLA into SST-2"],
)
def test_a_finished_fine_tuning_is_never_replaced_by_another_task(
    finished, tmp_path, into, other, without_config
):
    # A fine-tuning workdir belongs to one task and one run: another family or task is refused
    # before any work, also when the workdir's config.json is gone, and nothing there changes.
    import shutil

    workdir = tmp_path / "w"
    shutil.copytree(finished[into][0], workdir)
    if without_config:
        (workdir / "config.json").unlink()
    before = _files(workdir)
    family, _, task = other.partition(":")
    argv = finished[family][1] + ([f"--config.task={task}"] if task else [])
    out = _run(workdir, *argv)
    assert out.returncode == 2, out.stderr[-3000:]
    line = _one_error_line(out)
    assert ("holds" in line and "choose a new --workdir" in line) or "put config.json back" in line
    assert _files(workdir) == before
