"""benchmarks/studies/sample_efficiency/sample_efficiency.py: budget arithmetic and a micro
preset end to end."""

import json
import os

import pytest

from benchmarks.studies.sample_efficiency import sample_efficiency as se
from tests.test_export import _sentences


def test_budget_steps_spend_each_fraction_of_the_budget():
    assert se.budget_steps(1000.0, 10.0, (0.25, 0.5, 1.0)) == [25, 50, 100]
    # A cheaper step gets more steps for the same FLOPs.
    assert se.budget_steps(1000.0, 4.0, (1.0,)) == [250]
    # Rounded to the nearest step, never below one.
    assert se.budget_steps(1000.0, 30.0, (0.5, 1.0)) == [17, 33]
    assert se.budget_steps(10.0, 30.0, (1.0,)) == [1]
    for bad in ((1.0, 0.5), (0.0, 1.0), (0.5, 1.5), ()):
        with pytest.raises(ValueError, match="must increase"):
            se.budget_steps(1000.0, 10.0, bad)
    with pytest.raises(ValueError, match="raise the budget"):
        se.budget_steps(100.0, 30.0, (0.9, 1.0))


def test_plan_sets_the_schedule_and_keeps_every_budget_checkpoint(tmp_path):
    preset = dict(se.PRESETS["cpu"], budget_flops=1e13, fractions=(0.25, 0.5, 1.0))
    steps = {}
    for name in ("electra", "mlm", "all_tokens_mlm"):
        config = se.pretrain_config(preset, name, "corpus/*.txt", str(tmp_path))
        info = se.plan(config, preset)
        steps[name] = info["steps"]
        assert config.train.num_steps == info["steps"][-1]
        assert config.checkpoint.keep > len(info["steps"])
        assert config.checkpoint.every_steps == config.train.num_steps
        assert abs(info["steps"][-1] * info["flops_per_step"] - 1e13) <= info["flops_per_step"]
        assert config.data.cache_dir == os.path.join(str(tmp_path), "data")
    # No generator for MLM; an MLM head at every token for All-Tokens MLM.
    assert steps["mlm"][-1] > steps["electra"][-1] > steps["all_tokens_mlm"][-1]
    # Two-stage: a generator as wide as the discriminator (so fewer steps), switched halfway.
    config = se.pretrain_config(preset, "two_stage", "corpus/*.txt", str(tmp_path))
    info = se.plan(config, preset)
    assert config.generator.hidden_fraction == 1.0
    assert config.objective.two_stage_steps == info["steps"][-1] // 2
    assert info["steps"][-1] < steps["electra"][-1]
    from electra_jax import validate

    validate.check_config(config)  # the preset's 128-wide model: 2 heads of 64, as the generator


MICRO = {
    "base": "tiny",
    "pretrain": {
        "data.vocab_size": 300,
        "data.seq_length": 32,
        "data.tokenizer_sample_sentences": 20_000,
        "model.hidden_size": 32,
        "model.num_layers": 1,
        "model.num_heads": 2,
        "model.intermediate_size": 64,
        "model.embedding_size": 32,
        "train.batch_size": 8,
    },
    "warmup_fraction": 0.2,
    "budget_flops": 1.44e8,  # electra: 7 steps of 2.2e7 FLOPs, mlm 8 of 1.8e7
    "fractions": (0.5, 1.0),
    "finetune": {
        "max_train_examples": 32,
        "seq_length": 32,
        "num_epochs": 1.0,
        "batch_size": 8,
        "eval_batch_size": 32,
        "log_every_steps": 100,
    },
    "tasks": ("SST-2",),
    "seeds": 1,
}


def _write_inputs(root):
    corpus = root / "corpus"
    corpus.mkdir()
    lines = _sentences()[:4000]
    # A blank line ends a document: documents of 40 lines.
    text = "\n\n".join("\n".join(lines[i : i + 40]) for i in range(0, len(lines), 40))
    (corpus / "a.txt").write_text(text + "\n")
    sst = root / "glue" / "SST-2"
    sst.mkdir(parents=True)
    good = ["a fine and moving film", "warm , funny and wise", "a delight from start to end"]
    bad = ["a dull and tired mess", "flat , slow and empty", "nothing works in this one"]
    rows = [(t, 1) for t in good] + [(t, 0) for t in bad]
    for split, n in (("train", 8), ("dev", 2)):
        body = "".join(f"{t}\t{y}\n" for t, y in rows * n)
        (sst / f"{split}.tsv").write_text("sentence\tlabel\n" + body)
    return str(corpus / "*.txt"), str(root / "glue")


