"""Checks a config before any work starts; each failure is one line naming the key and the fix."""

from __future__ import annotations

import math
import os
import struct
from typing import Any

from electra_jax.objectives.catalog import OBJECTIVES
from electra_jax.store import paths


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""


class NonFiniteError(RuntimeError):
    """A run diverged: its loss, gradient norm or outputs became NaN/Inf. Raised by both runners
    (pre-training under train.nan_policy='stop', fine-tuning always), whose commands answer it
    with one line and exit 1; here beside ConfigError, in the one module both import."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_workdir(workdir: str, flag: str = "--workdir", create: bool = True) -> None:
    """ConfigError naming `workdir` when it cannot be one: a URI other than gs://, a file, a
    path that is not UTF-8; with `create`, also one that cannot be created or written.

    A gs://BUCKET/PATH workdir is written through the path layer (paths.py); other URIs are
    refused, since os.makedirs would quietly create a local ./s3:/... tree.
    """
    try:
        workdir.encode("utf-8")
    except UnicodeEncodeError:
        shown = workdir.encode("utf-8", "backslashreplace").decode("utf-8")
        raise ConfigError(
            f"{flag} {shown} is not valid UTF-8; use a path of UTF-8 characters"
        ) from None
    _require(not paths.unwritable(workdir), f"{flag} {workdir} {paths.unwritable(workdir)}")
    # In a bucket: a path, not an object; with `create`, a probe object is written and removed
    # (a missing bucket or package, or no access, is one line).
    try:
        with paths.remote_errors(workdir, flag):
            if paths.exists(workdir) and not paths.isdir(workdir):
                raise ConfigError(
                    f"{flag} {workdir} is a file, not a folder; choose another {flag}"
                )
            if create:
                paths.makedirs(workdir)
                probe = paths.join(workdir, f".write_test{os.getpid()}")
                paths.write_atomic(probe, "ok")
                paths.remove(probe)
    except ConfigError:
        raise
    except Exception as e:  # OSError; in a bucket a missing package, gcsfs's HTTP errors
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())[:200]
        raise ConfigError(
            f"{flag} {workdir} is not writable ({reason}); {paths.access_advice(workdir)}choose "
            f"another {flag}"
        ) from None


def _check_two_stage(config: Any) -> None:
    """The switch step is inside the run, and the generator has the discriminator's shape (the
    second stage starts the discriminator from the generator's weights)."""
    m, g, t, o = config.model, config.generator, config.train, config.objective
    switch = o.get("two_stage_steps", 0)
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
        m.get("embedding_sharing", "electra") == "electra",
        f"objective.name='two_stage' needs model.embedding_sharing='electra' (one shared block), "
        f"not {m.get('embedding_sharing')!r}",
    )


