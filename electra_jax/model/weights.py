"""A pre-trained ELECTRA as plain data, and the checks every reader of one applies.

Whatever holds the weights (a workdir's checkpoint, an export, a transformers folder), a reader
returns a `Pretrained` and refuses what it cannot use with one `PretrainedError` line. Sizes are
checked before anything is allocated, so a damaged or hostile file cannot drive a huge
allocation.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from electra_jax.errors import PretrainedError
from electra_jax.store.jsonio import one_line

# The networks (flax) only where a spec is built into a model (abstract_params): the checks and
# PretrainedError are read by commands that refuse bad input before importing jax (hf/previous.py).
if TYPE_CHECKING:
    from electra_jax.model import networks


# The largest sizes a config file may give: far above any released ELECTRA (Large: hidden 1024,
# 24 layers, 16 heads, vocab 30522, 512 positions), low enough that a damaged or hostile file is
# refused before it drives a huge allocation or a loop over a trillion layers.
SIZE_LIMITS = {
    "vocab_size": 1 << 21,
    "embedding_size": 1 << 16,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_layers": 1024,
    "num_heads": 1024,
    "max_position_embeddings": 1 << 20,
    "type_vocab_size": 1024,
}


def check_size(value: Any, field: str, limit: str, where: str) -> int:
    """`value` when it is an int from 1 to SIZE_LIMITS[limit]; else PretrainedError naming
    `field` (as the file spells it) and `where` (the file)."""
    maximum = SIZE_LIMITS[limit]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise PretrainedError(
            f"{where}: {field} is {one_line(repr(value), 60)}; it must be a whole number from 1 "
            f"to {maximum}: correct the file or fetch it again"
        )
    return value


def check_spec(spec: networks.ElectraSpec, where: str) -> None:
    """PretrainedError unless every size of `spec` is a sane positive int, heads divide the width
    of each network and the rates are usable numbers: for a spec built from a run's config.json,
    before anything is allocated."""
    checks = [
        (spec.vocab_size, "the tokenizer's vocab size", "vocab_size"),
        (spec.embedding_size, "model.embedding_size", "embedding_size"),
        (spec.max_position_embeddings, "model.max_position_embeddings", "max_position_embeddings"),
        (spec.type_vocab_size, "model.type_vocab_size", "type_vocab_size"),
    ]
    for network, prefix in (("discriminator", "model."), ("generator", "the generator's ")):
        enc = getattr(spec, network)
        checks += [
            (enc.hidden_size, f"{prefix}hidden_size", "hidden_size"),
            (enc.num_layers, f"{prefix}num_layers", "num_layers"),
            (enc.num_heads, f"{prefix}num_heads", "num_heads"),
            (enc.intermediate_size, f"{prefix}intermediate_size", "intermediate_size"),
        ]
    for value, field, limit in checks:
        check_size(value, field, limit, where)
    for network in ("discriminator", "generator"):
        enc = getattr(spec, network)
        if enc.hidden_size % enc.num_heads:
            raise PretrainedError(
                f"{where}: the {network}'s hidden size {enc.hidden_size} is not a multiple of its "
                f"{enc.num_heads} heads; correct the model section"
            )
    for field in ("dropout_rate", "attention_dropout_rate", "initializer_range", "layer_norm_eps"):
        value = getattr(spec, field)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and bool(np.isfinite(value))
        ok = ok and (value > 0 if field == "layer_norm_eps" else value >= 0)
        ok = ok and (value < 1 if field.endswith("dropout_rate") else True)
        if not ok:
            raise PretrainedError(
                f"{where}: model.{field} is {one_line(repr(value), 60)}, not a usable number; "
                "correct the model section"
            )


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pre-trained ELECTRA as plain data.

    spec: the full spec (generator and discriminator), as trained (dtype included).
    params: nested dict of float32 numpy arrays, the tree of `networks.Electra`'s params.
    tokenizer: `data.tokenizer.Tokenizer`, or `data.wordpiece.WordPieceTokenizer` (same
      interface) for checkpoints with a BERT vocabulary such as Google's released ELECTRA models.
    source: what was loaded, for logs (path, and the step of a workdir's checkpoint).
    step: the optimizer step of a workdir's checkpoint; None for an export or transformers files.
    """

    spec: networks.ElectraSpec
    params: dict
    tokenizer: Any
    source: str
    step: int | None = None


def abstract_params(spec: networks.ElectraSpec) -> Any:
    """The parameter tree's shapes (jax.ShapeDtypeStruct leaves), computed without allocating."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.model import networks

    return networks.abstract_params(networks.Electra(spec))[0]


def check_finite(tensors: Any, where: str) -> None:
    """PretrainedError naming `where` (the file or checkpoint) and the first tensor of `tensors`
    (a flat name -> array mapping, or a nested dict of arrays) holding NaN or Inf.

    Every reader calls it where the weights are read: a diverged or damaged model would
    otherwise load and answer with NaN probabilities, or start a fine-tuning that cannot learn.
    """
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    if isinstance(tensors, dict) and all(not isinstance(v, dict) for v in tensors.values()):
        named = tensors.items()
    else:
        named = (
            ("/".join(str(getattr(k, "key", k)) for k in path), leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tensors)
        )
    for name, value in named:
        array = np.asarray(value)
        if array.dtype.kind in "iub":
            continue
        finite = np.isfinite(array.astype(np.float32, copy=False))
        if not finite.all():
            raise PretrainedError(
                f"{where}: tensor {name} holds {int(finite.size - finite.sum())} non-finite "
                f"values (NaN or Inf) of {finite.size}; these weights are damaged or from a "
                "diverged run: load an earlier checkpoint, or write or fetch the file again"
            )


def check_params(params: Any, spec: networks.ElectraSpec, where: str) -> None:
    """Raises PretrainedError unless `params` has exactly the tree and shapes `spec` implies."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    expected = abstract_params(spec)
    got_paths = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
    for key, leaf in jax.tree_util.tree_leaves_with_path(expected):
        name = jax.tree_util.keystr(key)
        if name not in got_paths:
            raise PretrainedError(f"{where} has no parameter {name}")
        if tuple(got_paths[name].shape) != tuple(leaf.shape):
            raise PretrainedError(
                f"{where}: parameter {name} has shape {tuple(got_paths[name].shape)}, the "
                f"model's config implies {tuple(leaf.shape)}"
            )
