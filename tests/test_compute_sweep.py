"""benchmarks/studies/compute_sweep/compute_sweep.py and benchmarks/probe.py: the report over
budgets, the probe."""

import json
import os

import numpy as np
import pytest

from benchmarks import probe
from benchmarks.studies.compute_sweep import compute_sweep as cs


def _results(scores: dict, probes: dict) -> dict:
    """A sample_efficiency results dict: scores {(model, step): [per-seed scores]} of one task."""
    runs = [
        {"objective": m, "step": s, "task": "SST-2", "seed": i, "score": v}
        for (m, s), values in scores.items()
        for i, v in enumerate(values)
    ]
    return {
        "tasks": ["SST-2"],
        "fractions": [0.25, 1.0],
        "budget_flops": 4e12,
        "pretrain": [
            {"objective": "electra", "steps": [10, 40], "seconds": 5.0, "flops_per_step": 1e11},
            {"objective": "mlm", "steps": [12, 48], "seconds": 5.0, "flops_per_step": 8e10},
        ],
        "finetune": [dict(r, elapsed_sec=1.0, learning_rate=1e-3) for r in runs],
        "sweep": [],
        "probe": [{"objective": m, "step": s, "accuracy": a} for (m, s), a in probes.items()],
    }


def test_budgets_and_crossovers_read_each_checkpoint_against_random_init_and_mlm(tmp_path):
    scores = {
        ("electra", 10): [0.60, 0.62],  # below random init at the small budget
        ("electra", 40): [0.80, 0.82],  # above both at the large one
        ("mlm", 12): [0.60, 0.61],
        ("mlm", 48): [0.70, 0.71],
        (cs.RANDOM, 0): [0.65, 0.66],
    }
    probes = {("electra", 10): 0.6, ("electra", 40): 0.7, ("mlm", 12): 0.62, ("mlm", 48): 0.65}
    probes[(cs.RANDOM, 0)] = 0.55
    results = _results(scores, probes)
    # ELECTRA's held-out readings as its training logged them (MLM's run logged none here).
    run = tmp_path / "pretrain" / "electra"
    run.mkdir(parents=True)
    logged = [
        {"step": 20, "loss": 3.0, "eval/disc_auc": 0.7, "eval/collapse_cosine": 0.2},
        {"step": 30, "loss": 2.9},
        {"step": 40, "eval/disc_auc": 0.75123, "eval/gen_accuracy": 0.1},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    rows = cs.budgets(results)
    assert [r["pretrain_flops"] for r in rows] == [1e12, 4e12]
    assert rows[0]["models"]["electra"] == {
        "average": 61.0,
        "std": pytest.approx(1.41, abs=0.01),
        "seeds": 2,
        "probe": 60.0,
        "probe_se": None,  # no dev size given: no margin
        "steps": 10,
    }
    assert rows[1]["models"][cs.RANDOM]["average"] == 65.5
    assert cs.crossovers(rows) == {"random_init": 4e12, "mlm": 4e12}
    # The probe passes MLM only at the large budget, random init at the small one already.
    assert cs.crossovers(rows, "probe") == {"random_init": 1e12, "mlm": 4e12}
    summary = cs.report(results, str(tmp_path))
    assert summary["average"] == {"electra": 81.0, "mlm": 70.5, cs.RANDOM: 65.5}
    assert summary["budgets"] == rows and summary["pretrain_flops"] == 4e12
    assert summary["pretraining"] == {
        "electra": [
            {"step": 20, "pretrain_flops": 2e12, "disc_auc": 0.7, "collapse_cosine": 0.2},
            {"step": 40, "pretrain_flops": 4e12, "disc_auc": 0.7512, "gen_accuracy": 0.1},
        ],
        "mlm": [],
    }
    with open(tmp_path / "pretraining.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "summary.json") as f:
        assert json.load(f)["crossovers"]["average"]["mlm"] == 4e12
    with open(tmp_path / "compute_sweep.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert (
        "| 4e+12 | electra | 40 | 81.00 +- 1.41 (2) | 70.0 |" in (tmp_path / "table.md").read_text()
    )


def test_a_probe_lead_within_its_standard_error_is_no_crossover():
    scores = {("electra", 10): [0.6], ("electra", 40): [0.6], ("mlm", 12): [0.6]}
    scores.update({("mlm", 48): [0.6], (cs.RANDOM, 0): [0.6]})
    # 872 dev sentences: at 60% accuracy a standard error of 1.66 points.
    probes = {("electra", 10): 0.61, ("electra", 40): 0.64, ("mlm", 12): 0.60}
    probes.update({("mlm", 48): 0.63, (cs.RANDOM, 0): 0.60})
    results = _results(scores, probes)
    for row in results["probe"]:
        row["dev_examples"] = 872
    rows = cs.budgets(results)
    assert rows[0]["models"]["electra"]["probe_se"] == pytest.approx(1.65, abs=0.01)
    # +1 over random init at the small budget is within it; +4 at the large one is not; +1
    # over MLM at the large one is within it.
    assert cs.crossovers(rows, "probe") == {"random_init": 4e12, "mlm": None}


def test_a_lead_within_the_seed_noise_is_no_crossover():
    scores = {("electra", 10): [0.60, 0.70], ("electra", 40): [0.66, 0.74]}
    scores.update({("mlm", 12): [0.6, 0.6], ("mlm", 48): [0.69, 0.69], (cs.RANDOM, 0): [0.68, 0.7]})
    assert cs.crossovers(cs.budgets(_results(scores, {}))) == {"random_init": None, "mlm": None}


def test_the_preset_stretches_the_recipes_schedules_to_each_run():
    from benchmarks.studies.sample_efficiency import sample_efficiency as se

    preset = dict(cs.PRESETS["cpu"], schedule_fractions={"objective.temperature_steps": 0.5})
    config = se.pretrain_config(preset, "electra", "corpus/*.txt", "/tmp/out")
    config.objective.temperature_start = 2.0
    info = se.plan(config, preset)
    assert config.objective.temperature_steps == round(0.5 * info["steps"][-1])
    assert info["steps"][0] * info["flops_per_step"] == pytest.approx(3e14 / 243, rel=0.01)
    assert config.eval.every_steps % config.log.every_steps == 0


def test_the_probe_fits_a_separable_problem_deterministically():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-1, 1, (200, 8)), rng.normal(1, 1, (200, 8))]).astype("f4")
    y = np.array([0] * 200 + [1] * 200)
    x[:, 3] *= 100.0  # standardised inside: a feature's scale does not matter
    predict = probe.fit(x, y, 2)
    accuracy = float(np.mean(predict(x) == y))
    assert accuracy > 0.95
    assert np.array_equal(probe.fit(x, y, 2)(x), predict(x))
    noise = probe.fit(rng.normal(size=(400, 8)).astype("f4"), rng.integers(0, 2, 400), 2)
    assert float(np.mean(noise(x) == y)) < 0.8  # nothing learned from noise


