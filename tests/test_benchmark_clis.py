"""benchmarks/_cli.py and the benchmarks' command lines: bad input (a missing workdir or file, a
bogus task, preset or setting, a number out of range) is one `error:` line naming the flag, exit
code 2, no traceback, before any work. Each case stops before a model is built: seconds each."""

import argparse
import json
import sys

import pytest

from tests import command_server
from tests.conftest import ROOT, subprocess_env


def _run(*argv):
    out = command_server.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=300,  # a guard against a hang: each case ends within seconds
    )
    return out.returncode, out.stderr


def _study(name):
    """The module of the study `name` (benchmarks/studies/NAME/NAME.py), for `python -m`."""
    return f"benchmarks.studies.{name}.{name}"


def _glue_workdir(tmp_path, steps=(), record=None, tasks=(), at=""):
    """A folder with a pre-training record (config.json, or `record`) and a folder per step in
    `steps` under checkpoints/, and a GLUE root with a train.tsv and dev.tsv of each of `tasks`
    (else empty); the command line names the folder with `at` after it (a step: '@7')."""
    workdir, data = tmp_path / "pretrained", tmp_path / "glue"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(record or {"model": {}}))
    for step in steps:
        (workdir / "checkpoints" / str(step)).mkdir(parents=True)
    data.mkdir()
    for task in tasks:
        (data / task).mkdir()
        for name in ("train.tsv", "dev.tsv"):
            (data / task / name).write_text("index\tsentence1\tsentence2\tlabel\n")
    return ["benchmarks/glue.py", f"--workdir={workdir}{at}", f"--data_dir={data}", "--out=x"]


