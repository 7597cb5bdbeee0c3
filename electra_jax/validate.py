"""Checks a config before any work starts; each failure is one line naming the key and the fix."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


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
    _require(t.num_steps > 0, f"train.num_steps={t.num_steps} must be >= 1")
    _require(t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be > 0")
    _require(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    _require(0 < o.mask_prob < 1, f"objective.mask_prob={o.mask_prob} must be in (0, 1)")
    _require(
        0 <= o.mask_token_prob <= 1,
        f"objective.mask_token_prob={o.mask_token_prob} must be in [0, 1]",
    )
    _require(o.temperature > 0, f"objective.temperature={o.temperature} must be > 0")
    _require(
        o.name == "electra",
        f"objective.name={o.name!r} is not available; use 'electra'",
    )
    _require(config.checkpoint.every_steps > 0, "checkpoint.every_steps must be >= 1")
    _require(config.checkpoint.keep > 0, "checkpoint.keep must be >= 1")
    _require(config.log.every_steps > 0, "log.every_steps must be >= 1")


def check_batch(batch_size: int, data_parallel: int, process_count: int) -> None:
    _require(
        batch_size % data_parallel == 0,
        f"train.batch_size={batch_size} is not divisible by the {data_parallel} data-parallel "
        "devices; use a multiple of that",
    )
    _require(
        batch_size % process_count == 0,
        f"train.batch_size={batch_size} is not divisible by the {process_count} processes",
    )
