import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.model import networks, sharding
from electra_jax.objectives import two_stage
from electra_jax.pretraining import program
from electra_jax.pretraining.optimizer_step import init_state
from tests.conftest import micro_config


def _batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    b, length = cfg.train.batch_size, cfg.data.seq_length
    ids = rng.integers(5, cfg.data.vocab_size, (b, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 2, 3
    return {
        "input_ids": ids,
        "segment_ids": np.zeros((b, length), np.int32),
        "input_mask": np.ones((b, length), np.int32),
    }


def run_steps(cfg, devices, num_steps=3, setup=None, state=None, same_batch=False):
    """Metrics of `num_steps` steps of the micro model on a mesh over `devices` (through
    `setup`'s compiled step and from `state` when given); a new random batch each step, or the
    first one again with `same_batch`."""
    mesh = sharding.make_mesh(cfg.mesh, devices)
    setup = setup or program.setup_step(cfg, cfg.data.vocab_size, mesh)
    state = program.init_on_mesh(setup) if state is None else state
    step = setup.step_fn
    out = []
    for i in range(num_steps):
        batch = _batch(cfg, 0 if same_batch else i)
        state, m = step(state, sharding.global_batch(batch, mesh))
        out.append({k: float(v) for k, v in m.items()})
    return out


def test_steps_update_state_and_learn():
    cfg = micro_config()
    cfg.train.learning_rate = 3e-3
    # Random ids leave nothing to learn but their counts, so one batch is seen again and again.
    rows = run_steps(cfg, jax.devices()[:1], num_steps=8, same_batch=True)
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert rows[0]["learning_rate"] == 0.0 and rows[2]["learning_rate"] > 0
    assert rows[0]["masked_fraction"] == 4 / 32  # N = int(0.155 x 32) = 4 caps round(4.8)
    assert rows[-1]["gen_loss"] < rows[0]["gen_loss"]


def test_randomness_is_a_function_of_the_step():
    cfg = micro_config()
    devices = jax.devices()[:1]
    setup = program.setup_step(cfg, cfg.data.vocab_size, sharding.make_mesh(cfg.mesh, devices))
    _, model, tx, _, _ = program.build(cfg, cfg.data.vocab_size)
    # The seed is traced, so one compile of the init and one of the step serve all three runs.
    init = jax.jit(lambda seed: init_state(model, tx, seed), out_shardings=setup.state_sharding)
    a = run_steps(cfg, devices, 2, setup, init(0))
    b = run_steps(cfg, devices, 2, setup, init(0))
    assert a == b  # same seed, same numbers
    c = run_steps(cfg, devices, 2, setup, init(1))
    assert c[0]["loss"] != a[0]["loss"]


def test_bfloat16_loss_curve_tracks_float32():
    cfg = micro_config()
    cfg.train.learning_rate = 3e-3
    f32 = run_steps(cfg, jax.devices()[:1], num_steps=10)
    cfg.model.dtype = "bfloat16"
    bf16 = run_steps(cfg, jax.devices()[:1], num_steps=10)
    for k in ("gen_loss", "disc_loss"):
        a = np.array([r[k] for r in f32])
        b = np.array([r[k] for r in bf16])
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(b, a, rtol=0.03, err_msg=k)
    # Random ids leave the generator nothing to learn (its loss starts at ln V); the
    # discriminator learns the replaced rate, and must in bfloat16 too.
    assert bf16[-1]["disc_loss"] < bf16[0]["disc_loss"] - 0.03


def test_accumulated_micro_batches_give_the_full_batch_gradient():
    """grad_accum_steps 4 vs 1 on the same batch, dropout off: same gradient within 1e-5."""
    import optax

    from electra_jax.pretraining.optimizer_step import train_step

    cfg = micro_config()
    cfg.model.dropout_rate = cfg.model.attention_dropout_rate = 0.0
    batch = {k: jnp.asarray(v) for k, v in _batch(cfg).items()}
    batch["input_mask"] = batch["input_mask"].at[:, -7:].set(0)  # uneven real lengths
    spec, model, _, schedule, slots = program.build(cfg, cfg.data.vocab_size)
    sgd = optax.sgd(1.0)  # the update is minus the gradient, unscaled by any optimizer state
    state = init_state(model, sgd, 0)
    grads, metrics = {}, {}
    for k in (1, 4):
        step = functools.partial(
            train_step,
            model=model,
            tx=sgd,
            schedule=schedule,
            objective_cfg=cfg.objective,
            num_slots=slots,
            grad_accum_steps=k,
        )
        new, metrics[k] = jax.jit(step)(state, batch)
        grads[k] = jax.tree_util.tree_map(lambda a, b: a - b, state.params, new.params)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads[1]))
    for a, b in zip(*(jax.tree_util.tree_leaves(grads[k]) for k in (1, 4)), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)
    for name in ("loss", "gen_loss", "disc_loss", "grad_norm", "gen_accuracy"):
        np.testing.assert_allclose(metrics[1][name], metrics[4][name], rtol=1e-5, err_msg=name)


