"""Where a fine-tuning starts: the network's spec, its tokenizer and the pre-trained encoder.

A new run takes them from config.init_from (a pre-training workdir, an export, hf:DIR) with
fine-tuning's training choices (dropout, compute type), or builds a randomly initialised
network of config.model with config.tokenizer or one trained on the task's texts. A resumed run
takes its spec and tokenizer from what its first start saved (model.json, tokenizer/), and its
encoder from init_from only when no checkpoint holds the weights yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from electra_jax import pretrained
from electra_jax.config import finetune_keys
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import ConfigError, DataError, PretrainedError
from electra_jax.finetune import glue_heads, saved
from electra_jax.model.networks import (
    ElectraSpec,
    EncoderSpec,
    discriminator_embedding_params,
    generator_spec,
)
from electra_jax.store import paths


@dataclasses.dataclass(frozen=True)
class Initial:
    """Where fine-tuning starts: the network's spec, its tokenizer, pre-trained encoder params."""

    spec: ElectraSpec
    tokenizer: Any
    encoder_params: dict | None  # {'embeddings': ..., 'discriminator': ...}; None = random init
    source: str  # what init_from resolved to, or 'random'
    pretraining: dict | None = None  # saved.pretraining_record of init_from


def _load_pretrained(path: str):
    """electra_jax.pretrained.load_pretrained, behind a name of this module (tests replace it)."""
    return pretrained.load_pretrained(path)


# The fields of config.model a randomly initialised network takes (every key of the section,
# config/finetune_keys.py): its encoder's (EncoderSpec's), then the network's (ElectraSpec's).
_MODEL_FIELDS = tuple(
    k.name.partition(".")[2] for k in finetune_keys.TABLES["glue"] if k.name.startswith("model.")
)
_ENCODER_FIELDS = tuple(f.name for f in dataclasses.fields(EncoderSpec) if f.name in _MODEL_FIELDS)
_NETWORK_FIELDS = tuple(f for f in _MODEL_FIELDS if f not in _ENCODER_FIELDS)


def _random_spec(model_cfg: Any, vocab_size: int) -> ElectraSpec:
    """The spec of a random network shaped by config.model (the fields above)."""
    disc = EncoderSpec(**{k: model_cfg[k] for k in _ENCODER_FIELDS})
    return ElectraSpec(
        vocab_size=vocab_size,
        discriminator=disc,
        generator=generator_spec(disc, 0.25),  # never built: fine-tuning has no generator
        **{k: model_cfg[k] for k in _NETWORK_FIELDS},
    )


def _task_tokenizer(config, texts: list[str], workdir: str):
    """config.tokenizer, or a SentencePiece model trained on the task's training texts."""
    if config.tokenizer:
        return tokenizer_lib.Tokenizer.load(config.tokenizer)
    try:
        return tokenizer_lib.train_tokenizer(
            texts,
            paths.join(workdir, saved.TOKENIZER_DIR),
            vocab_size=int(config.vocab_size),
            character_coverage=0.9995,
            seed=int(config.seed),
            sample_sentences=len(texts) + 1,
        )
    except DataError as e:  # its message names the pre-training key
        raise DataError(str(e).replace("data.vocab_size", "config.vocab_size")) from None


def _pretrained(config, path: str | None = None):
    """init_from's Pretrained (or that of `path`, init_from pinned to a step); ConfigError when
    it cannot be read."""
    try:
        return _load_pretrained(path or config.init_from)
    except PretrainedError as e:  # its message names the path and what would work
        raise ConfigError(f"config.init_from: {e}") from None


def _encoder_params(pre) -> dict:
    params = {k: pre.params[k] for k in glue_heads.PRETRAINED_SUBTREES}
    # The discriminator's own embeddings (under 'gdes': the shared tables plus its deltas).
    params["embeddings"] = discriminator_embedding_params(pre.params, pre.spec.embedding_sharing)
    return params


def training_spec(spec: ElectraSpec, config) -> ElectraSpec:
    """`spec` with fine-tuning's training choices: dropout, compute type, einsum attention."""
    return dataclasses.replace(
        spec,
        dropout_rate=config.dropout_rate,
        attention_dropout_rate=config.dropout_rate,
        dtype=config.dtype,
        # Fine-tuning keeps attention dropout, which only the einsum attention has.
        attention="einsum",
        remat="none",
        # One plain embedding block (a 'gdes' run's discriminator tables are merged below) and
        # no pre-training heads.
        embedding_sharing="electra",
        mlm_head=False,
        policy_baseline=False,
    )


def initial_model(config, task_texts: list[str], workdir: str) -> Initial:
    """The spec, tokenizer and (pre-trained) encoder params fine-tuning starts from.

    With config.init_from, everything but the training choices (dropout, compute type) comes
    from the pre-trained model; otherwise config.model and config.tokenizer (or a tokenizer
    trained on task_texts, the task's training text) make a randomly initialised one.
    """
    if config.init_from:
        pre = _pretrained(config)
        record = saved.pretraining_record(config.init_from, pre)
        return Initial(
            training_spec(pre.spec, config), pre.tokenizer, _encoder_params(pre), pre.source, record
        )
    tokenizer = _task_tokenizer(config, task_texts, workdir)
    spec = training_spec(_random_spec(config.model, tokenizer.vocab_size), config)
    return Initial(spec, tokenizer, None, "random")


def resumed_model(
    config, workdir: str, record: dict, needs_encoder: bool, allow: tuple[str, ...]
) -> Initial:
    """The Initial of a run that started in WORKDIR: its spec and tokenizer as it saved them;
    the encoder from init_from only when no checkpoint holds the weights yet, read where the
    first start read it (inputs.py: a workdir at the step it had then), unless the resume may
    change init_from."""
    try:
        spec = saved.spec_from_json(record.get("spec"), paths.join(workdir, saved.MODEL_FILE))
        tokenizer = saved.load_tokenizer(workdir, record.get("tokenizer_fingerprint"))
    except PretrainedError as e:
        raise ConfigError(str(e)) from None
    encoder = None
    if needs_encoder and config.init_from:
        pinned = (record.get("inputs") or {}).get("init_from", {}).get("load")
        path = config.init_from if "init_from" in allow or not pinned else pinned
        encoder = _encoder_params(_pretrained(config, path))
    return Initial(
        spec, tokenizer, encoder, record.get("init_source", "?"), record.get("pretraining")
    )
