"""Checks a config before any work starts; each failure is one line naming the key and the fix.

Each key's own rule (kind, range, float32 range, choices) is declared with the key, in
config/pretrain_keys.py, and checked by schema.check_values; here are the rules that join keys
(two_stage's shapes, the evaluation batch against the held-out rows, cudnn's dtype, a schedule
against train.num_steps), the objectives' registry, and what a path or URI may be.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from electra_jax.config import groups, pretrain_keys, schema
from electra_jax.data import mixture, sources
from electra_jax.errors import ConfigError, DataError
from electra_jax.objectives.catalog import OBJECTIVES
from electra_jax.store import paths


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_two_stage(config: Any) -> None:
    """The switch step is inside the run, and the generator has the discriminator's shape (the
    second stage starts the discriminator from the generator's weights)."""
    m, g, t, o = config.model, config.generator, config.train, config.objective
    switch = o.two_stage_steps
    _require(
        isinstance(switch, int) and not isinstance(switch, bool) and 0 < switch < t.num_steps,
        f"objective.two_stage_steps={switch!r} must be a whole number of generator-only steps "
        f"from 1 to train.num_steps - 1 = {t.num_steps - 1} (the paper: half the steps)",
    )
    width = round(m.hidden_size * g.hidden_fraction)
    same = (
        width == m.hidden_size
        and round(m.num_layers * g.layers_fraction) == m.num_layers
        and max(1, width // 64) == m.num_heads
        and 4 * width == m.intermediate_size
    )
    _require(
        same,
        "objective.name='two_stage' starts the discriminator from the generator's weights, so the "
        "two must be the same size: set generator.hidden_fraction=1.0 and "
        "generator.layers_fraction=1.0, with model.num_heads = hidden_size // 64 (at least 1) and "
        "model.intermediate_size = 4 x hidden_size, as the generator's are",
    )
    _require(
        m.embedding_sharing == "electra",
        f"objective.name='two_stage' needs model.embedding_sharing='electra' (one shared block), "
        f"not {m.embedding_sharing!r}",
    )


def check_config(config: Any) -> None:
    """Raises ConfigError for sizes and values that cannot train: each key's own rule first
    (schema.check_values over pretrain_keys.KEYS), then the rules between keys."""
    schema.check_values(config, pretrain_keys.KEYS)
    m, g, d, t, o = config.model, config.generator, config.data, config.train, config.objective
    _require(
        m.hidden_size % m.num_heads == 0,
        f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
        "pick a head count that divides the width",
    )
    width = round(m.hidden_size * g.hidden_fraction)
    _require(
        width >= 1,
        f"generator.hidden_fraction={g.hidden_fraction} makes a generator {width} wide; "
        "it needs at least one unit",
    )
    heads = max(1, width // 64)
    _require(
        width % heads == 0,
        f"generator.hidden_fraction={g.hidden_fraction} gives width {width}, not divisible by "
        f"its {heads} heads of 64; choose a fraction giving a multiple of 64 or a width < 128",
    )
    _require(
        8 <= d.seq_length <= m.max_position_embeddings,
        f"data.seq_length={d.seq_length} must be between 8 and "
        f"model.max_position_embeddings={m.max_position_embeddings}",
    )
    _require(
        t.grad_accum_steps >= 1 and t.batch_size % t.grad_accum_steps == 0,
        f"train.grad_accum_steps={t.grad_accum_steps} must be >= 1 and divide "
        f"train.batch_size={t.batch_size}",
    )
    _check_recipe(config)
    _require(  # a trace that would start past the end was silently never taken
        config.log.profile_steps <= t.num_steps,
        f"log.profile_steps={config.log.profile_steps} is past the run's end "
        f"(train.num_steps={t.num_steps}): no step of it would be traced; name a step up to "
        f"{t.num_steps}, or 0 for no trace",
    )
    _require(
        o.name in OBJECTIVES,
        f"objective.name={o.name!r} is not an objective; use one of {', '.join(OBJECTIVES)}",
    )
    if o.name == "two_stage":
        _check_two_stage(config)
    warm = o.mle_warmup_steps  # a whole number >= 0 by its own rule
    _require(
        warm < t.num_steps,
        f"objective.mle_warmup_steps={warm!r} must be a whole number of steps from 0 to "
        f"train.num_steps - 1 = {t.num_steps - 1}",
    )
    # Read and written through the path layer (paths.py), which writes gs:// directly.
    for key in pretrain_keys.KEYS:
        if key.path:
            section, field = key.name.split(".")
            value = config[section][field]
            why = paths.unwritable(str(value), read=True)
            _require(not why, f"{key.name}={value} {why}")
    _check_keep_every(config.checkpoint)
    _check_wandb(config.log.wandb_project)
    _check_license(config.export.license)
    _check_eval(config)
    _check_float32(config)
    _require(
        config.mesh.fsdp == -1 or config.mesh.fsdp >= 1,
        f"mesh.fsdp={config.mesh.fsdp} must be >= 1, or -1 for all devices",
    )
    _check_attention(config.model)
    _check_source(d.source)
    mixture.check(d)
    _require(
        not (d.cache_dir and os.path.exists(d.cache_dir) and not os.path.isdir(d.cache_dir)),
        f"data.cache_dir={d.cache_dir} is a file, not a folder; choose a folder (or '' for "
        "WORKDIR/data)",
    )
    compile_cache = config.compile.cache_dir
    _require(
        not (compile_cache and os.path.exists(compile_cache) and not os.path.isdir(compile_cache)),
        f"compile.cache_dir={compile_cache} is a file, not a folder; choose a folder ('' for "
        "the default, 'off' for none)",
    )


def _check_license(license_id: str) -> None:
    """export.license: '' or an id of the form the Hub's `license:` metadata takes, so that a
    card never carries a value the Hub cannot read ('Apache 2.0')."""
    _require(
        license_id == "" or re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license_id) is not None,
        f"export.license={license_id!r} is not a Hugging Face Hub license id; use one such as "
        "'apache-2.0', 'mit' or 'cc-by-4.0' (lowercase, no spaces; 'other' for another), or '' "
        "to state none",
    )


def _check_recipe(config: Any) -> None:
    """The sampling temperature and its schedule, and the discriminator's MLM term."""
    o, t = config.objective, config.train
    lo, hi = pretrain_keys.TEMPERATURE
    # The step counts are whole numbers >= 0 by their own rules (pretrain_keys.py).
    start, steps = o.temperature_start, o.temperature_steps
    if steps:
        _require(
            lo <= start <= hi,
            f"objective.temperature_steps={steps} schedules the temperature from "
            f"objective.temperature_start={start}, which must be in [{lo}, {hi}]",
        )
    else:
        _require(
            start == 0,
            f"objective.temperature_start={start} needs objective.temperature_steps > 0 (the "
            "steps it comes down over); set both, or leave temperature_start at 0",
        )
    weight, fade = o.disc_mlm_weight, o.disc_mlm_steps
    _require(
        not weight or o.name in ("electra", "electra_mlm"),
        f"objective.disc_mlm_weight={weight} adds the discriminator's MLM term to 'electra' "
        f"and 'electra_mlm' only, and objective.name={o.name!r}; set it to 0",
    )
    _require(
        weight or o.name != "electra_mlm",
        "objective.name='electra_mlm' weights its MLM pass by objective.disc_mlm_weight, which "
        "is 0; set it above 0 (1 gives it the generator's weight)",
    )
    _require(
        steps <= t.num_steps and fade <= t.num_steps,
        f"objective.temperature_steps={steps} and objective.disc_mlm_steps={fade} must not "
        f"exceed train.num_steps={t.num_steps}",
    )
    share, share_steps = o.unigram_share, o.unigram_share_steps
    _require(
        share_steps <= t.num_steps,
        f"objective.unigram_share_steps={share_steps!r} must be a whole number in [0, "
        f"train.num_steps={t.num_steps}]",
    )
    _require(
        not share_steps or share > 0,
        f"objective.unigram_share_steps={share_steps} fades objective.unigram_share, which is "
        "0; set the share too, or leave the steps at 0",
    )
    _require(
        not share or o.name == "electra",
        f"objective.unigram_share={share} fills the slots of 'electra' only, and "
        f"objective.name={o.name!r}; set it to 0",
    )


def _check_eval(config: Any) -> None:
    """The held-out slice and the evaluation's cadence."""
    held = config.data.heldout_examples  # both whole numbers >= 0 by their own rules
    ev = config.eval
    every = ev.every_steps
    batch = ev.batch_size or config.train.batch_size
    _require(
        isinstance(batch, int) and batch > 0,
        f"eval.batch_size={ev.batch_size!r} must be >= 1, or 0 for train.batch_size",
    )
    if not every:
        return
    _require(
        held >= batch and held % batch == 0,
        f"eval.every_steps={every} evaluates on the held-out rows, but data.heldout_examples="
        f"{held} is not a positive multiple of the evaluation batch ({batch}, eval.batch_size "
        "or train.batch_size); set data.heldout_examples to one, or eval.every_steps=0",
    )


def _check_keep_every(checkpoint_cfg: Any) -> None:
    """checkpoint.keep_every_steps: 0 (off) or a multiple of checkpoint.every_steps, since only
    saved steps can be kept."""
    every, save = checkpoint_cfg.keep_every_steps, checkpoint_cfg.every_steps  # whole, >= 0
    _require(
        every % save == 0,
        f"checkpoint.keep_every_steps={every} is not a multiple of checkpoint.every_steps="
        f"{save}, so most of the steps it names are never saved; use a multiple such as "
        f"{save * max(1, round(every / save))}",
    )


def _check_float32(config: Any) -> None:
    """The learning rates derived from train.learning_rate (the generator's, the weight decay's
    factor), held to train.learning_rate's float32 range."""
    t = config.train
    lr, scale = t.learning_rate, t.generator_lr_scale
    low, high = groups.LEARNING_RATE
    _require(
        low <= lr * scale <= high,
        f"train.generator_lr_scale={scale} gives the generator a learning rate of "
        f"{lr * scale:g}, outside [{low:g}, {high:g}] as train.learning_rate must be",
    )
    decay = t.weight_decay
    _require(
        lr * decay < 1,
        f"train.weight_decay={decay} x train.learning_rate={lr} = {lr * decay:g}: AdamW "
        "multiplies every weight by (1 - that) each step, so from 1 on it zeroes or flips them; "
        "lower train.weight_decay",
    )


def _check_attention(m: Any) -> None:
    """The fused kernels ('xla', 'cudnn') against the dropout and dtype, and cudnn's GPU."""
    attention = m.attention
    if attention in ("xla", "cudnn"):
        _require(
            m.attention_dropout_rate == 0,
            f"model.attention={attention!r} has no dropout on the attention probabilities, but "
            f"model.attention_dropout_rate={m.attention_dropout_rate}; set it to 0 or use "
            "model.attention='einsum'",
        )
    if attention == "cudnn":
        # Checked here rather than where jax raises NotImplementedError deep in tracing, after
        # the data is prepared; and before the backend, so that a CPU can check it too.
        _require(
            m.dtype == "bfloat16",
            f"model.attention='cudnn' computes in 16 bits and model.dtype={m.dtype!r}; set "
            "model.dtype='bfloat16' or use model.attention='einsum' (or 'xla')",
        )
        # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
        import jax

        backend = jax.default_backend()
        _require(
            backend == "gpu",
            f"model.attention='cudnn' needs an NVIDIA GPU, and this machine's backend is "
            f"{backend}; use model.attention='einsum' (or 'xla')",
        )


def _check_wandb(project: str) -> None:
    """A `log.wandb_project` needs wandb installed (the optional [wandb] extra)."""
    _require(
        not project or importlib.util.find_spec("wandb") is not None,
        f"log.wandb_project={project!r} needs wandb: pip install -e '.[wandb]' (or set "
        "log.wandb_project='' to log to metrics.jsonl and TensorBoard only)",
    )


def _check_source(source: str) -> None:
    """The form of data.source, as sources.parse reads it (whether its files exist is checked
    when the data is read)."""
    try:
        sources.parse(str(source))
    except DataError as e:
        raise ConfigError(str(e)) from None


def warmup_warning(train_cfg: Any) -> str | None:
    """A line when the warm-up is so long against the run that the peak learning rate is never
    reached: the paper configs keep 10,000 warm-up steps, so a 3,500-step run of configs/small.py
    would train at 9% of its learning rate at most, without a word."""
    warmup, num_steps = train_cfg.warmup_steps, train_cfg.num_steps
    if warmup < num_steps / 2:
        return None
    # Warm-up multiplies into the linear decay: lr(t) = peak * t / w * (1 - t / N), whose largest
    # value for w >= N / 2 is peak * N / (4 w), at t = N / 2.
    return (
        f"train.warmup_steps={warmup} is at least half of train.num_steps={num_steps}, so the "
        f"learning rate peaks at {num_steps / (4 * warmup):.0%} of train.learning_rate; lower "
        "train.warmup_steps for a run this short"
    )


def check_batch(
    batch_size: int, data_parallel: int, process_count: int, grad_accum_steps: int = 1
) -> None:
    """Raises ConfigError when the global batch does not split evenly over devices and hosts
    (every micro-batch of an accumulated batch too)."""
    _require(
        batch_size % data_parallel == 0,
        f"train.batch_size={batch_size} is not divisible by the {data_parallel} data-parallel "
        "devices; use a multiple of that",
    )
    _require(
        batch_size % (data_parallel * grad_accum_steps) == 0,
        f"train.batch_size={batch_size} / train.grad_accum_steps={grad_accum_steps} micro-batches "
        f"do not split over the {data_parallel} data-parallel devices; use a batch that is a "
        f"multiple of {data_parallel * grad_accum_steps}",
    )
    _require(
        batch_size % process_count == 0,
        f"train.batch_size={batch_size} is not divisible by the {process_count} processes",
    )
