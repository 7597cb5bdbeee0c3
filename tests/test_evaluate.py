"""Held-out evaluation end to end: in the training loop, after the fact, and for old runs."""

import json
import re
import sys

import pytest

from electra_jax import evaluate
from electra_jax.pretraining import metrics, runner
from tests import command_server
from tests.conftest import ROOT, run_command, subprocess_env
from tests.pretraining.test_runner import config_with, prepare_shared_data


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


EVAL_KEYS = {
    "eval/disc_auc",
    "eval/disc_auc_frequent",
    "eval/disc_auc_unigram",
    "eval/collapse_cosine",
    "eval/disc_loss",
}


def _eval_config(shared_data):
    cfg = config_with(shared_data)
    cfg.data.heldout_examples = 32  # 4 batches of 8
    cfg.eval.every_steps = 2
    return cfg


@pytest.mark.slow
def test_training_evaluates_on_schedule_and_resumes_with_the_same_readings(
    shared_data, tmp_path, capsys
):
    cfg = _eval_config(shared_data)
    cfg.log.every_steps = 5  # an evaluation writes a row of its own
    straight = tmp_path / "straight"
    runner.train(cfg, str(straight))
    rows = metrics.read_rows(str(straight / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [2, 4, 5, 6]
    evaluated = [r["step"] for r in rows if "eval/disc_auc" in r]
    assert evaluated == [2, 4, 6]
    for r in rows:
        if r["step"] in evaluated:
            assert set(r) >= EVAL_KEYS
            assert 0.0 <= r["eval/disc_auc"] <= 1.0 and r["eval/collapse_cosine"] < 1.0
    resumed = tmp_path / "resumed"
    capsys.readouterr()
    runner.train(cfg, str(resumed), stop_after=3)
    runner.train(cfg, str(resumed))
    # Both ran the evaluation the first run compiled (program.setup_step keeps it).
    err = capsys.readouterr().err
    assert err.count("reusing the held-out evaluation (") == 2, err
    assert "compiled the held-out evaluation" not in err
    again = {r["step"]: r for r in metrics.read_rows(str(resumed / "metrics.jsonl"))}
    # The stop at step 3 wrote a row with the held-out readings, where its checkpoint is.
    assert sorted(again) == [2, 3, 4, 5, 6] and set(again[3]) >= EVAL_KEYS
    for a in rows:
        for k in ("loss", "disc_loss", "grad_norm", *EVAL_KEYS):
            assert a.get(k) == again[a["step"]].get(k), (a["step"], k)
    # After the fact: the kept checkpoints (3 and 6) read as the training read steps 3 and 6.
    after = evaluate.evaluate_workdir(str(straight))
    assert [r["step"] for r in after] == [3, 6]
    for k in EVAL_KEYS:
        assert after[0][k] == again[3][k], k
        assert after[1][k] == rows[-1][k], k
    joined = evaluate.read_rows(str(straight))
    assert [r["step"] for r in joined] == [2, 3, 4, 6]
    assert json.loads((straight / "eval.jsonl").read_text().splitlines()[0])["step"] == 3
    # The command: the rows on stdout, and without --verbose no INFO record of orbax's reads.
    out = run_command("electra_jax.evaluate", f"--workdir={straight}", "--steps=6", timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"][0]["eval/disc_auc"] == rows[-1]["eval/disc_auc"]
    assert not [ln for ln in out.stderr.splitlines() if re.match(r"I\d{4} ", ln)], out.stderr
    assert "read only" not in out.stderr and "read_only" not in out.stderr, out.stderr


@pytest.mark.slow
def test_a_mixture_reads_each_parts_heldout_rows_and_keeps_its_corpus(shared_data, tmp_path):
    """A 0.7 / 0.3 mixture of two text files: the held-out readings over both parts and each
    part's own (`eval/NAME/...`); a resume with other weights, or with a part's file changed,
    is refused in one line naming data.mixture."""
    from electra_jax.errors import ConfigError
    from tests.data.test_shards import make_corpus

    folder = make_corpus(str(tmp_path / "corpus"), num_topics=12)[len("text:") : -len("/*.txt")]
    cfg = _eval_config(shared_data)
    cfg.data.cache_dir = str(tmp_path / "cache")  # the parts' shards: not the shared ones
    cfg.data.heldout_examples = 16  # of each part: the 32 rows of the other tests' program
    cfg.data.mixture = f"a=text:{folder}/part0.txt:0.7;b=text:{folder}/part1.txt:0.3"
    workdir = tmp_path / "run"
    runner.train(cfg, str(workdir), stop_after=2)
    row = metrics.read_rows(str(workdir / "metrics.jsonl"))[-1]
    for name in ("", "a/", "b/"):
        assert 0.0 <= row[f"eval/{name}disc_auc"] <= 1.0, name
        assert set(row) >= {k.replace("eval/", f"eval/{name}") for k in EVAL_KEYS}
    assert row["eval/a/disc_loss"] != row["eval/b/disc_loss"]
    record = json.loads((workdir / "data_record.json").read_text())
    assert [(p["name"], p["weight"]) for p in record["mixture"]] == [("a", 0.7), ("b", 0.3)]
    reweighted = cfg.copy_and_resolve_references()
    reweighted.data.mixture = cfg.data.mixture.replace("0.7", "0.5").replace("0.3", "0.5")
    with pytest.raises(ConfigError, match="data.mixture=.*--allow_change=data.mixture"):
        runner.train(reweighted, str(workdir))
    with open(f"{folder}/part1.txt", "a") as f:
        f.write("\n\nOne more document.\n")
    with pytest.raises(ConfigError, match="corpus under data.mixture .* changed: resized: part1"):
        runner.train(cfg, str(workdir))


@pytest.mark.slow
def test_a_run_from_before_the_heldout_slice_resumes_on_every_row(shared_data, tmp_path, capsys):
    """A run whose config.json lacks data.heldout_examples trained on every row: it resumes on
    every row (exactly as a run with the slice off), and evaluate says it read seen rows."""
    cfg = config_with(shared_data)
    cfg.data.heldout_examples = 0
    straight = runner.train(cfg, str(tmp_path / "straight"))
    old = tmp_path / "old"
    runner.train(cfg, str(old), stop_after=3)
    stored = json.loads((old / "config.json").read_text())
    del stored["data"]["heldout_examples"]
    del stored["eval"]
    (old / "config.json").write_text(json.dumps(stored))
    capsys.readouterr()
    resumed = runner.train(config_with(shared_data), str(old))  # heldout_examples=256
    assert "resuming with data.heldout_examples=0" in capsys.readouterr().err
    for k in ("loss", "gen_loss", "disc_loss", "grad_norm"):
        assert resumed[k] == straight[k], k
    rows = evaluate.evaluate_workdir(str(old), steps=[6], heldout_examples=16)
    assert rows[0]["eval/trained_on"] == 1.0 and set(rows[0]) >= EVAL_KEYS
    assert "trained on every row" in capsys.readouterr().err


def test_the_command_refuses_bad_input_in_one_line(tmp_path):
    def run(*args):
        return command_server.run(
            [sys.executable, "-m", "electra_jax.evaluate", *args],
            cwd=ROOT,
            env=subprocess_env(),
            timeout=120,
        )

    missing = run(f"--workdir={tmp_path / 'nope'}")
    assert missing.returncode == 2 and missing.stderr.startswith("error: --workdir")
    assert "Traceback" not in missing.stderr
    (tmp_path / "notes.txt").write_text("notes")
    a_file = run(f"--workdir={tmp_path / 'notes.txt'}")
    assert a_file.returncode == 2 and a_file.stderr == (
        f"error: --workdir {tmp_path / 'notes.txt'} is a file, not a workdir; give a "
        "pre-training workdir\n"
    )
    steps = run(f"--workdir={tmp_path}", "--steps=a")
    assert steps.returncode == 2 and "--steps=a" in steps.stderr
    twice = run(f"--workdir={tmp_path}", "--steps=3,6,03")  # before the workdir is read
    assert twice.returncode == 2 and twice.stderr == (
        "error: --steps names 3 (as '3' and '03') twice; name each once\n"
    )
    empty = run(f"--workdir={tmp_path}")
    assert empty.returncode == 2 and "config.json" in empty.stderr
    assert "Traceback" not in empty.stderr


def test_a_fine_tuning_workdir_or_an_export_is_named_as_such(tmp_path):
    """Not "config.json has no generator section ... restore it from a copy": the folder is
    fine, it is only not what evaluate takes."""
    import json

    from electra_jax.run import workdir as workdir_lib
    from tests.conftest import error_line, run_command

    finetuned = tmp_path / "sst2"
    with workdir_lib.claimed(str(finetuned), workdir_lib.FINETUNE, command="test"):
        (finetuned / "config.json").write_text(json.dumps({"family": "glue", "task": "SST-2"}))
    exported = tmp_path / "hf" / "discriminator"
    exported.mkdir(parents=True)
    (exported / "config.json").write_text(json.dumps({"model_type": "electra"}))
    for folder, what in ((finetuned, "a fine-tuning workdir"), (exported.parent, "an export")):
        line = error_line(run_command("electra_jax.evaluate", f"--workdir={folder}"), only=True)
        assert line.startswith(f"error: --workdir {folder} is {what}"), line
        assert "takes a pre-training workdir" in line, line


def test_a_tokenizer_other_than_the_runs_is_refused_before_the_rows_are_read(tmp_path):
    """The held-out rows are tokenized with WORKDIR/tokenizer: one the run did not train with
    (its data_record.json names another) is refused before any row is prepared."""
    from electra_jax.data.tokenizer import train_tokenizer
    from electra_jax.errors import PretrainedError
    from tests.conftest import micro_config

    workdir = tmp_path / "run"
    words = ["river", "house", "tree", "city", "king", "ship", "road", "garden", "winter"]
    sentences = [" ".join(words[(i * k) % 9] for k in range(1, 8)) for i in range(200)]
    train_tokenizer(sentences, str(workdir / "tokenizer"), 30, 1.0, 0, 1000)
    (workdir / "config.json").write_text(json.dumps(micro_config().to_dict()))
    record = {"format": 1, "fields": {"tokenizer_fingerprint": "0" * 64}, "files": None}
    (workdir / "data_record.json").write_text(json.dumps(record))
    with pytest.raises(PretrainedError, match="is not the tokenizer the run trained with"):
        evaluate.evaluate_workdir(str(workdir))
    assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "data_record.json",
        "tokenizer",
    ]  # nothing prepared
