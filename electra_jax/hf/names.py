"""What things are called in transformers' ELECTRA format: files, networks, and every parameter.

Our parameter tree keeps one embedding block for both networks; each transformers model gets its
own copy. Attention is fused here ([H, 3, heads, head_dim] for q, k, v; [heads, head_dim, H] for
the output) and split into transformers' four [out, in] Linear weights. The generator's output
layer is tied to the word embeddings (tie_word_embeddings), with its own bias. Every conversion
is a transpose or a reshape, so export then import is bit-exact.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from electra_jax.errors import PretrainedError
from electra_jax.model import layer_stack, networks
from electra_jax.store import filenames

NETWORKS = filenames.EXPORT_NETWORKS
DISCRIMINATOR, GENERATOR = NETWORKS
ARCHITECTURES = {DISCRIMINATOR: "ElectraForPreTraining", GENERATOR: "ElectraForMaskedLM"}
WEIGHTS = filenames.WEIGHTS_FILE
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One of our leaves and the transformers tensor(s) it becomes, with both conversions."""

    path: tuple[str, ...]  # keys into our params tree
    names: tuple[str, ...]  # transformers state-dict keys
    to_hf: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    from_hf: Callable[[Sequence[np.ndarray]], np.ndarray]


def _copy(path: tuple[str, ...], name: str) -> _Entry:
    return _Entry(path, (name,), lambda x: (x,), lambda xs: xs[0])


def _linear(path: tuple[str, ...], name: str) -> list[_Entry]:
    # flax Dense kernels are [in, out]; torch Linear weights are [out, in].
    return [
        _Entry((*path, "kernel"), (f"{name}.weight",), lambda k: (k.T,), lambda ws: ws[0].T),
        _copy((*path, "bias"), f"{name}.bias"),
    ]


def _layer_norm(path: tuple[str, ...], name: str) -> list[_Entry]:
    return [_copy((*path, "scale"), f"{name}.weight"), _copy((*path, "bias"), f"{name}.bias")]


def _attention(path: tuple[str, ...], name: str, enc: networks.EncoderSpec) -> list[_Entry]:
    """Fused q/k/v [H, 3, heads, hd] and output [heads, hd, H] <-> four [H, H] Linear layers.

    transformers splits the query/key/value outputs as [heads, head_dim] (head-major), the same
    order a reshape of our [heads, head_dim] axes gives, so no permutation is needed.
    """
    h, heads = enc.hidden_size, enc.num_heads
    hd = h // heads
    qkv = tuple(f"{name}self.{x}" for x in ("query", "key", "value"))
    return [
        _Entry(
            (*path, "qkv_kernel"),
            tuple(f"{n}.weight" for n in qkv),
            lambda k: tuple(k[:, j].reshape(h, h).T for j in range(3)),
            lambda ws: np.stack([w.T.reshape(h, heads, hd) for w in ws], axis=1),
        ),
        _Entry(
            (*path, "qkv_bias"),
            tuple(f"{n}.bias" for n in qkv),
            lambda b: tuple(b[j].reshape(h) for j in range(3)),
            lambda bs: np.stack([b.reshape(heads, hd) for b in bs]),
        ),
        _Entry(
            (*path, "output_kernel"),
            (f"{name}output.dense.weight",),
            lambda k: (k.reshape(h, h).T,),
            lambda ws: ws[0].T.reshape(heads, hd, h),
        ),
        _copy((*path, "output_bias"), f"{name}output.dense.bias"),
    ]


def _embedding_entries() -> list[_Entry]:
    e = "electra.embeddings."
    return [
        _copy(("embeddings", "word_embeddings", "embedding"), f"{e}word_embeddings.weight"),
        _copy(("embeddings", "position_embeddings", "embedding"), f"{e}position_embeddings.weight"),
        _copy(
            ("embeddings", "token_type_embeddings", "embedding"), f"{e}token_type_embeddings.weight"
        ),
        *_layer_norm(("embeddings", "LayerNorm"), f"{e}LayerNorm"),
    ]


def _encoder_entries(spec: networks.ElectraSpec, network: str) -> list[_Entry]:
    enc = getattr(spec, network)
    entries = []
    if spec.embedding_size != enc.hidden_size:
        entries += _linear((network, "embeddings_project"), "electra.embeddings_project")
    for i in range(enc.num_layers):
        ours, hf = (network, f"layer_{i}"), f"electra.encoder.layer.{i}."
        entries += _attention((*ours, "attention"), f"{hf}attention.", enc)
        entries += _layer_norm((*ours, "attention_LayerNorm"), f"{hf}attention.output.LayerNorm")
        entries += _linear((*ours, "intermediate"), f"{hf}intermediate.dense")
        entries += _linear((*ours, "output"), f"{hf}output.dense")
        entries += _layer_norm((*ours, "output_LayerNorm"), f"{hf}output.LayerNorm")
    return entries


