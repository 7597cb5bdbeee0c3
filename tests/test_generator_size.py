"""benchmarks/studies/generator_size/generator_size.py: the paper's generator widths at equal steps,
end to end with pre-training and fine-tuning stubbed out (test_sample_efficiency runs that machinery
for real)."""

import json
import os

from benchmarks.studies.generator_size import generator_size as gs
from benchmarks.studies.sample_efficiency import sample_efficiency as se
from tests.test_sample_efficiency import MICRO, _write_inputs


def test_every_generator_width_is_pretrained_for_the_same_steps_and_plotted(tmp_path, monkeypatch):
    corpus, glue_dir = _write_inputs(tmp_path)
    preset = gs._preset(dict(MICRO, seeds=2), 12, warmup_fraction=0.2)
    trained = {}

    def fake_pretrain(config, workdir, steps, log, allow=()):
        trained[os.path.basename(workdir)] = (
            config.generator.hidden_fraction,
            config.objective.name,
            config.train.num_steps,
            steps,
        )
        return 1.0

    def fake_finetune(config, workdir):
        name = workdir.split(os.sep)[-2].rsplit("-", 1)[0]
        fraction = gs.fraction_of(name)
        # A score that peaks at a quarter of the width, random init lowest.
        score = 0.5 if fraction is None else 0.8 - abs(fraction - 0.25) / 4
        score += 0.01 * config.seed
        return {
            "score": score,
            "score_metric": "dev/accuracy",
            "elapsed_sec": 1.0,
            "learning_rate": config.learning_rate,
            "init_source": config.init_from,
        }

    from electra_jax.data import shards

    monkeypatch.setattr(se, "pretrain", fake_pretrain)
    monkeypatch.setattr(se, "finetune", fake_finetune)
    monkeypatch.setattr(shards, "ensure_tokenizer", lambda *a, **k: None)
    out = tmp_path / "out"
    results = gs.run(preset, str(out), corpus=corpus, glue_dir=glue_dir, log=lambda m: None)

    # The five widths of the paper's Figure 3 (left), ELECTRA each, 12 steps each.
    assert trained == {gs.label(f): (f, "electra", 12, [12]) for f in (0.125, 0.25, 0.5, 0.75, 1.0)}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pretrain_steps"] == 12 and summary["pretrain_flops"] is None
    assert set(summary["average"]) == {*map(gs.label, gs.FRACTIONS), se.RANDOM}
    assert summary["average"]["generator_0.25"] == 80.5  # seeds 0 and 1: 0.80 and 0.81
    assert max(summary["average"], key=summary["average"].get) == "generator_0.25"
    table = results["table"]
    assert "largest budget run, 12 pre-training steps each" in table
    assert "| generator_0.75 |" in table
    with open(results["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert results["plot"].endswith("generator_size.png")
    assert gs.PRESETS["cpu"]["budget_steps"] == 1500 and "budget_flops" not in gs.PRESETS["gpu"]


def test_the_presets_configs_are_valid_at_every_width(tmp_path):
    from electra_jax import validate

    for name, preset in gs.PRESETS.items():
        for model in preset["objectives"]:
            config = se.pretrain_config(preset, model, "corpus/*.txt", str(tmp_path))
            info = se.plan(config, preset)
            assert info["steps"] == [preset["budget_steps"]], (name, model)
            assert config.generator.hidden_fraction == gs.fraction_of(model)
            validate.check_config(config)