def two_stage_config():
    """The micro config under 'two_stage': a generator as wide as the discriminator (64: one
    head of 64, feed-forward 256), the switch after 3 of 6 steps."""
    cfg = micro_config()
    cfg.objective.name, cfg.objective.two_stage_steps = "two_stage", 3
    cfg.generator.hidden_fraction = 1.0
    cfg.model.num_heads, cfg.model.intermediate_size = 1, 256
    return cfg


def _max_difference(a, b) -> float:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.max(np.abs(x - y))) for x, y in pairs)


def test_two_stage_trains_the_generator_then_the_discriminator_from_it_with_the_generator_frozen():
    cfg = two_stage_config()
    cfg.train.learning_rate = 1e-3
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh)
    state = program.init_on_mesh(setup)
    params, rows = [jax.device_get(state.params)], []
    for i in range(5):
        state, m = setup.step_fn(state, sharding.global_batch(_batch(cfg, i), mesh))
        params.append(jax.device_get(state.params))
        rows.append({k: float(v) for k, v in m.items()})
    assert [r["stage"] for r in rows] == [1, 1, 1, 2, 2]
    for r in rows[:3]:  # the generator's MLM loss alone
        np.testing.assert_allclose(r["loss"], r["gen_loss"], rtol=1e-6)
    for r in rows[3:]:  # the discriminator's loss alone
        np.testing.assert_allclose(r["loss"], 50.0 * r["disc_loss"], rtol=1e-6)
    # The switch (the update from step 3) starts the discriminator from the generator: after
    # it, the two differ by one update (|update| < 5 x lr), where before they were independent.
    gen, disc = params[3]["generator"], params[3]["discriminator"]
    assert _max_difference(gen, disc) > 0.02
    assert _max_difference(gen, params[4]["discriminator"]) < 5 * cfg.train.learning_rate
    assert _max_difference(params[4]["discriminator"], params[5]["discriminator"]) > 0
    for key in two_stage.GENERATOR_ONLY:  # frozen from the switch on, weight decay too
        assert _max_difference(params[3][key], params[5][key]) == 0, key
    assert _max_difference(params[2]["generator"], params[3]["generator"]) > 0  # it learned


