"""Checks a config before any work starts; each failure is one line naming the key and the fix."""

from __future__ import annotations

import os
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _uri_scheme(path: str) -> str | None:
    from electra_jax.data.sources import uri_scheme

    return uri_scheme(path)


def _mount_hint(path: str) -> str:
    """What to do instead of a URI: for gs://BUCKET/rest, the gcsfuse mount and mounted path."""
    scheme, _, rest = path.partition("://")
    if scheme != "gs":
        return "mount it as a filesystem every host sees (NFS, a FUSE mount) and give that path"
    bucket, _, below = rest.partition("/")
    mounted = f"/mnt/{bucket}/{below}".rstrip("/")
    mount = f"gcsfuse --implicit-dirs --rename-dir-limit=100000 {bucket} /mnt/{bucket}"
    return f"mount the bucket ({mount}) or use NFS, and give {mounted}"


def check_workdir(workdir: str) -> None:
    """Creates the workdir; ConfigError naming it when it cannot be written.

    A URI (gs://...) is refused: config.json, metrics.jsonl, tokenizer/ and the prepared data are
    written with local file calls, and os.makedirs would quietly create a local ./gs:/... tree.
    """
    scheme = _uri_scheme(workdir)
    if scheme:
        raise ConfigError(
            f"--workdir {workdir} is a {scheme}:// URI, but the workdir is written with local "
            f"file calls; {_mount_hint(workdir)}"
        )
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(
            f"workdir {workdir} is not writable ({e.strerror}); choose another --workdir"
        ) from e


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
    _require(o.temperature > 0, f"objective.temperature={o.temperature} must be > 0")
    names = ("electra", "mlm", "electra_15", "replaced_mlm", "all_tokens_mlm")
    _require(
        o.name in names,
        f"objective.name={o.name!r} is not an objective; use one of {', '.join(names)}",
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
    # Read and written with local file calls (prepare's atomic renames; init_from's config.json
    # and tokenizer are opened directly, not only through orbax).
    for key, value in (
        ("data.cache_dir", d.get("cache_dir", "")),
        ("train.init_from", t.get("init_from", "")),
    ):
        scheme = _uri_scheme(str(value))
        if scheme:
            raise ConfigError(
                f"{key}={value} is a {scheme}:// URI, which electra_jax does not read or write "
                f"directly; {_mount_hint(str(value))}"
            )
    _require(config.checkpoint.every_steps > 0, "checkpoint.every_steps must be >= 1")
    _require(config.checkpoint.keep > 0, "checkpoint.keep must be >= 1")
    _require(config.log.every_steps > 0, "log.every_steps must be >= 1")
    k = t.get("steps_per_call", 1)
    _require(k >= 1, f"train.steps_per_call={k} must be >= 1")


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


# The fields that fix the parameters' shapes and meaning. model.dtype is left out: it is the compute
# type only (parameters stay float32), so resuming in bfloat16 what ran in float32 is legitimate.
_MODEL_SECTIONS = ("model", "generator")
_MODEL_KEYS = ("data.vocab_size", "data.seq_length", "objective.name")  # name: the MLM head
_NOT_MODEL = ("model.dtype",)
_ADDED_DEFAULTS = {"model.embedding_sharing": "electra"}


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_same_model(stored: dict, config: Any, config_path: str) -> None:
    """Raises ConfigError when a workdir's stored config describes another model than `config`.

    stored: the parsed config.json of the workdir. Compares model.*, generator.*,
    data.vocab_size and data.seq_length, so that a resume with other sizes fails here in one line
    instead of as a shape error deep inside the restore.
    """
    # Keys added since a run was stored mean their default there.
    old = {**_ADDED_DEFAULTS, **_flatten(stored)}
    new = _flatten(config.to_dict())

    def is_model_key(key: str) -> bool:
        return (key.split(".", 1)[0] in _MODEL_SECTIONS or key in _MODEL_KEYS) and (
            key not in _NOT_MODEL
        )

    keys = sorted(k for k in set(old) | set(new) if is_model_key(k))
    differ = [k for k in keys if old.get(k) != new.get(k)]
    if differ:
        shown = ", ".join(f"{k}={old.get(k)!r} there vs {new.get(k)!r} now" for k in differ[:4])
        more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
        raise ConfigError(
            f"{config_path} describes a different model than the one asked for: {shown}{more}; "
            "to resume, run with the same settings; to train this model, use a new --workdir"
        )
