"""Tests of objectives/adversarial.py: the reward, REINFORCE, the baseline, the warm start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.objectives import adversarial, core


def _adversarial_setup(b=512, n=2, v=5, seed=0):
    """A policy with free logits [n, V] (shared by the rows) and a discriminator whose logit at
    a slot depends only on the token written there, so that the expected reward has a closed
    form: E[R] = sum_t sum_x p_t(x) R_t(x)."""
    length = n + 2
    ids = np.tile(np.arange(length, dtype=np.int32), (b, 1))  # slot t holds token t + 1
    batch = {"input_ids": jnp.asarray(ids), "input_mask": jnp.ones((b, length), jnp.int32)}
    positions = jnp.tile(jnp.arange(1, n + 1, dtype=jnp.int32), (b, 1))
    masked = core.Masked(batch["input_ids"], positions, positions, jnp.ones((b, n), jnp.float32))
    uniform = jax.random.uniform(jax.random.PRNGKey(seed), (b, n))
    corruption = core.Corruption(masked, uniform)
    score = jnp.linspace(-2.0, 2.0, v)  # the discriminator's logit for each token

    def discriminator_fn(corrupted, key):
        return score[jnp.clip(corrupted, 0, v - 1)]

    def policy_fn_of(logits, baseline_logits):
        return lambda ids, positions, key: (
            jnp.broadcast_to(logits, (b, n, v)),
            jnp.broadcast_to(baseline_logits, (b, n)),
        )

    return batch, corruption, discriminator_fn, policy_fn_of, score


def test_adversarial_reward_is_the_discriminators_loss_and_reinforce_is_unbiased():
    b, n, v = 4096, 2, 5
    batch, corruption, disc_fn, policy_fn_of, score = _adversarial_setup(b, n, v)
    logits = jnp.array([[0.5, -0.3, 0.2, 0.0, 1.0], [0.0, 0.4, -1.0, 0.3, 0.1]])
    baseline_logits = jnp.array([0.3, -0.2])
    keys = tuple(jax.random.split(jax.random.PRNGKey(1), 3))

    def sums(lg, bl):
        return adversarial.adversarial_sums(batch, corruption, policy_fn_of(lg, bl), disc_fn, keys)

    s = sums(logits, baseline_logits)
    # The reward at slot t is the discriminator's cross-entropy there: -log sigmoid(score) for a
    # replaced token, -log sigmoid(-score) for the original (slot t's original is token t + 1).
    p = jax.nn.softmax(logits, axis=-1)
    replaced_loss = -jax.nn.log_sigmoid(score)  # [V]
    original_loss = -jax.nn.log_sigmoid(-score)
    expected_r = []
    for t in range(n):
        r = replaced_loss.at[t + 1].set(original_loss[t + 1])
        expected_r.append(r)
    expected_r = jnp.stack(expected_r)  # [n, V]
    exact_mean_reward = float(jnp.sum(p * expected_r) / n)
    assert float(s["reward"]) / (b * n) == pytest.approx(exact_mean_reward, rel=0.03)

    # The REINFORCE surrogate's gradient (over many rows) estimates the gradient of the exact
    # expected reward; gradient descent on policy_loss ascends the reward.
    exact = jax.grad(lambda lg: jnp.sum(jax.nn.softmax(lg, -1) * expected_r))(logits)
    estimate = jax.grad(lambda lg: -sums(lg, baseline_logits)["policy_loss"] / b)(logits)
    np.testing.assert_allclose(estimate, exact, atol=0.03)
    assert float(jnp.max(jnp.abs(exact))) > 0.1  # a gradient worth estimating

    # The baseline (b = -log sigmoid(u)) is pulled towards the reward: its cross-entropy is
    # least where sigmoid(u) = E[exp(-R)], and the policy's gradient does not reach it.
    def baseline_loss(bl):
        return sums(logits, bl)["baseline_loss"] / b

    target = jnp.sum(p * jnp.exp(-expected_r), axis=-1)  # E[exp(-R)] per slot
    best = jnp.log(target / (1 - target))
    grad_at_best = jax.grad(baseline_loss)(best)
    np.testing.assert_allclose(grad_at_best, 0.0, atol=0.02)
    assert float(jnp.abs(jax.grad(baseline_loss)(best + 1.0)).min()) > 0.1
    np.testing.assert_array_equal(
        jax.grad(lambda bl: sums(logits, bl)["policy_loss"])(baseline_logits) != 0,
        [False, False],
    )


def test_adversarial_loss_switches_from_maximum_likelihood_to_the_policy_gradient():
    sums = {
        "gen_loss": jnp.float32(6.0),
        "policy_loss": jnp.float32(-2.0),
        "baseline_loss": jnp.float32(1.0),
        "disc_loss": jnp.float32(3.0),
    }
    denominators = (jnp.float32(2.0), jnp.float32(10.0))
    kw = {"gen_weight": 1.0, "disc_weight": 50.0}
    warm = adversarial.adversarial_loss(sums, denominators, adversarial=0.0, **kw)
    adv = adversarial.adversarial_loss(sums, denominators, adversarial=1.0, **kw)
    np.testing.assert_allclose(warm, (6.0 + 1.0) / 2 + 50 * 3.0 / 10)
    np.testing.assert_allclose(adv, (-2.0 + 1.0) / 2 + 50 * 3.0 / 10)
