"""The learning-rate schedule and the optimizer, as the original ELECTRA had them.

AdamW with b1 0.9, b2 0.999, eps 1e-6 and no bias correction (the original's
AdamWeightDecayOptimizer never had it); decoupled weight decay 0.01, scaled by the learning rate,
on kernels and embedding tables only (never LayerNorm parameters or biases); global-norm clipping
at 1.0 first; lr = peak x min(1, step / warmup) x (1 - step / num_steps).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.model.networks import LAYERS


@flax.struct.dataclass
class TrainState:
    """What one optimizer step updates, for pre-training and fine-tuning alike."""

    step: jax.Array  # int32 scalar: optimizer updates done
    params: Any
    opt_state: Any
    rng: jax.Array  # uint32[2]: the run's base key; step k uses fold_in(rng, k)


def learning_rate_schedule(peak: float, warmup_steps: int, num_steps: int) -> optax.Schedule:
    """Linear warm-up multiplied into linear decay to zero at num_steps."""
    warmup = optax.linear_schedule(0.0, 1.0, max(1, warmup_steps))
    decay = optax.linear_schedule(peak, 0.0, num_steps)
    if warmup_steps <= 0:
        return decay
    return lambda step: warmup(step) * decay(step)


class ScaleByAdamNoBiasState(NamedTuple):
    mu: optax.Updates
    nu: optax.Updates


def scale_by_adam_without_bias_correction(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6
) -> optax.GradientTransformation:
    """m / (sqrt(v) + eps) with raw moment estimates.

    optax.scale_by_adam always bias-corrects; the original ELECTRA (and BERT) optimizer does not,
    which damps the first updates and is part of what the published hyperparameters assume.
    """

    def init_fn(params):
        zeros = optax.tree.zeros_like(params)
        return ScaleByAdamNoBiasState(mu=zeros, nu=optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        updates = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, ScaleByAdamNoBiasState(mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def decay_mask(params: Any) -> Any:
    """True for matrices and embedding tables; False for LayerNorm scales/biases and all biases.

    Matrices are every parameter named `kernel` or `*_kernel` (the attention's fused
    `qkv_kernel` and `output_kernel`) and tables every `embedding`.
    """

    def is_decayed(path, _):
        name = getattr(path[-1], "key", str(path[-1]))
        return name.endswith("kernel") or name == "embedding"

    return jax.tree_util.tree_map_with_path(is_decayed, params)


def is_generator_param(name: str) -> bool:
    """Whether a top-level parameter subtree belongs to the generator alone: its encoder, its
    own embeddings (embedding_sharing 'none'), its MLM head and bias, the adversarial
    objective's baseline. The shared embeddings ('electra') belong to both networks."""
    return name.startswith("generator") or name == "adversarial_baseline"


def scale_generator_updates(scale: float) -> optax.GradientTransformation:
    """Multiplies the generator's updates by `scale` (a learning rate `scale` times the
    discriminator's, weight decay included); the other parameters' updates are unchanged."""

    def update_fn(updates, state, params=None):
        del params
        return {
            k: jax.tree_util.tree_map(lambda u: u * scale, v) if is_generator_param(k) else v
            for k, v in updates.items()
        }, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(train_cfg: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax chain for pre-training from the `train` config section."""
    schedule = learning_rate_schedule(
        train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.num_steps
    )
    b1, b2, eps = train_cfg.adam_b1, train_cfg.adam_b2, train_cfg.adam_eps
    # Without bias correction the first ~1/(1 - b2) updates are up to 3-6x larger than Adam's;
    # the paper's 10K warm-up absorbs that, a run of a few hundred steps does not.
    if train_cfg.adam_bias_correction:
        adam = optax.scale_by_adam(b1, b2, eps)
    else:
        adam = scale_by_adam_without_bias_correction(b1, b2, eps)
    parts = [
        optax.clip_by_global_norm(train_cfg.clip_norm),
        adam,
        optax.add_decayed_weights(train_cfg.weight_decay, mask=decay_mask),
        optax.scale_by_learning_rate(schedule),
    ]
    scale = train_cfg.generator_lr_scale
    if scale != 1.0:  # left out at 1, so that the optimizer state's tree stays the paper's
        parts.append(scale_generator_updates(scale))
    return optax.chain(*parts), schedule


def layerwise_lr_multipliers(
    params: Any, num_layers: int, decay: float, exponents: str = "electra_jax"
) -> Any:
    """Fine-tuning's layer-wise learning-rate decay: a float per parameter, the same tree.

    With N = num_layers and exponents 'electra_jax': the task head (anything outside the encoder)
    gets 1; discriminator layer i (0-based) gets decay^(N - i), so the top layer gets decay; the
    embeddings and the embedding projection get decay^(N + 1). Stacked layers (a `layers`
    subtree, leaves [N, ...]) get a float32 array [N, 1, ...] of their layers' factors.

    'original' reproduces the original ELECTRA code exactly (its model/optimization.py gives
    the embeddings depth 0, layer i depth i + 1 and the task head depth N + 2, each scaled by
    decay^(N + 2 - depth)): the head 1, layer i decay^(N + 1 - i), so the top layer decay^2, and
    the embeddings decay^(N + 2). That is one factor of decay too many under the head, a
    leftover of the pooler the original removed (google-research/electra issue #51); the
    published scores were made with it.
    """
    if exponents not in ("electra_jax", "original"):
        raise ValueError(f"exponents={exponents!r}; use 'electra_jax' or 'original'")
    extra = 1 if exponents == "original" else 0

    def multiplier(path, leaf):
        keys = [getattr(k, "key", str(k)) for k in path]
        if keys[0] == "embeddings" or "embeddings_project" in keys:
            return decay ** (num_layers + 1 + extra)
        if keys[0] == "discriminator" and LAYERS in keys:
            # Stacked layers [N, ...]: one multiplier per layer, broadcast over the rest.
            per_layer = decay ** (num_layers - np.arange(num_layers) + extra)
            return per_layer.astype(np.float32).reshape(-1, *([1] * (np.ndim(leaf) - 1)))
        if keys[0] == "discriminator":
            layer = next(int(k[len("layer_") :]) for k in keys if k.startswith("layer_"))
            return decay ** (num_layers - layer + extra)
        return 1.0

    return jax.tree_util.tree_map_with_path(multiplier, params)


def make_finetune_optimizer(
    learning_rate: float,
    num_steps: int,
    warmup_steps: int,
    multipliers: Any,
    *,
    weight_decay: float = 0.01,
    eps: float = 1e-6,
    clip_norm: float = 1.0,
    bias_correction: bool = False,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The pre-training chain with each parameter's step scaled by its layer-wise multiplier.

    The multiplier scales the whole step, weight decay included, as the original's per-layer
    learning rates did; `multipliers` is a tree like the parameters (layerwise_lr_multipliers).
    """
    schedule = learning_rate_schedule(learning_rate, warmup_steps, num_steps)
    if bias_correction:
        adam = optax.scale_by_adam(0.9, 0.999, eps)
    else:
        adam = scale_by_adam_without_bias_correction(0.9, 0.999, eps)
    per_layer = optax.stateless(
        lambda updates, params=None: jax.tree_util.tree_map(
            lambda u, m: u * jnp.asarray(m, u.dtype), updates, multipliers
        )
    )
    tx = optax.chain(
        optax.clip_by_global_norm(clip_norm),
        adam,
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.scale_by_learning_rate(schedule),
        per_layer,
    )
    return tx, schedule