def check_config(config: Any) -> None:
    """Raises ConfigError for sizes and values that cannot train."""
    m, g, d, t, o = config.model, config.generator, config.data, config.train, config.objective
    _require(
        m.hidden_size > 0 and m.num_heads > 0, "model.hidden_size and model.num_heads must be > 0"
    )
    _require(
        m.hidden_size % m.num_heads == 0,
        f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
        "pick a head count that divides the width",
    )
    _require(m.num_layers > 0, f"model.num_layers={m.num_layers} must be >= 1")
    _require(m.embedding_size > 0, f"model.embedding_size={m.embedding_size} must be >= 1")
    _require(
        m.dtype in ("float32", "bfloat16"),
        f"model.dtype={m.dtype!r} is not supported; use 'float32' or 'bfloat16'",
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
    _require(d.vocab_size > 5, f"data.vocab_size={d.vocab_size} must exceed the 5 special pieces")
    _require(t.batch_size > 0, f"train.batch_size={t.batch_size} must be >= 1")
    _require(
        t.grad_accum_steps >= 1 and t.batch_size % t.grad_accum_steps == 0,
        f"train.grad_accum_steps={t.grad_accum_steps} must be >= 1 and divide "
        f"train.batch_size={t.batch_size}",
    )
    _require(t.num_steps > 0, f"train.num_steps={t.num_steps} must be >= 1")
    _require(t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be > 0")
    _require(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    _require(0 < o.mask_prob < 1, f"objective.mask_prob={o.mask_prob} must be in (0, 1)")
    _require(
        0 <= o.mask_token_prob <= 1,
        f"objective.mask_token_prob={o.mask_token_prob} must be in [0, 1]",
    )
    _check_recipe(config)
    _require(
        o.name in OBJECTIVES,
        f"objective.name={o.name!r} is not an objective; use one of {', '.join(OBJECTIVES)}",
    )
    if o.name == "two_stage":
        _check_two_stage(config)
    warm = o.get("mle_warmup_steps", 0)
    _require(
        isinstance(warm, int) and not isinstance(warm, bool) and 0 <= warm < t.num_steps,
        f"objective.mle_warmup_steps={warm!r} must be a whole number of steps from 0 to "
        f"train.num_steps - 1 = {t.num_steps - 1}",
    )
    sharing = m.get("embedding_sharing", "electra")
    _require(
        sharing in ("electra", "gdes", "none"),
        f"model.embedding_sharing={sharing!r} is not a mode; use 'electra', 'gdes' or 'none'",
    )
    _require(
        t.nan_policy in ("stop", "skip"),
        f"train.nan_policy={t.nan_policy!r} is not a policy; use 'stop' or 'skip'",
    )
    # Read and written through the path layer (paths.py), which writes gs:// directly.
    for key, value in (
        ("data.cache_dir", d.get("cache_dir", "")),
        ("train.init_from", t.get("init_from", "")),
        ("compile.cache_dir", _get(config, "compile.cache_dir") or ""),
    ):
        why = paths.unwritable(str(value), read=True)
        _require(not why, f"{key}={value} {why}")
    _require(config.checkpoint.every_steps > 0, "checkpoint.every_steps must be >= 1")
    _require(config.checkpoint.keep > 0, "checkpoint.keep must be >= 1")
    _check_keep_every(config.checkpoint)
    _require(config.log.every_steps > 0, "log.every_steps must be >= 1")
    _check_wandb(config.log.get("wandb_project", ""))
    k = t.get("steps_per_call", 1)
    _require(k >= 1, f"train.steps_per_call={k} must be >= 1")
    _check_eval(config)
    _check_ranges(config)
    _check_float32(config)
    _check_choices(config)
    _check_source(d.source)
    cache_dir = d.get("cache_dir", "")
    _require(
        not (cache_dir and os.path.exists(cache_dir) and not os.path.isdir(cache_dir)),
        f"data.cache_dir={cache_dir} is a file, not a folder; choose a folder (or '' for "
        "WORKDIR/data)",
    )
    compile_cache = _get(config, "compile.cache_dir") or ""
    _require(
        not (compile_cache and os.path.exists(compile_cache) and not os.path.isdir(compile_cache)),
        f"compile.cache_dir={compile_cache} is a file, not a folder; choose a folder ('' for "
        "the default, 'off' for none)",
    )


# Sampling divides float32 logits (|logit| up to ~1e3) by the temperature: below 1e-3 they
# overflow to inf and the softmax to NaN; above 1e3 every vocabulary is uniform anyway.
_TEMPERATURE = (1e-3, 1e3)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_recipe(config: Any) -> None:
    """The sampling temperature and its schedule, and the discriminator's MLM term."""
    o, t = config.objective, config.train
    lo, hi = _TEMPERATURE
    _require(
        lo <= o.temperature <= hi,
        f"objective.temperature={o.temperature} must be in [{lo}, {hi}] (float32 logits divided "
        "by it must stay finite)",
    )
    start, steps = o.get("temperature_start", 0.0), o.get("temperature_steps", 0)
    _require(_whole(steps), f"objective.temperature_steps={steps!r} must be a whole number >= 0")
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
    weight, fade = o.get("disc_mlm_weight", 0.0), o.get("disc_mlm_steps", 0)
    _require(
        isinstance(weight, int | float) and weight >= 0,
        f"objective.disc_mlm_weight={weight!r} must be >= 0",
    )
    _require(_whole(fade), f"objective.disc_mlm_steps={fade!r} must be a whole number >= 0")
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
    share, share_steps = o.get("unigram_share", 0.0), o.get("unigram_share_steps", 0)
    _require(
        isinstance(share, int | float) and not isinstance(share, bool) and 0 <= share <= 1,
        f"objective.unigram_share={share!r} must be in [0, 1] (the share of masked slots "
        "filled from the corpus's unigram distribution)",
    )
    _require(
        _whole(share_steps) and share_steps <= t.num_steps,
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
    """The held-out slice and the evaluation's cadence (configs written before they existed
    have neither: no held-out rows, no evaluation)."""
    held = config.data.get("heldout_examples", 0)
    _require(
        isinstance(held, int) and not isinstance(held, bool) and held >= 0,
        f"data.heldout_examples={held!r} must be a whole number of rows >= 0 (0: train on all)",
    )
    ev = config.get("eval")
    if ev is None:
        return
    every = ev.get("every_steps", 0)
    _require(
        isinstance(every, int) and not isinstance(every, bool) and every >= 0,
        f"eval.every_steps={every!r} must be a whole number of steps >= 0 (0: no evaluation)",
    )
    batch = ev.get("batch_size", 0) or config.train.batch_size
    _require(
        isinstance(batch, int) and batch > 0,
        f"eval.batch_size={ev.get('batch_size')!r} must be >= 1, or 0 for train.batch_size",
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
    every, save = checkpoint_cfg.get("keep_every_steps", 0), checkpoint_cfg.every_steps
    _require(
        isinstance(every, int) and not isinstance(every, bool) and every >= 0,
        f"checkpoint.keep_every_steps={every!r} must be a whole number of steps >= 0 (0 keeps "
        "only the newest checkpoint.keep)",
    )
    _require(
        every % save == 0,
        f"checkpoint.keep_every_steps={every} is not a multiple of checkpoint.every_steps="
        f"{save}, so most of the steps it names are never saved; use a multiple such as "
        f"{save * max(1, round(every / save))}",
    )


def _get(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return None
    return node


# (key, lowest, highest, lowest included, highest included); None: no bound on that side.
# Checked for keys present, so configs written before a key existed still validate.
_RANGES = (
    ("model.intermediate_size", 1, None, True, True),
    ("model.type_vocab_size", 1, None, True, True),
    ("model.max_position_embeddings", 8, None, True, True),
    ("model.dropout_rate", 0, 1, True, False),
    ("model.attention_dropout_rate", 0, 1, True, False),
    ("model.initializer_range", 0, None, False, True),
    ("model.layer_norm_eps", 0, None, False, True),
    ("generator.hidden_fraction", 0, None, False, True),
    ("generator.layers_fraction", 0, 1, False, True),
    ("data.single_segment_prob", 0, 1, True, True),
    ("data.short_seq_prob", 0, 1, True, True),
    ("data.examples_per_shard", 1, None, True, True),
    ("data.tokenizer_sample_sentences", 1, None, True, True),
    ("data.character_coverage", 0, 1, False, True),
    ("objective.gen_weight", 0, None, True, True),
    ("objective.disc_weight", 0, None, True, True),
    ("train.weight_decay", 0, None, True, True),
    ("train.clip_norm", 0, None, False, True),
    ("train.adam_b1", 0, 1, True, False),
    ("train.adam_b2", 0, 1, True, False),
    ("train.adam_eps", 0, None, False, True),
    ("train.generator_lr_scale", 0, None, False, True),
    ("log.peak_flops", 0, None, True, True),
    ("log.profile_steps", 0, None, True, True),
    ("log.profile_num_steps", 1, None, True, True),
)


# Settings that enter float32 arithmetic on the device, with the range (both ends included) in
# which that arithmetic means something: a value finite in Python can still round to 0, 1 or
# inf there, or drown everything else. (key, lowest, highest, why).
_TINY = 1e-30  # well inside float32's normal range (from 1.2e-38): devices flush smaller to 0
_STEPS = 2**31 - 1  # optax and the loop count steps in int32
_DROPOUT_TOP = 1 - 1e-9  # the dropout mask keeps a unit if 32 random bits fall below (1-rate) 2^32
_FLOAT32_RANGES = (
    (
        "train.learning_rate",
        1e-9,
        10.0,
        "an Adam step moves each weight by about the learning rate; float32 rounds a smaller "
        "step away against weights of ~0.02, and a larger one throws them past anything trained",
    ),
    (
        "train.adam_eps",
        _TINY,
        1.0,
        "it divides the update of every weight no batch touched yet, whose moments are 0: "
        "smaller rounds to 0 in float32 and 0/0 is NaN",
    ),
    (
        "model.layer_norm_eps",
        _TINY,
        1.0,
        "it is added to the variance under a square root: smaller rounds to 0 in float32, and a "
        "constant input divides by 0",
    ),
    ("train.clip_norm", _TINY, 1e30, "gradients are scaled by it in float32"),
    (
        "model.initializer_range",
        _TINY,
        1e3,
        "the initial weights' products are squared in LayerNorm's variance, in float32",
    ),
    ("model.dropout_rate", 0.0, _DROPOUT_TOP, "the kept units are scaled by 1 / (1 - rate)"),
    (
        "model.attention_dropout_rate",
        0.0,
        _DROPOUT_TOP,
        "the kept probabilities are scaled by 1 / (1 - rate)",
    ),
    *(
        (
            f"objective.{name}",
            0.0,
            1e6,
            "the loss terms are summed in float32 and clipped by one global gradient norm: a "
            "weight beyond 1e6 drowns the other terms below float32's resolution",
        )
        for name in ("gen_weight", "disc_weight", "disc_mlm_weight")
    ),
    ("train.num_steps", 1, _STEPS, "the step is counted in int32"),
    ("train.warmup_steps", 0, _STEPS, "the step is counted in int32"),
)


def _num(x: float) -> str:
    """x short ('1e-09', '10') where that is exact, else in full ('0.999999999')."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def _check_float32(config: Any) -> None:
    """The settings of _FLOAT32_RANGES, Adam's decay rates, and the learning rates derived from
    train.learning_rate (the generator's, the weight decay's factor)."""
    for key, lo, hi, why in _FLOAT32_RANGES:
        value = _get(config, key)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        _require(lo <= value <= hi, f"{key}={value} must be in [{_num(lo)}, {_num(hi)}]: {why}")
    for key in ("train.adam_b1", "train.adam_b2"):
        value = _get(config, key)
        if isinstance(value, float):
            # With no bias correction a rate that rounds to 1 keeps the moment at 0 forever.
            _require(
                struct.unpack("f", struct.pack("f", value))[0] < 1,
                f"{key}={value} rounds to 1.0 in float32, which freezes Adam's moment at its "
                "start; use at most 0.9999999",
            )
    t = config.train
    lr, scale = t.learning_rate, t.get("generator_lr_scale", 1.0)
    _require(
        1e-9 <= lr * scale <= 10,
        f"train.generator_lr_scale={scale} gives the generator a learning rate of "
        f"{lr * scale:g}, outside [1e-09, 10] as train.learning_rate must be",
    )
    decay = t.get("weight_decay", 0.0)
    _require(
        lr * decay < 1,
        f"train.weight_decay={decay} x train.learning_rate={lr} = {lr * decay:g}: AdamW "
        "multiplies every weight by (1 - that) each step, so from 1 on it zeroes or flips them; "
        "lower train.weight_decay",
    )


def _interval(lo, hi, lo_in, hi_in) -> str:
    if hi is None:
        return f">= {lo}" if lo_in else f"> {lo}"
    return f"in {'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"


def _check_ranges(config: Any) -> None:
    """Every number finite; every bounded setting within its bounds."""
    for key, value in flatten(config.to_dict()).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number")
    for key, lo, hi, lo_in, hi_in in _RANGES:
        value = _get(config, key)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        ok = (value >= lo if lo_in else value > lo) and (
            hi is None or (value <= hi if hi_in else value < hi)
        )
        _require(ok, f"{key}={value} must be {_interval(lo, hi, lo_in, hi_in)}")
    seed = config.get("seed", 0)
    # jax's keys and Grain's shuffle take 32 bits: 2**32 would repeat seed 0's run, -1 2**32-1's.
    _require(0 <= seed < 2**32, f"seed={seed} must be in [0, 2**32)")
    fsdp = _get(config, "mesh.fsdp")
    _require(
        fsdp is None or fsdp == -1 or fsdp >= 1,
        f"mesh.fsdp={fsdp} must be >= 1, or -1 for all devices",
    )


# Settings that name one of a few choices; the first is the default.
_CHOICES = (
    ("model.attention", ("einsum", "xla", "cudnn")),
    ("train.remat", ("none", "full", "dots")),
    ("objective.sampler", ("inverse_cdf", "gumbel")),
    ("model.scan_layers", (True, False)),
    ("train.rtd_prior_init", (False, True)),
)


def _check_choices(config: Any) -> None:
    for key, choices in _CHOICES:
        value = _get(config, key)
        _require(
            value is None or value in choices,
            f"{key}={value!r} is not a choice; use one of {', '.join(map(repr, choices))}",
        )
    m = config.model
    attention = m.get("attention", "einsum")
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
        import jax

        backend = jax.default_backend()
        _require(
            backend == "gpu",
            f"model.attention='cudnn' needs an NVIDIA GPU, and this machine's backend is "
            f"{backend}; use model.attention='einsum' (or 'xla')",
        )


def _check_wandb(project: str) -> None:
    """A `log.wandb_project` needs wandb installed (the optional [wandb] extra)."""
    import importlib.util

    _require(
        not project or importlib.util.find_spec("wandb") is not None,
        f"log.wandb_project={project!r} needs wandb: pip install -e '.[wandb]' (or set "
        "log.wandb_project='' to log to metrics.jsonl and TensorBoard only)",
    )


def _check_source(source: str) -> None:
    """The form of data.source, as sources.parse reads it (whether its files exist is checked
    when the data is read)."""
    from electra_jax.data import DataError, sources

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


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a.b": value} for a nested dict {"a": {"b": value}}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
