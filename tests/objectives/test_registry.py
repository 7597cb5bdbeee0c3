"""Tests of objectives/registry.py and names.py: every registered objective runs in the step."""

import subprocess
import sys

import jax
import numpy as np
import pytest

from electra_jax.model import sharding
from electra_jax.objectives import catalog, registry
from electra_jax.pretraining import metrics, program
from tests.conftest import ROOT, micro_config, subprocess_env

# Non-default embedding sharing, paired with some objectives so that each mode trains too.
SHARING = {"electra_15": "none", "mlm": "gdes", "replaced_mlm": "none", "all_tokens_mlm": "gdes"}
# What each objective adds to the step's metrics.
OWN_METRICS = {
    "mlm": {"mlm_loss", "mlm_accuracy"},
    "replaced_mlm": {"mlm_loss", "mlm_accuracy"},
    "all_tokens_mlm": {"mlm_loss", "mlm_accuracy"},
    "two_stage": {"stage"},
    "adversarial": {"policy_gradient", "reward", "policy_loss", "baseline_loss"},
    "electra_mlm": {"disc_mlm_loss", "disc_mlm_accuracy", "disc_mlm_weight"},
}


def test_the_registry_holds_the_names_validate_accepts_in_their_order():
    assert tuple(registry.REGISTRY) == catalog.OBJECTIVES
    for name in catalog.OBJECTIVES:
        assert registry.get(name).name == name
    with pytest.raises(ValueError, match="objective.name='bert': use one of electra, mlm"):
        registry.get("bert")


def test_the_names_and_the_config_check_import_no_jax():
    code = "import sys, electra_jax.validate; print('jax' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_model_heads_follow_the_objective():
    heads = {n: registry.model_heads({"name": n}) for n in catalog.OBJECTIVES}
    assert {n for n, h in heads.items() if h["mlm_head"]} == {
        "mlm",
        "replaced_mlm",
        "all_tokens_mlm",
        "electra_mlm",
    }
    assert {n for n, h in heads.items() if h["policy_baseline"]} == {"adversarial"}
    assert registry.model_heads({"name": "electra", "disc_mlm_weight": 0.5})["mlm_head"]
    assert registry.model_heads({})["mlm_head"] is False  # a config without the section: electra


def _config(name: str):
    cfg = micro_config()
    cfg.model.num_layers, cfg.data.seq_length = 1, 16
    cfg.objective.name = name
    cfg.model.embedding_sharing = SHARING.get(name, "electra")
    cfg.train.learning_rate = 3e-3
    if name == "two_stage":  # a generator of the discriminator's shape; the switch at step 3
        cfg.objective.two_stage_steps = 3
        cfg.generator.hidden_fraction = 1.0
        cfg.model.num_heads, cfg.model.intermediate_size = 1, 256
    if name == "adversarial":  # the policy gradient from step 2
        cfg.objective.mle_warmup_steps = 2
    if name == "electra_mlm":  # its MLM pass's weight
        cfg.objective.disc_mlm_weight = 1.0
    return cfg


def _pattern_batch(cfg, seed=0):
    """Rows of a 7-token cycle at random phases: learnable by every objective."""
    rng = np.random.default_rng(seed)
    b, length = cfg.train.batch_size, cfg.data.seq_length
    phase = rng.integers(0, 7, (b, 1))
    ids = (5 + (phase + np.arange(length)[None]) % 7).astype(np.int32)
    ids[:, 0], ids[:, -1] = 2, 3
    ones = np.ones((b, length), np.int32)
    return {"input_ids": ids, "segment_ids": 0 * ones, "input_mask": ones}


@pytest.mark.parametrize("name", catalog.OBJECTIVES)
def test_every_registered_objective_runs_the_micro_step(name):
    """Six steps of the micro model on a learnable batch: finite, the objective's own metrics
    logged, its heads in the parameters, its FLOPs counted; the loss falls, but for two_stage
    (whose loss changes meaning at the switch: tests/pretraining/test_optimizer_step.py)."""
    cfg = _config(name)
    objective = registry.get(name)
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh)
    state = program.init_on_mesh(setup)
    params = state.params
    assert ("mlm_lm_head_bias" in params) == objective.mlm_head
    assert ("adversarial_baseline" in params) == objective.policy_baseline
    sharing = cfg.model.embedding_sharing
    assert ("generator_embeddings" in params) == (sharing == "none")
    assert ("embeddings_delta" in params) == (sharing == "gdes")
    batch = sharding.global_batch(_pattern_batch(cfg), mesh)
    losses = []
    for _ in range(6):
        state, m = setup.step_fn(state, batch)
        losses.append(float(m["loss"]))
        assert float(m["nonfinite"]) == 0.0
    assert all(np.isfinite(losses)), (name, losses)
    assert set(m) >= {"loss", "gen_loss", "disc_loss", "grad_norm"} | OWN_METRICS.get(name, set())
    if name != "two_stage":
        assert losses[-1] < losses[0] - 0.1, (name, sharing, losses)
    if "mlm_accuracy" in OWN_METRICS.get(name, ()) and name != "mlm":
        assert 0.0 < float(m["mlm_accuracy"]) <= 1.0 and np.isfinite(float(m["mlm_loss"]))
    flops = metrics.count_flops(setup.spec, 8, 16, setup.num_slots, name)
    assert flops["discriminator"] > 0 and (flops["generator"] > 0) == objective.has_generator