def mapping(spec: networks.ElectraSpec) -> dict[str, list[_Entry]]:
    """Per network, every leaf's conversion; the embedding entries appear in both networks."""
    disc = [
        *_embedding_entries(),
        *_encoder_entries(spec, DISCRIMINATOR),
        *_linear(("discriminator_predictions_dense",), "discriminator_predictions.dense"),
        *_linear(
            ("discriminator_predictions_dense_prediction",),
            "discriminator_predictions.dense_prediction",
        ),
    ]
    gen = [
        *_embedding_entries(),
        *_encoder_entries(spec, GENERATOR),
        *_linear(("generator_predictions_dense",), "generator_predictions.dense"),
        *_layer_norm(("generator_predictions_LayerNorm",), "generator_predictions.LayerNorm"),
        _copy(("generator_lm_head_bias",), "generator_lm_head.bias"),
    ]
    return {DISCRIMINATOR: disc, GENERATOR: gen}


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def network_embeddings(params: dict, spec: networks.ElectraSpec, network: str) -> dict:
    """The embedding block `network` computes with, in the layout of params["embeddings"].

    transformers' ELECTRA has one embedding block per model, so each network gets the tables it
    uses: under 'electra' both the shared block; under 'gdes' the generator the base block and
    the discriminator the base plus its deltas (with its own LayerNorm); under 'none' each its
    own block.
    """
    if network == DISCRIMINATOR:
        return networks.discriminator_embedding_params(params, spec.embedding_sharing)
    if spec.embedding_sharing == "none":
        return params["generator_embeddings"]
    return params["embeddings"]


def params_to_hf(params: dict, spec: networks.ElectraSpec) -> dict[str, dict[str, np.ndarray]]:
    """Our params -> {network: {transformers key: contiguous float32 array}}, each network with
    the embeddings it computes with (`network_embeddings`), whatever the sharing mode and the
    layers' layout (transformers names each layer)."""
    params = layer_stack.unstack(params)
    out: dict[str, dict[str, np.ndarray]] = {}
    for network, entries in mapping(spec).items():
        view = {**params, "embeddings": network_embeddings(params, spec, network)}
        out[network] = _to_hf(entries, view)
    return out


def _to_hf(entries: list[_Entry], tree: dict) -> dict[str, np.ndarray]:
    """{transformers key: contiguous float32 array} of the entries' leaves of an unrolled tree."""
    tensors = {}
    for entry in entries:
        values = entry.to_hf(np.asarray(_get(tree, entry.path), np.float32))
        for name, value in zip(entry.names, values, strict=True):
            tensors[name] = np.ascontiguousarray(value)
    return tensors


def encoder_to_hf(params: dict, spec: networks.ElectraSpec) -> dict[str, np.ndarray]:
    """A fine-tuned network's embeddings and discriminator encoder (one plain embedding block,
    as finetune/heads.py builds them) -> transformers' `electra.*` tensors, contiguous float32."""
    entries = [*_embedding_entries(), *_encoder_entries(spec, DISCRIMINATOR)]
    return _to_hf(entries, layer_stack.unstack(params))


def params_from_hf(
    tensors: dict[str, dict[str, np.ndarray]], spec: networks.ElectraSpec, where: dict[str, str]
) -> dict:
    """{network: state dict} -> our params in the layout of `spec.scan_layers` (generator
    subtrees only when tensors has one).

    The shared embedding block is taken from the discriminator; a generator whose embeddings
    differ gets a warning (ELECTRA trains them as one, so they should not).

    Raises:
      PretrainedError: a tensor is missing or has a shape the config does not imply.
    """
    params: dict = {}
    shared = {e.path for e in _embedding_entries()}
    for network, entries in mapping(spec).items():
        if network not in tensors:
            continue
        state = tensors[network]
        for entry in entries:
            missing = [n for n in entry.names if n not in state]
            if missing:
                raise PretrainedError(
                    f"{where[network]} has no tensor {missing[0]} (an ELECTRA "
                    f"{ARCHITECTURES[network]} checkpoint with {getattr(spec, network).num_layers}"
                    " layers has one)"
                )
            try:
                value = entry.from_hf([np.asarray(state[n], np.float32) for n in entry.names])
            except ValueError:
                shapes = [tuple(state[n].shape) for n in entry.names]
                raise PretrainedError(
                    f"{where[network]}: {entry.names[0]} has shape {shapes[0]}, which its "
                    "config.json does not imply"
                ) from None
            value = np.ascontiguousarray(value, np.float32)
            if network == GENERATOR and entry.path in shared:
                if not np.array_equal(value, _get(params, entry.path)):
                    logging.warning(
                        "%s: %s differs from the discriminator's; ELECTRA shares the "
                        "embeddings, the discriminator's are used",
                        where[network],
                        entry.names[0],
                    )
                continue
            _set(params, entry.path, value)
    head = tensors.get(GENERATOR, {}).get("generator_lm_head.weight")
    if head is not None and not np.array_equal(
        np.asarray(head, np.float32), params["embeddings"]["word_embeddings"]["embedding"]
    ):
        logging.warning(
            "%s: generator_lm_head.weight is not tied to the word embeddings; the tied "
            "embeddings are used",
            where[GENERATOR],
        )
    return layer_stack.to_layout(params, spec.scan_layers)
