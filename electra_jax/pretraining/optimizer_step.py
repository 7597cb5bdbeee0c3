"""One optimizer step of ELECTRA pre-training, compiled once: train_step(state, batch)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from electra_jax.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from electra_jax.model.networks import Electra, init_params
from electra_jax.model.optim import TrainState
from electra_jax.objectives import registry
from electra_jax.objectives.core import Networks, schedule_value, with_unigram_floor
from electra_jax.pretraining import eval_pass


class SpecialTokens(NamedTuple):
    """The ids masking must know: never masked (all four), and what [MASK] writes."""

    pad: int
    cls: int
    sep: int
    mask: int


# Our SentencePiece models' ids: only for steps that see no tokenizer's rows (random ids in
# dry_run and the step benchmarks). A run takes its tokenizer's (special_tokens_of) at every use.
DEFAULT_SPECIAL = SpecialTokens(PAD_ID, CLS_ID, SEP_ID, MASK_ID)


def special_tokens_of(tokenizer) -> SpecialTokens:
    """A tokenizer's special ids (BERT's WordPiece vocab has them at 0, 101, 102, 103)."""
    return SpecialTokens(tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)


# The replaced-token head's 1-unit output layer (its bias is the logit every token starts at).
RTD_OUTPUT = "discriminator_predictions_dense_prediction"


def init_state(
    model: Electra, tx: optax.GradientTransformation, seed: int, rtd_bias: float = 0.0
) -> TrainState:
    """Parameters, optimizer state and keys from one seed (jit it with out_shardings).

    rtd_bias: the replaced-token head's starting bias (train.rtd_prior_init sets it to the
    prior's logit; 0, the original's zero initialisation, leaves the parameters as drawn).
    """
    init_rng, step_rng = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(model, init_rng)
    if rtd_bias:
        head = dict(params[RTD_OUTPUT])
        head["bias"] = jnp.full_like(head["bias"], rtd_bias)
        params = {**params, RTD_OUTPUT: head}
    return _fresh_state(params, tx, step_rng)


def _fresh_state(params, tx: optax.GradientTransformation, rng) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng
    )


def abstract_state(params, tx: optax.GradientTransformation) -> TrainState:
    """init_state's tree as shapes, from the parameters' (networks.abstract_params): the
    optimizer's init traced, not the model's once more."""
    return jax.eval_shape(lambda p: _fresh_state(p, tx, jax.random.PRNGKey(0)), params)


def _networks(params, batch, *, model: Electra, train: bool) -> Networks:
    """The networks as functions of ids, closing over params, segments and padding mask: the
    generator, the discriminator and (when the model has the head) the discriminator-sized
    network with both heads."""
    seg, mask = batch["segment_ids"], batch["input_mask"]
    det = not train

    # With a learned baseline (the adversarial objective) the generator is a policy and also
    # returns its baseline's logits (Electra.generator_policy).
    generator = Electra.generator_policy if model.spec.policy_baseline else Electra.generator_logits

    def generator_fn(ids, positions, key):
        return model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            positions,
            det,
            rngs={"dropout": key},
            method=generator,
        )

    def discriminator_fn(ids, key):
        return model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            det,
            rngs={"dropout": key},
            method=Electra.discriminator_logits,
        )

    def mlm_fn(ids, positions, key):
        return model.apply(
            {"params": params},
            ids,
            seg,
            mask,
            positions,
            det,
            rngs={"dropout": key},
            method=Electra.discriminator_mlm,
        )

    return Networks(generator_fn, discriminator_fn, mlm_fn if model.spec.mlm_head else None)


def micro_batches(tree, k: int):
    """[B, ...] leaves -> [k, B / k, ...]: micro-batch i takes rows i, i + k, i + 2k, ...

    Strided rather than contiguous so that every micro-batch is spread over all the devices the
    batch is split over (a contiguous block would live on 1/k of them).
    """
    return jax.tree_util.tree_map(
        lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1), tree
    )


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    model: Electra,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    objective_cfg: Any,
    num_slots: int,
    grad_accum_steps: int = 1,
    special: SpecialTokens = DEFAULT_SPECIAL,
    unigram_cdf: jax.Array | None = None,
):
    """One update of generator and discriminator together.

    batch: 'input_ids', 'segment_ids', 'input_mask', each [B, L] int32 (global arrays).
    Returns (new state, metrics dict of float32 scalars).

    With grad_accum_steps k > 1 the batch runs as k micro-batches of B / k rows in a scan that
    sums their gradients: activation memory of B / k rows, the update of B rows. Masking and the
    sampler's draws are made for the whole batch first and each micro-batch's loss is divided by
    the whole batch's counts, so the update equals the full batch's (up to float rounding and
    dropout, whose masks are drawn per micro-batch).

    unigram_cdf: float32 [V], the corpus's cumulative unigram distribution, for
    objective.unigram_share > 0 (a share of the slots filled from it instead of the generator).
    """
    objective = registry.of_config(objective_cfg)
    weights = {"gen_weight": objective_cfg.gen_weight, "disc_weight": objective_cfg.disc_weight}
    # What the objective changes with the step (two_stage's switch, adversarial's warm start,
    # the discriminator's fading MLM term): plain Python values when nothing does.
    plan = objective.begin_step(objective_cfg, state.step, state.params, weights)
    params, weights = plan.params, plan.weights
    # The recipe's temperature schedule (configs/tiny.py): a Python float, leaving the step as
    # it was, when it is off.
    temperature = schedule_value(
        objective_cfg.temperature,
        objective_cfg.temperature_start,
        objective_cfg.temperature_steps,
        state.step,
    )
    rng = jax.random.fold_in(state.rng, state.step)
    k_corrupt, k_gen, k_sample, k_disc = jax.random.split(rng, 4)
    corruption = objective.corrupt(
        k_corrupt,
        batch,
        mask_prob=objective_cfg.mask_prob,
        num_slots=num_slots,
        mask_id=special.mask,
        special_ids=tuple(special),
        mask_token_prob=objective_cfg.mask_token_prob,
        vocab_size=model.spec.vocab_size,
    )
    # The recipe's unigram floor: a share of the slots, constant or fading to 0 over
    # unigram_share_steps. Off (0, the paper's) it leaves the step and its keys untouched.
    unigram_share = objective_cfg.unigram_share
    if objective_cfg.unigram_share_steps:
        unigram_share = schedule_value(
            0.0, unigram_share, objective_cfg.unigram_share_steps, state.step
        )
    if objective_cfg.unigram_share > 0:
        if unigram_cdf is None:
            raise ValueError("objective.unigram_share > 0 needs the corpus's unigram_cdf")
        corruption = with_unigram_floor(
            corruption,
            jax.random.fold_in(k_corrupt, 1),
            unigram_cdf,
            unigram_share,
            model.spec.vocab_size,
        )
    denominators = (
        jnp.sum(corruption.masked.weights),
        jnp.sum(batch["input_mask"] > 0).astype(jnp.float32),
    )

    def grads_and_sums(part, part_corruption, keys):
        def loss_fn(params):
            networks = _networks(params, part, model=model, train=True)
            sums = objective.sums(
                part,
                part_corruption,
                networks,
                keys,
                temperature=temperature,
                sampler=objective_cfg.sampler,
            )
            return objective.loss(sums, denominators, **weights), sums

        return jax.grad(loss_fn, has_aux=True)(params)

    keys = (k_gen, k_sample, k_disc)
    if grad_accum_steps == 1:
        grads, sums = grads_and_sums(batch, corruption, keys)
    else:

        def accumulate(total, xs):
            i, part, part_corruption = xs
            micro_keys = tuple(jax.random.fold_in(k, i) for k in keys)
            result = grads_and_sums(part, part_corruption, micro_keys)
            return jax.tree_util.tree_map(jnp.add, total, result), None

        parts = micro_batches((batch, corruption), grad_accum_steps)
        first = jax.tree_util.tree_map(lambda x: x[0], parts)
        shapes = jax.eval_shape(grads_and_sums, *first, keys)
        zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        xs = (jnp.arange(grad_accum_steps), *parts)
        (grads, sums), _ = jax.lax.scan(accumulate, zeros, xs)

    updates, opt_state = tx.update(grads, state.opt_state, params)
    params = optax.apply_updates(params, plan.updates(updates))
    metrics = {**objective.metrics(sums, **weights), **plan.metrics}
    if not isinstance(temperature, float | int):
        metrics["temperature"] = temperature
    if not isinstance(unigram_share, float | int):
        metrics["unigram_share"] = unigram_share
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def guarded_train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    nan_policy: str = "stop",
    debug_nan_at_step: int = -1,
    **step_kwargs,
):
    """train_step with a guard against non-finite updates, inside the same compiled program.

    Adds metrics["nonfinite"] (float32 1.0 when the loss or the gradient norm is NaN/Inf, else
    0.0). nan_policy 'skip' keeps the previous params and optimizer state for such a step while
    still advancing `step` (so the next step draws the next random stream and batch); 'stop'
    returns the update as computed and leaves stopping to the loop, which never saves it.
    debug_nan_at_step is a test hook: the update made from state.step == that value is
    poisoned as NaN gradients would poison it (loss, grad norm and new params NaN); -1 is off.
    """
    new_state, metrics = train_step(state, batch, **step_kwargs)
    metrics = dict(metrics)
    if debug_nan_at_step >= 0:
        poison = state.step == debug_nan_at_step
        nan_if = lambda x: (
            jnp.where(poison, jnp.nan, x) if jnp.issubdtype(x.dtype, jnp.inexact) else x
        )
        new_state = new_state.replace(params=jax.tree_util.tree_map(nan_if, new_state.params))
        metrics["loss"] = nan_if(metrics["loss"])
        metrics["grad_norm"] = nan_if(metrics["grad_norm"])
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    if nan_policy == "skip":
        keep = lambda new, old: jnp.where(finite, new, old)
        new_state = new_state.replace(
            params=jax.tree_util.tree_map(keep, new_state.params, state.params),
            opt_state=jax.tree_util.tree_map(keep, new_state.opt_state, state.opt_state),
        )
    metrics["nonfinite"] = 1.0 - finite.astype(jnp.float32)
    return new_state, metrics


def multi_step(state: TrainState, batches: dict[str, jax.Array], *, step_fn):
    """K optimizer steps in one compiled program: `step_fn` (state, batch) scanned over batches.

    batches: dicts of [K, B, L] arrays, batch k of the K consecutive steps at index k. Returns
    the state after the K-th step and each step's metrics stacked to [K]. XLA allocates a
    program's temporaries afresh at every execution (on XLA:CPU each one a fresh `mmap`, so
    every activation byte is page-faulted in again); one execution for K steps pays that, and
    the host's dispatch, once. The steps are those of K single calls
    (tests/pretraining/test_runner.py).
    """
    return jax.lax.scan(step_fn, state, batches)


def eval_step(
    params,
    batches: dict[str, jax.Array],
    frequent: jax.Array,
    unigram_cdf: jax.Array | None = None,
    *,
    model: Electra,
    objective_cfg: Any,
    num_slots: int,
    special: SpecialTokens = DEFAULT_SPECIAL,
) -> dict[str, jax.Array]:
    """The held-out scalars of `params` (eval_pass.py), without dropout or update.

    batches: 'input_ids', 'segment_ids', 'input_mask', each [E, B, L] int32 (E held-out
    batches); frequent: bool [V], the frequent pieces; unigram_cdf: float32 [V], the corpus's
    cumulative unigram distribution (None: no `disc_auc_unigram`). Returns float32 scalars (NaN
    where an AUC is undefined).
    """
    objective = registry.of_config(objective_cfg)

    def networks_of(batch):
        seg, mask = batch["segment_ids"], batch["input_mask"]
        run = lambda method, *args: model.apply({"params": params}, *args, method=method)
        networks = {
            "discriminator": lambda ids: run(Electra.discriminator_outputs, ids, seg, mask, True)
        }
        if objective.has_generator:
            networks["generator"] = lambda ids, positions: run(
                Electra.generator_logits, ids, seg, mask, positions, True
            )
        if model.spec.mlm_head:
            networks["mlm"] = lambda ids, positions: run(
                Electra.discriminator_mlm, ids, seg, mask, positions, True
            )
        return networks

    return eval_pass.evaluate_batches(
        batches,
        frequent,
        networks_of,
        unigram_cdf,
        objective=objective,
        mask_prob=objective_cfg.mask_prob,
        num_slots=num_slots,
        mask_id=special.mask,
        special_ids=tuple(special),
        mask_token_prob=objective_cfg.mask_token_prob,
        vocab_size=model.spec.vocab_size,
    )