# (case, argv from tmp_path, what the one line says)
CASES = [
    (
        "glue, missing workdir",
        lambda t: ["benchmarks/glue.py", f"--workdir={t}/nope", f"--data_dir={t}", "--out=x"],
        "--workdir {t}/nope does not exist",
    ),
    (
        "glue, a folder without a run's record",
        lambda t: ["benchmarks/glue.py", f"--workdir={t}", f"--data_dir={t}", "--out=x"],
        "--workdir {t} has no config.json",
    ),
    (
        "glue, a step the workdir did not save",
        lambda t: _glue_workdir(t, steps=(3, 12), at="@7"),
        "--workdir {t}/pretrained@7: {t}/pretrained/checkpoints has no checkpoint of step 7; "
        "it has 3, 12",
    ),
    (
        "glue, bogus task",
        lambda t: [*_glue_workdir(t), "--tasks=SST-2,bogus"],
        "'bogus' is not a GLUE task",
    ),
    (
        "glue, a task named twice in two spellings",
        lambda t: [*_glue_workdir(t), "--tasks=SST-2,RTE,sst2"],
        "--tasks names SST-2 (as 'SST-2' and 'sst2') twice; name each once",
    ),
    (
        "glue, a --set key given twice",
        lambda t: [*_glue_workdir(t), "--set=learning_rate=1e-4", "--set", "learning_rate=2e-4"],
        "--set names learning_rate (as 'learning_rate=1e-4' and 'learning_rate=2e-4') twice",
    ),
    (
        "glue, another program's config.json",
        _glue_workdir,
        "config.json is not a pre-training run's record (no model.",
    ),
    (
        "glue, bogus init",
        lambda t: [*_glue_workdir(t), "--inits=pretrained,warm"],
        "--inits 'pretrained,warm': unknown inits warm",
    ),
    (
        "glue, an unknown --set key",
        lambda t: [*_glue_workdir(t), "--set=no_such_key=1"],
        "'no_such_key=1': give KEY=VALUE, KEY a key of configs/glue.py",
    ),
    (
        "glue, a --set value of another type",
        lambda t: [*_glue_workdir(t), "--set=learning_rate=fast"],
        "learning_rate takes float values",
    ),
    (
        "probe, a regression task",
        lambda t: ["benchmarks/probe.py", f"--init_from={t}", f"--data_dir={t}", "--task=stsb"],
        "STS-B is a regression task",
    ),
    (
        "probe, no tokens",
        lambda t: ["benchmarks/probe.py", f"--init_from={t}", f"--data_dir={t}", "--max_length=0"],
        "argument --max_length",
    ),
    (
        "probe, not a model",
        lambda t: ["benchmarks/probe.py", f"--init_from={t}/nope", f"--data_dir={t}"],
        "--init_from {t}/nope",
    ),
    (
        "sample_efficiency, bogus preset",
        lambda t: ["-m", _study("sample_efficiency"), "--preset=huge", f"--out={t}/o"],
        "argument --preset: invalid choice: 'huge'",
    ),
    (
        "sample_efficiency, bogus objective",
        lambda t: ["-m", _study("sample_efficiency"), "--objectives=electra,bert", f"--out={t}"],
        "--objectives 'electra,bert': unknown objectives bert",
    ),
    (
        "sample_efficiency, a corpus that matches nothing",
        lambda t: ["-m", _study("sample_efficiency"), f"--corpus={t}/*.txt", f"--out={t}/o"],
        "--corpus {t}/*.txt matches no file",
    ),
    (
        "sample_efficiency, no corpus given: no default points at one machine's folders",
        lambda t: ["-m", _study("sample_efficiency"), f"--glue_dir={t}", f"--out={t}/o"],
        "--corpus is missing; give the pre-training text",
    ),
    (
        "recipe_study, the sweep's base without GLUE's folder",
        lambda t: [
            "-m",
            _study("recipe_study"),
            "--base=sweep",
            "--corpus=configs/*.py",
            f"--out={t}/o",
        ],
        "--glue_dir is missing; give GLUE's folder",
    ),
    (
        "generator_size, bogus task",
        lambda t: ["-m", _study("generator_size"), "--tasks=MNLI-mm", f"--out={t}/o"],
        "'MNLI-mm' is not a GLUE task",
    ),
    (
        "compute_sweep, a report of nothing",
        lambda t: ["-m", _study("compute_sweep"), "--report_only", f"--out={t}"],
        "holds no sweep yet",
    ),
    (
        "compute_sweep, no seed",
        lambda t: ["-m", _study("compute_sweep"), "--seeds=0", f"--out={t}/o"],
        "argument --seeds",
    ),
    (
        "compute_sweep, a model not in the preset",
        lambda t: ["-m", _study("compute_sweep"), "--objectives=bert", f"--out={t}/o"],
        "unknown models of the preset bert",
    ),
    (
        "recipe_study, bogus setting",
        lambda t: ["-m", _study("recipe_study"), "--settings=default,fast", f"--out={t}/o"],
        "unknown settings fast",
    ),
    (
        "recipe_study, seeds not numbers",
        lambda t: ["-m", _study("recipe_study"), "--seeds=0,one", f"--out={t}/o"],
        "argument --seeds",
    ),
    (
        "learning_curves, missing workdir",
        lambda t: ["-m", _study("learning_curves"), f"{t}/nope", f"--out={t}/c.png"],
        "WORKDIR {t}/nope does not exist",
    ),
    (
        "train_step, missing config",
        lambda t: ["benchmarks/train_step.py", f"--config={t}/nope.py"],
        "--config {t}/nope.py does not exist",
    ),
    (
        "train_step, batch 0",
        lambda t: ["benchmarks/train_step.py", "--batch=0"],
        "argument --batch: 0 is out of range",
    ),
    (
        "train_step, a flag given twice",
        lambda t: ["benchmarks/train_step.py", "--batch=2", "--batch", "4"],
        "--batch is given twice (as --batch=2 and --batch)",
    ),
    (
        "train_step, an unknown --set key",
        lambda t: ["benchmarks/train_step.py", "--set=model.no_such=1"],
        "model.no_such is not a config key",
    ),
    (
        "train_step, a --set value of another type",
        lambda t: ["benchmarks/train_step.py", "--set=train.batch_size=big"],
        "train.batch_size takes int values",
    ),
    (
        "attention_parity, a vocabulary of special tokens only",
        lambda t: ["benchmarks/attention_parity.py", "--vocab=3"],
        "argument --vocab",
    ),
    (
        "checkpoint_overhead, no saves",
        lambda t: ["benchmarks/checkpoint_overhead.py", "--saves=0"],
        "argument --saves",
    ),
    (
        "input_pipeline, bogus source",
        lambda t: ["benchmarks/input_pipeline.py", "--source=ftp://corpus"],
        "data.source 'ftp://corpus' is not a known source",
    ),
    (
        "prepare_throughput, a corpus that matches nothing",
        lambda t: ["benchmarks/prepare_throughput.py", f"--source=text:{t}/*.txt"],
        "--source text:{t}/*.txt",
    ),
    (
        "learning_curves, a workdir with nothing logged yet",
        lambda t: ["-m", _study("learning_curves"), str(t), f"--out={t}/c.png"],
        "{t}/c.png: nothing to plot",
    ),
    (
        "train_step, a fine-tuning config",
        lambda t: ["benchmarks/train_step.py", "--config=configs/glue.py"],
        "config file configs/glue.py is a fine-tuning config (family 'glue')",
    ),
    (
        "glue, a fine-tuning workdir given as the pre-training one",
        lambda t: [*_glue_workdir(t, record={"family": "glue", "model": {}})],
        "--workdir {t}/pretrained is a fine-tuning workdir (family 'glue')",
    ),
    (
        "glue, a step written in other digits",
        lambda t: _glue_workdir(t, at="@²"),
        "--workdir {t}/pretrained@² does not exist",
    ),
    (
        "glue, a task's files missing (the last task's, found before the first runs)",
        lambda t: [*_glue_workdir(t, tasks=("RTE",)), "--tasks=RTE,MRPC", "--inits=pretrained"],
        "--data_dir: {t}/glue/train.tsv does not exist; config.data_dir must hold MRPC's",
    ),
    (
        "glue, a --set value no run can take",
        lambda t: [*_glue_workdir(t, tasks=("RTE",)), "--tasks=RTE", "--set=learning_rate=nan"],
        "--set: config.learning_rate=nan must be a finite number",
    ),
    (
        "gpu_data, bogus task",
        lambda t: ["benchmarks/gpu_data.py", "--tasks=SST-2,XNLI", f"--out={t}/o"],
        "'XNLI' is not a GLUE task",
    ),
    (
        "gpu_quality, no parallel runs",
        lambda t: ["benchmarks/gpu_quality.py", "--parallel=0", f"--out={t}/o"],
        "argument --parallel",
    ),
    (
        "compile_table, an unknown row",
        lambda t: ["benchmarks/compile_table.py", "--only=large@v9-8", f"--out={t}/table"],
        "unknown rows large@v9-8",
    ),
    (
        "hlo_costs, a slice that is not one",
        lambda t: ["benchmarks/hlo_costs.py", "--topology=v9-8"],
        "--topology: --topology=v9-8 is not a TPU slice name",
    ),
]