def test_adversarial_warms_up_by_maximum_likelihood_then_follows_the_policy_gradient():
    cfg = micro_config()
    cfg.model.num_layers = 1
    cfg.objective.name, cfg.objective.mle_warmup_steps = "adversarial", 2
    cfg.train.learning_rate = 1e-3
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh)
    state = program.init_on_mesh(setup)
    assert state.params["adversarial_baseline"]["kernel"].shape == (16, 1)  # generator width
    params, rows = [jax.device_get(state.params)], []
    for i in range(4):
        state, m = setup.step_fn(state, sharding.global_batch(_batch(cfg, i), mesh))
        params.append(jax.device_get(state.params))
        rows.append({k: float(v) for k, v in m.items()})
    assert [r["policy_gradient"] for r in rows] == [0, 0, 1, 1]
    for r in rows:
        assert all(np.isfinite(r[k]) for k in ("loss", "reward", "policy_loss", "baseline_loss"))
        generator = r["policy_loss"] if r["policy_gradient"] else r["gen_loss"]
        expected = generator + r["baseline_loss"] + 50.0 * r["disc_loss"]
        np.testing.assert_allclose(r["loss"], expected, rtol=1e-5)
        assert r["reward"] > 0
    # The baseline learns from the first update with a learning rate (step 2 on).
    baseline = [p["adversarial_baseline"] for p in params]
    assert _max_difference(baseline[2], baseline[4]) > 0
    # The baseline (16 weights and a bias) counts with the generator.
    from electra_jax.model.networks import network_param_counts

    without = {k: v for k, v in params[0].items() if k != "adversarial_baseline"}
    counts = [network_param_counts(p)["generator"] for p in (params[0], without)]
    assert counts[0] - counts[1] == 17


def test_the_adversarial_baseline_trains_its_own_weights_only():
    """The baseline's cross-entropy reaches its 1-unit head and nothing of the generator."""
    from electra_jax.model.networks import Electra, init_params, spec_from_config

    cfg = micro_config()
    cfg.model.num_layers = 1
    spec = spec_from_config(cfg.model, cfg.generator, 300, policy_baseline=True)
    model = Electra(spec)
    params = init_params(model, jax.random.PRNGKey(0))
    ids = jnp.asarray(_batch(cfg)["input_ids"][:2, :16])
    positions = jnp.array([[1, 2], [3, 4]])

    def baseline_sum(p):
        _, baseline = model.apply(
            {"params": p},
            ids,
            ids * 0,
            ids * 0 + 1,
            positions,
            method=Electra.generator_policy,
        )
        return jnp.sum(baseline)

    grads = jax.grad(baseline_sum)(params)
    moved = {k for k, g in grads.items() if any(np.any(x != 0) for x in jax.tree.leaves(g))}
    assert moved == {"adversarial_baseline"}


def test_the_temperature_schedule_and_the_fading_discriminator_mlm_term():
    """temperature_start/steps: the step samples at the scheduled temperature (logged; what a
    temperature does to sampling is tests/objectives/test_core.py's); disc_mlm_weight/steps: the
    loss is electra's plus the weight x the discriminator's MLM mean, the weight fading to 0."""
    cfg = micro_config()
    cfg.train.learning_rate = 1e-9  # the state barely moves: steps compare at the same weights
    cfg.objective.temperature_start = 5.0
    cfg.objective.temperature_steps = 4
    cfg.objective.disc_mlm_weight = 2.0
    cfg.objective.disc_mlm_steps = 4
    rows = run_steps(cfg, jax.devices()[:1], num_steps=6, same_batch=True)
    assert [r["temperature"] for r in rows] == [5.0, 4.0, 3.0, 2.0, 1.0, 1.0]
    assert [r["disc_mlm_weight"] for r in rows] == [2.0, 1.5, 1.0, 0.5, 0.0, 0.0]
    for r in rows:
        electra = r["gen_loss"] + 50.0 * r["disc_loss"]
        expected = electra + r["disc_mlm_weight"] * r["disc_mlm_loss"]
        assert r["loss"] == pytest.approx(expected, rel=1e-5)
        assert r["disc_mlm_loss"] == pytest.approx(np.log(cfg.data.vocab_size), rel=0.1)
    # The discriminator's MLM head exists only when asked for, and is counted.
    from electra_jax.pretraining import metrics

    spec, *_ = program.build(cfg, cfg.data.vocab_size)
    assert spec.mlm_head
    cfg.objective.disc_mlm_weight = 0.0
    plain, *_ = program.build(cfg, cfg.data.vocab_size)
    assert not plain.mlm_head
    count = lambda s: metrics.count_flops(s, 8, 32, 5, "electra")["total"]
    assert count(spec) > count(plain)