@pytest.mark.slow
def test_micro_preset_end_to_end_and_a_rerun_skips_finished_work(tmp_path, monkeypatch):
    corpus, glue_dir = _write_inputs(tmp_path)
    out = str(tmp_path / "out")
    kw = dict(objectives=["electra", "mlm"], corpus=corpus, glue_dir=glue_dir, log=lambda m: None)
    results = se.run(MICRO, out, **kw)

    pre = {p["objective"]: p for p in results["pretrain"]}
    for p in pre.values():
        assert len(p["steps"]) == 2
        assert (
            abs(p["steps"][-1] * p["flops_per_step"] - MICRO["budget_flops"]) <= p["flops_per_step"]
        )
        saved = os.listdir(os.path.join(out, "pretrain", p["objective"], "checkpoints"))
        assert {str(s) for s in p["steps"]} <= set(saved)
    assert pre["mlm"]["steps"][-1] > pre["electra"]["steps"][-1]  # no generator to pay for

    # 2 objectives x 2 budgets + random init, x 1 task x 1 seed.
    assert len(results["finetune"]) == 5
    sources = set()
    for r in results["finetune"]:
        with open(
            os.path.join(
                out, "finetune", f"{r['objective']}-{r['step']}", "SST-2-seed0", "eval_results.json"
            )
        ) as f:
            sources.add(json.load(f)["init_source"])
    assert any(f"(checkpoint {pre['electra']['steps'][0]})" in s for s in sources)
    assert "random" in sources

    table = results["table"].splitlines()
    full = [line for line in table if line.startswith("| ") and "|---" not in line]
    assert full[0] == "| objective | SST-2 | average |"
    assert [line.split(" | ")[0] for line in full[1:4]] == [
        "| electra",
        "| mlm",
        f"| {se.RANDOM}",
    ]
    assert sum(line.startswith("| electra | 0.5 |") for line in table) == 1
    with open(results["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(os.path.join(out, "results.json")) as f:
        assert len(json.load(f)["finetune"]) == 5

    # A rerun trains and fine-tunes nothing and reports the same.
    def fail(*args, **kwargs):
        raise AssertionError("a finished run was started again")

    from electra_jax.finetune import loop as finetune_loop
    from electra_jax.pretraining import runner

    monkeypatch.setattr(runner, "train", fail)
    monkeypatch.setattr(finetune_loop, "finetune", fail)
    again = se.run(MICRO, out, **kw)
    assert again["table"] == results["table"]


def test_in_domain_corpus_sweep_and_summary(tmp_path, monkeypatch):
    """The small-data preset's machinery, with pre-training and fine-tuning stubbed out: the
    corpus holds the general text and the tasks' training sentences only; the sweep picks each
    model's best rate on seed 0 and uses it for the other seeds; summary.json has the headline."""
    corpus, glue_dir = _write_inputs(tmp_path)
    (tmp_path / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\nonly in dev\t1\n")
    best = {"electra": 3e-3, "mlm": 1e-3, se.RANDOM: 3e-3}
    calls = []

    def fake_finetune(config, workdir):
        name = workdir.split(os.sep)[-2].split("-")[0]
        name = se.RANDOM if name == "random_init" else name
        calls.append((name, config.seed, config.learning_rate))
        score = {"electra": 0.8, "mlm": 0.7, se.RANDOM: 0.6}[name] + 0.01 * config.seed
        score -= 0.1 * (config.learning_rate != best[name])
        return {
            "score": score,
            "score_metric": "dev/accuracy",
            "elapsed_sec": 10.0,
            "learning_rate": config.learning_rate,
        }

    from electra_jax.data import shards

    monkeypatch.setattr(se, "pretrain", lambda config, workdir, steps, log, allow=(): 1.0)
    monkeypatch.setattr(se, "finetune", fake_finetune)
    monkeypatch.setattr(shards, "ensure_tokenizer", lambda *a, **k: None)
    preset = dict(MICRO, in_domain=True, fractions=(1.0,), seeds=3, learning_rates=(1e-3, 3e-3))
    out = tmp_path / "out"
    results = se.run(
        preset,
        str(out),
        objectives=["electra", "mlm"],
        corpus=corpus,
        glue_dir=glue_dir,
        log=lambda m: None,
    )

    texts = {p.name: p.read_text() for p in (out / "corpus").iterdir()}
    assert sorted(texts) == ["general-000-a.txt", "task-SST-2.txt"]
    assert (out / "corpus" / "general-000-a.txt").is_symlink()
    assert "a fine and moving film" in texts["task-SST-2.txt"]
    assert "only in dev" not in texts["task-SST-2.txt"] and "\t" not in texts["task-SST-2.txt"]
    assert results["pretrain"][0]["config"]["data"]["source"] == f"text:{out}/corpus/*.txt"

    # Per model: seed 0 at both rates, then seeds 1 and 2 at the better one.
    for name, lr in best.items():
        mine = [c for c in calls if c[0] == name]
        assert mine == [(name, 0, 1e-3), (name, 0, 3e-3), (name, 1, lr), (name, 2, lr)]
    assert sum(r["chosen"] for r in results["sweep"]) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["average"] == {"electra": 81.0, "mlm": 71.0, se.RANDOM: 61.0}
    assert summary["std"]["electra"] == 1.0
    assert summary["pretrain_flops"] == MICRO["budget_flops"]
    # Two pre-trainings of 1 s, twelve fine-tunings of 10 s (the chosen sweep runs counted once).
    assert summary["wall_seconds"] == 2 * 1.0 + 12 * 10.0


def test_pretraining_alone_then_the_full_budget_first_and_the_corpus_left_untouched(
    tmp_path, monkeypatch
):
    """Each objective can pre-train in a process of its own (until='pretrain': no fine-tuning);
    the fine-tuning then starts at the full budget (every objective, then random init) and goes
    down the budgets; a second call leaves the tasks' corpus files as they are (a retimed file
    stops another process's pre-training from resuming)."""
    corpus, glue_dir = _write_inputs(tmp_path)
    order = []

    def fake_finetune(config, workdir):
        order.append(workdir.split(os.sep)[-2])
        return {
            "score": 0.5,
            "score_metric": "dev/accuracy",
            "elapsed_sec": 1.0,
            "learning_rate": 1e-3,
        }

    from electra_jax.data import shards

    monkeypatch.setattr(se, "pretrain", lambda config, workdir, steps, log, allow=(): 1.0)
    monkeypatch.setattr(se, "finetune", fake_finetune)
    monkeypatch.setattr(shards, "ensure_tokenizer", lambda *a, **k: None)
    preset = dict(MICRO, in_domain=True)
    out = tmp_path / "out"
    kw = dict(corpus=corpus, glue_dir=glue_dir, log=lambda m: None)
    only = se.run(preset, str(out), objectives=["mlm"], until="pretrain", **kw)
    assert [p["objective"] for p in only["pretrain"]] == ["mlm"] and order == []
    assert not (out / "results.json").exists()
    task_file = out / "corpus" / "task-SST-2.txt"
    os.utime(task_file, (1_000_000_000, 1_000_000_000))

    results = se.run(preset, str(out), objectives=["electra", "mlm"], **kw)
    assert task_file.stat().st_mtime == 1_000_000_000
    e, m = (p["steps"] for p in results["pretrain"])
    assert order == [
        f"electra-{e[1]}",
        f"mlm-{m[1]}",
        f"{se.RANDOM}-0",
        f"electra-{e[0]}",
        f"mlm-{m[0]}",
    ]


def test_a_signal_stops_the_pretraining_at_its_checkpoint_not_the_next_budget(
    tmp_path, monkeypatch
):
    """runner.train returns after SIGTERM with the step it saved: `pretrain` stops there (it used
    to go on to the next budget, so the signal never ended the benchmark)."""
    from electra_jax.pretraining import runner

    calls = []

    def interrupted(config, workdir, stop_after, allow_changes=()):
        calls.append(stop_after)
        return {"step": 5, "preempted_at": 5}

    monkeypatch.setattr(runner, "train", interrupted)
    config = se.pretrain_config(MICRO, "electra", "corpus/*.txt", str(tmp_path))
    workdir = str(tmp_path / "w")
    os.makedirs(workdir)
    with pytest.raises(SystemExit, match="stopped at step 5 by a signal"):
        se.pretrain(config, workdir, [10, 20], log=lambda m: None)
    assert calls == [10]
    with open(os.path.join(workdir, "pretrain_seconds.json")) as f:
        assert float(f.read()) >= 0.0


def test_a_signal_stops_the_benchmark_at_the_fine_tuning_it_interrupted(tmp_path, monkeypatch):
    """finetune returns {'stopped_at'} after SIGTERM (it saved): the benchmark ends there with
    one line, instead of reading the missing score (a KeyError); a finished run is read back."""
    from electra_jax.finetune import loop as finetune_loop

    monkeypatch.setattr(
        finetune_loop, "finetune", lambda config, workdir: {"stopped_at": 40, "steps": 250}
    )
    with pytest.raises(SystemExit, match="stopped at step 40 of 250 by a signal"):
        se.finetune(None, str(tmp_path / "run"))
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "eval_results.json").write_text('{"score": 0.5}')
    assert se.finetune(None, str(tmp_path / "done")) == {"score": 0.5}


def test_collect_reads_every_finished_fine_tuning_and_trains_nothing(tmp_path, monkeypatch):
    """until='collect' (compute_sweep --report_only): the fine-tunings another process finished
    are read from their eval_results.json; a start whose seed-0 sweep is incomplete has its
    runs listed with no rate chosen and no seed beyond 0; nothing is pre-trained or fine-tuned."""
    corpus, glue_dir = _write_inputs(tmp_path)
    from electra_jax.data import shards

    def refuse(*args, **kwargs):
        raise AssertionError("collect trains nothing")

    monkeypatch.setattr(se, "pretrain", refuse)
    monkeypatch.setattr(se, "finetune", refuse)
    monkeypatch.setattr(shards, "ensure_tokenizer", lambda *a, **k: None)
    preset = dict(MICRO, fractions=(1.0,), seeds=2, learning_rates=(1e-3, 3e-3))
    out = tmp_path / "out"
    kw = dict(objectives=["electra"], corpus=corpus, glue_dir=glue_dir, log=lambda m: None)
    step = se.run(preset, str(out), until="plan", **kw)["pretrain"][0]["steps"][-1]

    def finished_run(start, name, score, lr):
        where = out / "finetune" / start / name
        where.mkdir(parents=True)
        row = {"score": score, "score_metric": "dev/accuracy", "elapsed_sec": 5.0}
        (where / "eval_results.json").write_text(json.dumps(dict(row, learning_rate=lr)))

    finished_run(f"electra-{step}", "SST-2-seed0-lr0.001", 0.7, 1e-3)
    finished_run(f"electra-{step}", "SST-2-seed0-lr0.003", 0.8, 3e-3)
    finished_run(f"electra-{step}", "SST-2-seed1-lr0.003", 0.78, 3e-3)
    finished_run(f"{se.RANDOM}-0", "SST-2-seed0-lr0.001", 0.6, 1e-3)  # its 3e-3 still running
    (out / "finetune" / f"{se.RANDOM}-0" / "SST-2-seed0-lr0.003").mkdir()

    results = se.run(preset, str(out), until="collect", **kw)
    got = sorted((r["objective"], r["seed"], r["score"]) for r in results["finetune"])
    assert got == [("electra", 0, 0.8), ("electra", 1, 0.78)]
    sweep = {(r["objective"], r["learning_rate"]): r["chosen"] for r in results["sweep"]}
    assert sweep == {("electra", 1e-3): False, ("electra", 3e-3): True, (se.RANDOM, 1e-3): False}
    assert not (out / "results.json").exists() and not (out / "results.partial.json").exists()

    from benchmarks.studies.compute_sweep import compute_sweep

    table = compute_sweep.sweep_table(results)
    assert f"| electra@{step} | SST-2 | 70.0 | **80.0** |" in table
    assert f"| {se.RANDOM}@0 | SST-2 | 60.0 | - |" in table