@pytest.mark.parametrize("name,argv,says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, name, argv, says):
    code, err = _run(*argv(tmp_path))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: ") and "Traceback" not in err, err[-3000:]
    assert says.format(t=tmp_path) in lines[0], lines[0]


def test_verbose_keeps_the_traceback_of_a_config_that_fails(tmp_path):
    config = tmp_path / "boom.py"
    config.write_text("def get_config():\n    raise ValueError('boom')\n")
    code, err = _run("benchmarks/train_step.py", f"--config={config}")
    assert code == 2 and err.strip() == f"error: --config {config}: boom", err[-3000:]
    code, err = _run("benchmarks/train_step.py", f"--config={config}", "--verbose")
    assert code != 0 and "Traceback" in err and "ValueError: boom" in err, err[-3000:]


def test_glue_fine_tunes_a_chosen_step_and_its_random_twin_uses_the_workdirs_tokenizer(tmp_path):
    """--workdir=WORKDIR@STEP: the pre-trained runs start from that checkpoint, the random-init
    runs take WORKDIR's tokenizer (not a folder named 'WORKDIR@STEP/tokenizer')."""
    from benchmarks import glue

    args = argparse.Namespace(
        workdir=f"{tmp_path}/pretrained@1153",
        data_dir=str(tmp_path),
        max_train_examples=0,
        num_epochs=0.0,
        seq_length=0,
        log_every_steps=100,
        set=[],
    )
    record = {"model": {key: 1 for key in glue._SHAPE_FIELDS}}
    warm = glue.run_config(args, "SST-2", 0, "pretrained", record)
    cold = glue.run_config(args, "SST-2", 0, "random", record)
    assert warm.init_from == f"{tmp_path}/pretrained@1153"
    assert not cold.init_from and cold.tokenizer == f"{tmp_path}/pretrained/tokenizer"


def test_run_ends_the_packages_bad_input_errors_in_one_line_however_deep(capsys, monkeypatch):
    """_cli.run: a DataError or ConfigError raised deep inside a benchmark's work (a fine-tuning
    resumed with changed settings, a task file that went missing mid-study) is one line, exit 2;
    --verbose keeps the traceback; other errors are not bad input and pass through."""
    from benchmarks import _cli
    from electra_jax.errors import ConfigError, DataError

    def deep(error):
        def main():
            def inner():
                raise error

            inner()

        return main

    from electra_jax.store.workdir_files import WorkdirFileError

    monkeypatch.setattr(sys, "argv", ["benchmarks/glue.py"])
    errors = (DataError("x.tsv is gone"), ConfigError("config.seed changed"))
    for error in (*errors, WorkdirFileError("w/metrics.jsonl line 2 is a JSON list")):
        with pytest.raises(SystemExit) as ended:
            _cli.run(deep(error))
        assert ended.value.code == 2 and capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(KeyError):
        _cli.run(deep(KeyError("a bug")))
    monkeypatch.setattr(sys, "argv", ["benchmarks/glue.py", "--verbose"])
    with pytest.raises(DataError):
        _cli.run(deep(DataError("x.tsv is gone")))
