"""benchmarks/studies/recipe_study/recipe_study.py: the long base (the compute sweep's ELECTRA
run), stopping early."""

import pytest

from benchmarks.studies.compute_sweep import compute_sweep
from benchmarks.studies.recipe_study import recipe_study
from tests.conftest import SHARED


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHARED / "data" / "corpus").is_dir(), reason="needs the shared corpus and GLUE files"
)
def test_the_sweep_base_is_the_sweeps_electra_run_under_the_papers_recipe(tmp_path):
    corpus, glue_dir = (
        str(SHARED / "data" / "corpus" / "*" / "*.txt"),
        str(SHARED / "data" / "glue"),
    )
    config = recipe_study.base_config("sweep", str(tmp_path), corpus, glue_dir)
    preset = compute_sweep.PRESETS["cpu"]
    # The sweep's budget and shape, in its steps, read every two logged rows.
    assert config.train.num_steps * 2.89e10 == pytest.approx(preset["budget_flops"], rel=0.01)
    assert config.data.vocab_size == 8192 and config.model.hidden_size == 128
    assert config.eval.every_steps == 2 * config.log.every_steps
    # The paper's recipe underneath, so that a setting's name says all it changes.
    assert config.train.learning_rate == 1e-3 and not config.train.rtd_prior_init
    assert (tmp_path / "tokenizer" / "spm.model").is_file()
    assert config.data.tokenizer == str(tmp_path / "tokenizer")
    assert config.data.source == f"text:{tmp_path}/corpus/*.txt"
    recipe_study.apply(config, recipe_study.SETTINGS["lr1e-4-glr0.1-prior"])
    from electra_jax import validate

    validate.check_config(config)
    # An objective with a costlier step gets its own budget's schedule, read as often.
    electra_steps, every = config.train.num_steps, config.eval.every_steps
    recipe_study.apply(config, recipe_study.SETTINGS["emlm-lr1e-3-prior-dw10"])
    recipe_study.own_budget(config)
    assert config.train.num_steps * 5.53e10 == pytest.approx(preset["budget_flops"], rel=0.01)
    assert config.train.num_steps < electra_steps * 0.55
    assert config.train.warmup_steps == int(0.1 * config.train.num_steps)
    assert config.eval.every_steps == every
    assert config.checkpoint.every_steps == config.train.num_steps
    validate.check_config(config)


def test_a_run_is_finished_at_its_stop_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 5}\n{"step": 10}\n')
    assert recipe_study._finished(str(tmp_path), 10)
    assert recipe_study._finished(str(tmp_path), 8)  # stopped after step 8: done
    assert not recipe_study._finished(str(tmp_path), 12)
