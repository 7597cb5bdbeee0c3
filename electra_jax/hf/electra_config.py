"""transformers' ElectraConfig: written from a spec for export, read back into one for import.

A config read from a file is checked field by field (sizes, rates, the activation) before
anything is allocated: a damaged or hostile config.json is one PretrainedError line.
"""

from __future__ import annotations

from typing import Any

from electra_jax.errors import PretrainedError
from electra_jax.hf.names import ARCHITECTURES, DISCRIMINATOR, GENERATOR
from electra_jax.model import networks
from electra_jax.model.weights import check_size
from electra_jax.store.jsonio import one_line

# A single discriminator folder has no generator: one is initialised at the paper's Small width.
DEFAULT_GENERATOR_FRACTION = 0.25


def hf_config(spec: networks.ElectraSpec, network: str, pad_id: int) -> dict:
    """transformers' ElectraConfig fields for one network."""
    enc = getattr(spec, network)
    return {
        "architectures": [ARCHITECTURES[network]],
        "model_type": "electra",
        "vocab_size": spec.vocab_size,
        "embedding_size": spec.embedding_size,
        "hidden_size": enc.hidden_size,
        "num_hidden_layers": enc.num_layers,
        "num_attention_heads": enc.num_heads,
        "intermediate_size": enc.intermediate_size,
        "hidden_act": "gelu",  # transformers' "gelu" is the exact erf form, as ours
        "hidden_dropout_prob": spec.dropout_rate,
        "attention_probs_dropout_prob": spec.attention_dropout_rate,
        "max_position_embeddings": spec.max_position_embeddings,
        "type_vocab_size": spec.type_vocab_size,
        "initializer_range": spec.initializer_range,
        "layer_norm_eps": spec.layer_norm_eps,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


_REQUIRED = object()


def _hf_size(config: dict, field: str, limit: str, where: str, default: Any = _REQUIRED) -> int:
    """config[field] (or `default` when absent and allowed), checked to be a sane positive int."""
    if field not in config and default is _REQUIRED:
        raise PretrainedError(
            f"{where}/config.json lacks the ElectraConfig field {field!r}; save the model again "
            "with transformers' save_pretrained"
        )
    return check_size(config.get(field, default), field, limit, f"{where}/config.json")


def _hf_rate(
    config: dict, field: str, default: float, where: str, low: float, high: float
) -> float:
    """config[field] (default when absent) as a float with low <= value < high."""
    value = config.get(field, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and low <= value < high):
        raise PretrainedError(
            f"{where}/config.json: {field} is {one_line(repr(value), 60)}; it must be a number "
            f"from {low} to below {high}: correct the file or fetch it again"
        )
    return float(value)


def _encoder_from_hf(config: dict, where: str) -> networks.EncoderSpec:
    enc = networks.EncoderSpec(
        hidden_size=_hf_size(config, "hidden_size", "hidden_size", where),
        num_layers=_hf_size(config, "num_hidden_layers", "num_layers", where),
        num_heads=_hf_size(config, "num_attention_heads", "num_heads", where),
        intermediate_size=_hf_size(config, "intermediate_size", "intermediate_size", where),
    )
    if enc.hidden_size % enc.num_heads:
        raise PretrainedError(
            f"{where}/config.json: hidden_size {enc.hidden_size} is not a multiple of "
            f"num_attention_heads {enc.num_heads}; correct the file or fetch it again"
        )
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise PretrainedError(
            f"{where}: hidden_act={act!r}; electra_jax implements ELECTRA's exact 'gelu' only"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise PretrainedError(
            f"{where}: position_embedding_type={config['position_embedding_type']!r}; only "
            "'absolute' is supported"
        )
    return enc


SHARED_FIELDS = ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size")


def spec_from_hf(disc: dict, gen: dict | None, where: dict[str, str]) -> networks.ElectraSpec:
    """An ElectraSpec from the two transformers configs (the generator's own width and heads).

    Without a generator config the generator is the paper's Small one: 1/4 of the width.
    """
    d = _encoder_from_hf(disc, where[DISCRIMINATOR])
    g = (
        _encoder_from_hf(gen, where[GENERATOR])
        if gen is not None
        else networks.generator_spec(d, DEFAULT_GENERATOR_FRACTION)
    )
    w = where[DISCRIMINATOR]
    shared = {
        "vocab_size": _hf_size(disc, "vocab_size", "vocab_size", w),
        "embedding_size": _hf_size(disc, "embedding_size", "embedding_size", w, d.hidden_size),
        "max_position_embeddings": _hf_size(
            disc, "max_position_embeddings", "max_position_embeddings", w
        ),
        "type_vocab_size": _hf_size(disc, "type_vocab_size", "type_vocab_size", w),
    }
    if gen is not None:
        gen_shared = dict(shared, embedding_size=gen.get("embedding_size", g.hidden_size))
        for field in SHARED_FIELDS:
            value = gen.get(field, gen_shared[field])
            if value != shared[field]:
                raise PretrainedError(
                    f"{where[GENERATOR]}: {field}={value} but the discriminator's is "
                    f"{shared[field]}; ELECTRA's two networks share the embeddings"
                )
    return networks.ElectraSpec(
        **shared,
        discriminator=d,
        generator=g,
        dropout_rate=_hf_rate(disc, "hidden_dropout_prob", 0.1, w, 0.0, 1.0),
        attention_dropout_rate=_hf_rate(disc, "attention_probs_dropout_prob", 0.1, w, 0.0, 1.0),
        initializer_range=_hf_rate(disc, "initializer_range", 0.02, w, 0.0, 1e3),
        layer_norm_eps=_hf_rate(disc, "layer_norm_eps", 1e-12, w, 1e-300, 1.0),
    )
