"""What a fine-tuning workdir keeps: its weights, tokenizer and labels; an exact resume from its
checkpoints; one run per workdir; electra_jax.load() on it predicts and re-evaluates exactly."""

import json
import os
import re
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import electra_jax
from electra_jax.errors import ConfigError, PretrainedError
from electra_jax.finetune import loop, predictor, saved
from tests import command_server, held
from tests.conftest import ROOT, subprocess_env
from tests.finetune import test_squad_loop
from tests.finetune.test_loop import _config, _sst2
from tests.finetune.test_squad_data import write_squad


def _files(root) -> dict:
    """Every file under root (bytes) but the lock, which each claim rewrites with its holder."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name != ".lock":
                with open(path, "rb") as f:
                    found[os.path.relpath(path, root)] = f.read()
    return found


def _without_time(results: dict) -> dict:
    return {k: v for k, v in results.items() if k != "elapsed_sec"}


def _glue(tmp_path, **overrides):
    data = _sst2(tmp_path / "SST-2", n_train=80, n_dev=24)
    # 64 examples x 3 epochs / 16: 12 steps; checkpoints every 4, log lines every 5 (so a resume
    # at 6 starts inside a log window).
    settings = dict(max_train_examples=64, log_every_steps=5, **{"checkpoint.every_steps": 4})
    return _config(data, **{**settings, **overrides})


def _squad(tmp_path):
    data = write_squad(tmp_path / "squad", "2.0", n_train=8, n_dev=2)
    return test_squad_loop._config(
        data, "2.0", num_epochs=2.0, log_every_steps=3, **{"checkpoint.every_steps": 2}
    )


@pytest.mark.parametrize("family", ["glue", "squad"])
def test_a_stopped_run_resumes_bit_for_bit(tmp_path, capfd, family):
    config = _glue(tmp_path) if family == "glue" else _squad(tmp_path)
    straight = loop.finetune(config, str(tmp_path / "straight"))
    steps = straight["steps"]
    assert steps >= 6, steps
    resumed = tmp_path / "resumed"
    stop = steps // 2 + 1  # not on the checkpoint grid, inside a log window
    assert loop.finetune(config, str(resumed), stop_after=stop) == {
        "stopped_at": stop,
        "steps": steps,
        "preempted": False,
    }
    assert str(stop) in os.listdir(resumed / "checkpoints")
    assert not (resumed / saved.WEIGHTS_FILE).exists()
    assert not (resumed / loop.RESULTS_FILE).exists()
    capfd.readouterr()
    again = loop.finetune(config, str(resumed))
    # It continued from the checkpoint (a run started over would give the same numbers too).
    assert f"resumed from checkpoint {stop} of {steps} steps" in capfd.readouterr().err
    assert _without_time(again) == _without_time(straight)
    for name in os.listdir(tmp_path / "straight"):
        if name.startswith("dev_") or name in (saved.WEIGHTS_FILE, saved.MODEL_FILE):
            assert (resumed / name).read_bytes() == (tmp_path / "straight" / name).read_bytes()
    # A finished run rerun returns its results and trains nothing.
    before = _files(resumed)
    assert _without_time(loop.finetune(config, str(resumed))) == _without_time(straight)
    assert _files(resumed) == before


def test_a_checkpoint_renamed_by_hand_is_refused_not_resumed_as_another_step(tmp_path):
    """Checkpoint 4 renamed 8: resumed as step 8, the run would train steps 5 to 8 again and
    die saving step 8 (StepAlreadyExistsError). Its train state's step gives it away; nothing
    is moved."""
    from electra_jax.store import checkpointing

    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    loop.finetune(config, str(workdir), stop_after=4)
    checkpoints = workdir / "checkpoints"
    os.rename(checkpoints / "4", checkpoints / "8")
    before = _files(workdir)
    with pytest.raises(checkpointing.ForeignFolderError) as e:
        loop.finetune(config, str(workdir))
    assert str(e.value).startswith(
        f"{checkpoints}/8 holds the run's state at step 4 (its train state), not step 8"
    )
    assert _files(workdir) == before


def test_the_workdir_keeps_weights_tokenizer_and_labels_and_load_predicts(tmp_path):
    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    results = loop.finetune(config, str(workdir))
    record = json.loads((workdir / saved.MODEL_FILE).read_text())
    assert record["family"] == "glue" and record["task"] == "SST-2"
    assert (
        record["labels"] == ["0", "1"] and record["problem_type"] == "single_label_classification"
    )
    tensors = load_file(str(workdir / saved.WEIGHTS_FILE))
    assert tensors["classifier/kernel"].shape == (32, 2)
    assert any(k.startswith("discriminator/") for k in tensors)
    assert (workdir / "tokenizer" / "spm.model").exists()
    assert json.loads((workdir / "config.json").read_text()) == config.to_dict()

    model = electra_jax.load(str(workdir))
    assert isinstance(model, predictor.TextClassifier) and model.labels == ("0", "1")
    # Re-evaluated from the saved weights: eval_results.json's numbers exactly.
    assert model.evaluate()["metrics"] == results["metrics"]
    rows = [json.loads(x) for x in (workdir / "dev_predictions.jsonl").read_text().splitlines()]
    dev = [r["source"] for r in rows]
    texts = [
        line.split("\t")[0].strip()
        for line in (tmp_path / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    ]
    labels, probabilities = model.predict(texts)
    assert len(dev) == len(texts) and labels == [r["prediction"] for r in rows]
    assert probabilities.shape == (len(texts), 2) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-6)
    assert model.predict("good great fine").labels == model.predict(["good great fine"]).labels
    # Bad arguments are Python's errors naming the argument, never one from deep inside.
    for texts, error, says in [
        ([], ValueError, "texts is empty"),
        (None, TypeError, "texts must be a string or a list"),
        (["fine", ("a", "\udc80")], ValueError, "texts[1][1] holds a lone surrogate"),
        (["fine", 3], TypeError, "texts[1] must be a string or an (a, b) pair of strings, got int"),
    ]:
        with pytest.raises(error, match=re.escape(says)):
            model.predict(texts)

    with pytest.raises(PretrainedError, match=re.escape(f"{workdir} is a fine-tuning workdir")):
        electra_jax.load(f"{workdir}@1")  # not "restore its config.json"
    # A classifier that holds NaN (a diverged run, a damaged file) is refused where it is read.
    tensors["classifier/kernel"][3, 1] = np.nan
    save_file(tensors, str(workdir / saved.WEIGHTS_FILE))
    with pytest.raises(PretrainedError, match=re.escape("tensor classifier/kernel holds 1 non-")):
        electra_jax.load(str(workdir))


def test_stsb_predicts_scores_and_squad_answers(tmp_path):
    from tests.finetune.test_loop import _stsb

    data = _stsb(tmp_path / "STS-B", n_train=16, n_dev=8)
    workdir = tmp_path / "stsb"
    results = loop.finetune(_config(data, task="STS-B", num_epochs=1.0), str(workdir))
    model = electra_jax.load(str(workdir))
    scores = model.predict([("a b", "a b"), ("good dog", "bad cat")])
    assert scores.shape == (2,) and scores.dtype == np.float32
    assert model.evaluate()["metrics"] == results["metrics"]
    rows = [json.loads(x) for x in (workdir / "dev_predictions.jsonl").read_text().splitlines()]
    pairs = [
        tuple(line.split("\t")[7:9]) for line in (data / "dev.tsv").read_text().splitlines()[1:]
    ]
    np.testing.assert_array_equal(model.predict(pairs), [r["prediction"] for r in rows])

    config = _squad(tmp_path)
    squad = tmp_path / "squad-run"
    results = loop.finetune(config, str(squad))
    qa = electra_jax.load(str(squad))
    assert isinstance(qa, predictor.QuestionAnswerer)
    again = qa.evaluate()
    assert {k: again[k] for k in ("exact_match", "f1", "HasAns_f1", "NoAns_f1")} == {
        k: results[k] for k in ("exact_match", "f1", "HasAns_f1", "NoAns_f1")
    }
    context = "Anna lives in Oslo. The cat is old (1895-1943). Boris lives in Rome."
    out = qa.answer("Who lives in Rome?", context)
    assert set(out) == {"answer", "spans", "no_answer_score"}
    assert isinstance(out["no_answer_score"], float) and out["spans"]
    for span in out["spans"]:
        assert context[span["start"] : span["end"]] == span["text"]
    assert [s["score"] for s in out["spans"]] == sorted(
        (s["score"] for s in out["spans"]), reverse=True
    )
    assert out["answer"] in ("", out["spans"][0]["text"])
    with pytest.raises(ValueError, match=re.escape("question holds a lone surrogate")):
        qa.answer("Who\ud800?", context)
    with pytest.raises(TypeError, match="context must be a string, got NoneType"):
        qa.answer("Who?", None)
    with pytest.raises(ValueError, match=re.escape("n_best=0 must be at least 1")):
        qa.answer("Who?", context, n_best=0)


def test_a_workdir_holds_one_run(tmp_path):
    glue = _glue(tmp_path)
    finished = tmp_path / "finished"
    loop.finetune(glue, str(finished))
    unfinished = tmp_path / "unfinished"
    loop.finetune(glue, str(unfinished), stop_after=4)
    squad = _squad(tmp_path)
    rte = _glue(tmp_path, task="RTE")
    cases = [
        (finished, squad, "holds the finished glue fine-tuning of SST-2"),
        (unfinished, squad, "holds the unfinished glue fine-tuning of SST-2"),
        (finished, rte, r"task is 'RTE' now, 'SST-2' there"),
        (unfinished, _glue(tmp_path, seed=3), r"seed is 3 now, 0 there"),
    ]
    for workdir, config, expected in cases:
        before = _files(workdir)
        with pytest.raises(ConfigError, match=expected) as e:
            loop.finetune(config, str(workdir))
        assert "choose a new --workdir" in str(e.value) and "\n" not in str(e.value)
        assert _files(workdir) == before
    # A SQuAD workdir refuses a GLUE run in turn.
    squad_dir = tmp_path / "squad-run"
    loop.finetune(squad, str(squad_dir), stop_after=1)
    with pytest.raises(ConfigError, match="holds the unfinished squad fine-tuning of SQuAD 2.0"):
        loop.finetune(glue, str(squad_dir))
    # A run whose model.json is gone but whose results or checkpoints are there is not started
    # over on top of them (it died in orbax's StepAlreadyExistsError before).
    for workdir in (finished, unfinished):
        (workdir / saved.MODEL_FILE).rename(workdir / "model.json.bak")
        before = _files(workdir)
        with pytest.raises(ConfigError) as e:
            loop.finetune(glue, str(workdir))
        assert str(e.value).startswith(f"--workdir {workdir} holds a fine-tuning run (")
        assert str(e.value).endswith(
            "whose model.json is missing, so what it ran is unknown and it is not replaced: put "
            "model.json back (from a copy), or choose a new --workdir"
        )
        assert _files(workdir) == before
        (workdir / "model.json.bak").rename(workdir / saved.MODEL_FILE)
    # Settings that change no number may change on resume.
    loop.finetune(_glue(tmp_path, log_every_steps=2, **{"checkpoint.keep": 1}), str(unfinished))


def test_changed_labels_on_resume_are_one_line_exit_2_and_nothing_written(tmp_path):
    config = _glue(tmp_path)
    workdir = tmp_path / "w"
    loop.finetune(config, str(workdir), stop_after=4)
    record = json.loads((workdir / saved.MODEL_FILE).read_text())
    record["labels"] = ["negative", "positive"]
    (workdir / saved.MODEL_FILE).write_text(json.dumps(record))
    before = _files(workdir)
    flags = [f"--config.{k}={v}" for k, v in _flat(config.to_dict())]
    out = command_server.run(
        [sys.executable, "-m", "electra_jax.finetune", "--config=configs/glue.py", *flags,
         f"--workdir={workdir}"],
        cwd=ROOT, env=subprocess_env(), timeout=180,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith("error: ") and "labels are ['0', '1'] now" in lines[0]
    assert "['negative', 'positive']" in lines[0]
    assert _files(workdir) == before


def _flat(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_fine_tuning_from_a_pretraining_workdir_leaves_it_untouched(tmp_path, tmp_path_factory):
    from electra_jax.objectives.core import num_mask_slots
    from electra_jax.pretraining import metrics
    from tests.test_export import make_workdir

    run = make_workdir(tmp_path_factory)
    before = _files(run["path"])
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    config = _config(data, init_from=run["path"], num_epochs=1.0, **{"model.hidden_size": 64})
    workdir = tmp_path / "w"
    results = loop.finetune(config, str(workdir))
    assert _files(run["path"]) == before
    assert results["init_source"] == f"{run['path']} (checkpoint 6)"
    record = json.loads((workdir / saved.MODEL_FILE).read_text())["pretraining"]
    with open(os.path.join(run["path"], "config.json")) as f:
        pre = json.load(f)
    flops = metrics.count_flops(
        run["spec"],
        pre["train"]["batch_size"],
        pre["data"]["seq_length"],
        num_mask_slots(pre["data"]["seq_length"], pre["objective"]["mask_prob"]),
        pre["objective"]["name"],
    )["total"]
    assert record["kind"] == "workdir" and record["step"] == 6 and record["flops"] == 6 * flops
    assert record["corpus"] == pre["data"]["source"] and record["objective"] == "electra"
    # The tokenizer is the pre-trained model's, kept in the fine-tuning workdir.
    assert (workdir / "tokenizer" / "spm.model").read_bytes() == run["tokenizer"].model_proto


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_0_and_the_rerun_finishes_as_one_run(tmp_path):
    import signal

    config = _glue(tmp_path, num_epochs=4.0, log_every_steps=10)  # 16 steps
    straight = loop.finetune(config, str(tmp_path / "straight"))
    workdir = tmp_path / "w"
    flags = [f"--config.{k}={v}" for k, v in _flat(config.to_dict())]
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    # Held after step 10 until the SIGTERM has come (tests/held.py): however fast the steps, the
    # signal comes before the remaining 6 (sent on the "step 10" line instead, it raced them).
    proc = command_server.start(
        held.command(hold_dir, "step=10", "electra_jax.finetune", "--config=configs/glue.py",
                     *flags, f"--workdir={workdir}"),
        ROOT, subprocess_env(),
    )  # fmt: skip
    try:
        held.wait_held(hold_dir, proc)
        proc.send_signal(signal.SIGTERM)
        held.release(hold_dir)
        _, rest = proc.communicate(timeout=300)  # a guard against a hang
        assert proc.returncode == 0, rest[-3000:]
    finally:
        proc.kill()
    assert "preempted at step" in rest and "Traceback" not in rest, rest[-3000:]
    stopped = int(rest.split("preempted at step ")[1].split(";")[0])
    # Honoured after the step after the hold.
    assert stopped == 11 and str(stopped) in os.listdir(workdir / "checkpoints")
    assert not (workdir / loop.RESULTS_FILE).exists()
    again = loop.finetune(config, str(workdir))
    assert _without_time(again) == _without_time(straight)
    weights = saved.WEIGHTS_FILE
    assert (workdir / weights).read_bytes() == (tmp_path / "straight" / weights).read_bytes()