def test_the_unigram_floor_fills_its_share_of_the_slots_and_fades():
    """objective.unigram_share: the share of slots filled from the corpus's unigram distribution
    (here all its mass on piece 1, which the batch never holds: every such slot is replaced),
    fading to 0 over unigram_share_steps (logged); setup_step asks for the distribution."""
    cfg = micro_config()
    cfg.train.learning_rate = 1e-9
    cfg.objective.unigram_share, cfg.objective.unigram_share_steps = 1.0, 4
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    with pytest.raises(ValueError, match="unigram_cdf"):
        program.setup_step(cfg, cfg.data.vocab_size, mesh)
    only_1 = np.zeros((cfg.data.vocab_size,), np.float32)
    only_1[1:] = 1.0
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh, unigram_cdf=only_1)
    rows = run_steps(cfg, jax.devices()[:1], num_steps=6, setup=setup, same_batch=True)
    assert [r["unigram_share"] for r in rows] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    # At share 1 every slot gets piece 1; from share 0 on, the generator's samples, some of
    # which equal the original (labelled real).
    assert rows[0]["replaced_fraction"] == rows[0]["masked_fraction"]
    cfg.objective.unigram_share_steps = 0  # constant
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh, unigram_cdf=only_1)
    rows = run_steps(cfg, jax.devices()[:1], num_steps=3, setup=setup)
    assert all(r["replaced_fraction"] == r["masked_fraction"] for r in rows)
    assert "unigram_share" not in rows[0]  # a constant is not logged


def test_rtd_prior_init_starts_the_head_at_the_priors_logit():
    """train.rtd_prior_init: the replaced-token head's bias starts at logit(mask_prob), so the
    first step's discriminator loss is about the prior's entropy, not ln 2."""
    cfg = micro_config()
    cfg.train.rtd_prior_init = True
    p = cfg.objective.mask_prob
    assert program.rtd_prior_bias(cfg) == pytest.approx(np.log(p / (1 - p)))
    first = run_steps(cfg, jax.devices()[:1], num_steps=1)[0]
    prior = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert abs(first["disc_loss"] - prior) < 0.1 and first["disc_loss"] < 0.55
    cfg.train.rtd_prior_init = False
    assert program.rtd_prior_bias(cfg) == 0.0
    assert run_steps(cfg, jax.devices()[:1], num_steps=1)[0]["disc_loss"] > 0.6  # about ln 2


@pytest.mark.parametrize("rtd_prior_init", [False, True])
def test_the_abstract_state_is_the_initial_states_shapes(rtd_prior_init, monkeypatch):
    # setup_step lays the state out from shapes it traces once (networks.abstract_params, then
    # the optimizer's init on them): they must be those of the state init_state makes.
    cfg = micro_config()
    cfg.train.rtd_prior_init = rtd_prior_init
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    traced = []
    boxed = networks._boxed_params
    monkeypatch.setattr(networks, "_boxed_params", lambda *a: traced.append(1) or boxed(*a))
    monkeypatch.setattr(program, "_SETUPS", collections.OrderedDict())  # a setup made anew
    setup = program.setup_step(cfg, cfg.data.vocab_size, mesh)
    assert len(traced) == 1  # the model's init, traced once for shapes and axis names alike
    made = jax.eval_shape(setup.make_state)
    assert jax.tree_util.tree_structure(setup.abstract_state) == jax.tree_util.tree_structure(made)
    for got, want in zip(
        jax.tree_util.tree_leaves(setup.abstract_state),
        jax.tree_util.tree_leaves(made),
        strict=True,
    ):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    # Every parameter got its sharding from the names that init_params' tree carries.
    assert jax.tree_util.tree_structure(
        setup.state_sharding.params
    ) == jax.tree_util.tree_structure(made.params)