def test_features_are_mean_pooled_states_of_real_tokens(tmp_path):
    import jax

    from electra_jax.data import tokenizer as tokenizer_lib
    from electra_jax.finetune.tasks import Example
    from electra_jax.model import networks as model_lib
    from electra_jax.model.weights import Pretrained
    from electra_jax.pretrained import Model
    from tests.micro import micro_config
    from tests.test_export import _sentences

    cfg = micro_config()
    tok = tokenizer_lib.train_tokenizer(
        _sentences()[:3000], str(tmp_path / "tok"), 300, 0.9995, seed=0, sample_sentences=3000
    )
    spec = model_lib.spec_from_config(cfg.model, cfg.generator, tok.vocab_size)
    params = model_lib.init_params(model_lib.Electra(spec), jax.random.PRNGKey(0))
    model = Model(Pretrained(spec, jax.tree_util.tree_map(np.asarray, params), tok, "random"))
    examples = [Example("a short one", None, 0, "x"), Example("a pair", "of two texts", 1, "y")]
    got = probe.features(model, examples, max_length=16, batch_size=1)
    assert got.shape == (2, cfg.model.hidden_size)
    ids = model.tokenize(["a short one"], max_length=16)
    states = model.encode(ids)[0][ids["input_mask"][0] > 0]
    np.testing.assert_allclose(got[0], states.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert os.path.isdir(tmp_path / "tok")


@pytest.mark.slow
def test_a_report_while_pretraining_reads_what_is_saved(tmp_path, monkeypatch, capsys):
    """--report_only before the sweep's results exist: the runs' plan, the probe at each saved
    checkpoint (and random init), the held-out readings, no fine-tuning."""
    from tests.test_sample_efficiency import MICRO, _write_inputs

    corpus, glue_dir = _write_inputs(tmp_path)
    preset = dict(
        MICRO,
        variants={"electra": {"objective": "electra", "overrides": {}}},
        probe={"task": "SST-2", "max_train_examples": 40, "max_length": 32},
    )
    preset["pretrain"] = dict(preset["pretrain"], **{"data.heldout_examples": 16})
    monkeypatch.setitem(cs.PRESETS, "cpu", preset)
    out = tmp_path / "out"
    argv = [f"--out={out}", f"--corpus={corpus}", f"--glue_dir={glue_dir}"]
    cs.main([*argv, "--pretrain_only"])
    # The last budget's checkpoint "not saved yet": moved away, as if its run were still going.
    steps = sorted(int(n) for n in os.listdir(out / "pretrain" / "electra" / "checkpoints"))
    os.rename(out / "pretrain" / "electra" / "checkpoints" / str(steps[-1]), tmp_path / "later")

    cs.main([*argv, "--report_only"])
    summary = json.loads((out / "summary.json").read_text())
    first, last = summary["budgets"]
    assert first["models"]["electra"]["steps"] == steps[0]
    assert first["models"]["electra"]["probe"] is not None
    assert last["models"]["electra"]["probe"] is None  # not saved: not probed
    assert last["models"][cs.RANDOM]["probe"] is not None
    assert first["models"]["electra"]["average"] is None  # nothing fine-tuned
    assert summary["pretraining"]["electra"], "the held-out readings"
    assert not (out / "finetune").exists()
    # Random init's probe alone missing (every checkpoint's read back): it is probed again.
    random_probe = out / "probe" / f"{cs.RANDOM}-0.json"
    os.remove(random_probe)
    cs.main([*argv, "--report_only"])
    again = json.loads(random_probe.read_text())["accuracy"]
    assert 100 * again == pytest.approx(last["models"][cs.RANDOM]["probe"], abs=0.01)
    # The pre-training goes on to its last budget, on a corpus whose files were copied anew
    # (same text, other times): refused in one line (exit 2) unless --allow_change names it.
    import glob

    for path in glob.glob(corpus):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    with pytest.raises(SystemExit) as refused:
        cs.main([*argv, "--pretrain_only"])
    assert refused.value.code == 2
    assert "--allow_change=data.source" in capsys.readouterr().err
    assert not (out / "pretrain" / "electra" / "checkpoints" / str(steps[-1])).exists()
    cs.main([*argv, "--pretrain_only", "--allow_change=data.source"])
    assert (out / "pretrain" / "electra" / "checkpoints" / str(steps[-1])).is_dir()
    changes = (out / "pretrain" / "electra" / "config_changes.jsonl").read_text()
    assert "source_fingerprint" in changes


def test_a_stop_short_of_the_budget_keeps_the_whole_runs_schedule():
    from benchmarks.studies.sample_efficiency import sample_efficiency as se

    preset = cs.PRESETS["cpu"]
    whole = se.pretrain_config(preset, "electra", "corpus/*.txt", "/tmp/out")
    full = se.plan(whole, preset)
    stopped = dict(preset, stop_fraction=3.5e13 / preset["budget_flops"])
    config = se.pretrain_config(stopped, "electra", "corpus/*.txt", "/tmp/out")
    info = se.plan(config, stopped)
    assert info["steps"] == full["steps"][:4]  # the budgets up to 1/9 of 3e14
    assert info["run_steps"] == full["steps"][-1] == config.train.num_steps
    assert config.to_dict() == whole.to_dict()  # the same run: a later one continues it
    assert se.run_fractions(stopped) == list(preset["fractions"][:4])
    with pytest.raises(ValueError, match="stop_fraction .* below the first budget"):
        se.run_fractions(dict(preset, stop_fraction=1e-3))


def test_the_headline_of_a_stopped_sweep_is_its_largest_budget_run():
    from benchmarks.studies.sample_efficiency import sample_efficiency as se

    scores = {("electra", 10): [0.6], ("mlm", 12): [0.62], (cs.RANDOM, 0): [0.61]}
    results = _results(scores, {})
    results["fractions"] = [0.25]
    results["pretrain"] = [dict(p, steps=p["steps"][:1]) for p in results["pretrain"]]
    results["pretrain"].append(dict(results["pretrain"][0], objective="electra-slowgen"))
    results["finetune"].append(dict(results["finetune"][0], objective="electra-slowgen", score=0.7))
    summary = se.summary(results)
    assert summary["pretrain_flops"] == 1e12
    assert summary["average"]["electra-slowgen"] == 70.0
    rows = cs.budgets(results)
    assert [r["pretrain_flops"] for r in rows] == [1e12]
    assert cs.crossovers(rows, model="electra-slowgen") == {"random_init": 1e12, "mlm": 1e12}
    assert cs.crossovers(rows) == {"random_init": None, "mlm": None}
    assert "the largest budget run, 1e+12 counted" in se.tables(results)


def test_stop_flops_below_the_first_budget_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cs.main(["--out=/nonexistent/out", "--stop_flops=1e9"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --stop_flops=1e+09 lies below the first budget")


@pytest.mark.slow
def test_a_stopped_sweep_continues_the_same_runs(tmp_path, monkeypatch):
    """--stop_flops pre-trains the budgets up to it; the same command without it continues the
    same runs to the whole budget (their settings equal, so the resume accepts them)."""
    from tests.test_sample_efficiency import MICRO, _write_inputs

    corpus, glue_dir = _write_inputs(tmp_path)
    preset = dict(MICRO, variants={"electra": {"objective": "electra", "overrides": {}}})
    preset["probe"] = {"task": "SST-2", "max_train_examples": 40, "max_length": 32}
    monkeypatch.setitem(cs.PRESETS, "cpu", preset)
    out = tmp_path / "out"
    argv = [f"--out={out}", f"--corpus={corpus}", f"--glue_dir={glue_dir}", "--pretrain_only"]
    checkpoints = out / "pretrain" / "electra" / "checkpoints"
    cs.main([*argv, f"--stop_flops={MICRO['budget_flops'] / 2}"])
    (first,) = sorted(int(n) for n in os.listdir(checkpoints))
    config = json.loads((out / "pretrain" / "electra" / "config.json").read_text())
    cs.main(argv)
    steps = sorted(int(n) for n in os.listdir(checkpoints))
    assert steps[0] == first and steps[-1] == config["train"]["num_steps"] > first
    rows = [json.loads(line) for line in (out / "pretrain" / "electra" / "metrics.jsonl").open()]
    assert rows[-1]["step"] == steps[-1]


def test_a_truncated_model_encodes_with_its_first_layers_in_either_layout(tmp_path):
    import dataclasses

    import jax

    from electra_jax.data import tokenizer as tokenizer_lib
    from electra_jax.model import layer_stack
    from electra_jax.model import networks as model_lib
    from electra_jax.model.weights import Pretrained
    from electra_jax.pretrained import Model
    from tests.micro import micro_config
    from tests.test_export import _sentences

    cfg = micro_config()
    cfg.model.num_layers = 3
    tok = tokenizer_lib.train_tokenizer(
        _sentences()[:3000], str(tmp_path / "tok"), 300, 0.9995, seed=0, sample_sentences=3000
    )
    spec = model_lib.spec_from_config(cfg.model, cfg.generator, tok.vocab_size)
    spec = dataclasses.replace(spec, scan_layers=True)
    params = model_lib.init_params(model_lib.Electra(spec), jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(np.asarray, params)
    scanned = Model(Pretrained(spec, params, tok, "random"))
    unrolled = Model(
        Pretrained(
            dataclasses.replace(spec, scan_layers=False),
            layer_stack.to_layout(params, False),
            tok,
            "random",
        )
    )
    ids = scanned.tokenize(["a short one", "and a second sentence"], max_length=16)
    full = scanned.encode(ids)
    np.testing.assert_allclose(probe.truncated(scanned, 3).encode(ids), full, rtol=1e-6)
    one = probe.truncated(scanned, 1).encode(ids)
    assert not np.allclose(one, full, atol=1e-3)
    np.testing.assert_allclose(probe.truncated(unrolled, 1).encode(ids), one, rtol=1e-5, atol=1e-6)
    two = probe.truncated(unrolled, 2).encode(ids)
    assert not np.allclose(two, one, atol=1e-3) and not np.allclose(two, full, atol=1e-3)
    with pytest.raises(ValueError, match="layers=4: the discriminator has 1 to 3"):
        probe.truncated(scanned, 4)
