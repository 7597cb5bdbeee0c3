"""Import: an export, a transformers ELECTRA pair or one model folder, as a `Pretrained`.

Takes an electra_jax export, or a transformers ELECTRA pair such as Google's released
google/electra-small-discriminator + google/electra-small-generator side by side as
DIR/discriminator and DIR/generator. The spec is built from the two configs directly, so a
generator as wide as the discriminator (Small++'s: hidden 256, embedding 128) keeps its width,
heads and feed-forward size. Those checkpoints use BERT's WordPiece vocab.txt, which
`data.wordpiece.WordPieceTokenizer` reads. Paths read from a file never leave its folder.
"""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from typing import Any

import jax
import numpy as np

from electra_jax.data.tokenizer import MODEL_FILENAME, describe
from electra_jax.data.wordpiece import VOCAB_FILENAME
from electra_jax.errors import PretrainedError
from electra_jax.hf.electra_config import DEFAULT_GENERATOR_FRACTION, spec_from_hf
from electra_jax.hf.names import (
    DISCRIMINATOR,
    GENERATOR,
    TORCH_WEIGHTS,
    WEIGHTS,
    WEIGHTS_INDEX,
    params_from_hf,
)
from electra_jax.hf.tokenizer_files import read_hf_tokenizer
from electra_jax.model import networks
from electra_jax.model.weights import (
    Pretrained,
    abstract_params,
    check_finite,
    check_params,
)
from electra_jax.store import filenames, jsonio
from electra_jax.store.jsonio import json_kind, one_line

# load_pretrained's prefix for a transformers folder, also written into the source it reports.
HF_PREFIX = "hf:"


def read_hf_config(folder: str) -> dict:
    config = jsonio.read_json_object(
        os.path.join(folder, filenames.CONFIG_FILE),
        "a transformers config.json is an object",
        PretrainedError,
    )
    if config.get("model_type") != "electra":
        raise PretrainedError(
            f"{folder}/config.json is not an ELECTRA config (model_type="
            f"{one_line(repr(config.get('model_type')), 60)}); give an ELECTRA model folder"
        )
    return config


def read_hf_tensors(folder: str) -> dict[str, np.ndarray]:
    """A transformers checkpoint's state dict as numpy arrays.

    model.safetensors (or its sharded index) is read with safetensors' numpy API; a
    pytorch_model.bin only when torch is installed (unpickling it needs torch).
    """
    # safetensors: only on the path that uses it (an optional extra, or slow to import).
    from safetensors.numpy import load_file

    single, index = os.path.join(folder, WEIGHTS), os.path.join(folder, WEIGHTS_INDEX)
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        files = [os.path.join(folder, name) for name in _shard_names(index)]
    elif os.path.isfile(os.path.join(folder, TORCH_WEIGHTS)):
        path = os.path.join(folder, TORCH_WEIGHTS)
        tensors = _read_torch_bin(path)
        check_finite(tensors, path)
        return tensors
    else:
        raise PretrainedError(
            f"{folder} has no {WEIGHTS} (nor {WEIGHTS_INDEX} or {TORCH_WEIGHTS}); it is not a "
            "saved transformers model"
        )
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        try:
            read = load_file(path)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise PretrainedError(
                f"{path} cannot be read ({type(e).__name__}: {one_line(e, 200)}); download or "
                "export it again (bfloat16 files need converting to float32)"
            ) from None
        check_finite(read, path)
        tensors.update(read)
    return tensors


def _plain_file_name(name: Any) -> bool:
    """Whether `name` names a file in the folder itself: no separator, no '..', not absolute."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and not os.path.isabs(name)
        and os.path.basename(name) == name
    )


def _shard_names(index: str) -> list[str]:
    """The shard files a model.safetensors.index.json names, each a plain file beside it.

    Paths read from a file never leave its folder: a weight_map value with a separator, '..' or
    an absolute path is refused rather than read.
    """
    data = jsonio.read_json_object(
        index, "a sharded checkpoint's index is an object with a weight_map", PretrainedError
    )
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        shown = "empty" if weight_map == {} else f"a JSON {json_kind(weight_map)}"
        raise PretrainedError(
            f"{index}: weight_map is {shown}, not an object of tensor name -> shard file; save "
            "the model again with save_pretrained"
        )
    for key, name in weight_map.items():
        if not _plain_file_name(name):
            raise PretrainedError(
                f"{index}: weight_map[{one_line(repr(key), 80)}] is {one_line(repr(name), 80)}, "
                "not the name of a file beside the index; shards must sit in the index's own "
                "folder"
            )
    return sorted(set(weight_map.values()))


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    convert = (
        f"convert it to {WEIGHTS} where the source is trusted (transformers' "
        "save_pretrained(dir, safe_serialization=True))"
    )
    try:
        # torch: only on the path that uses it (an optional extra, or slow to import).
        import torch
    except ImportError:
        raise PretrainedError(
            f"{path} is a PyTorch pickle and torch is not installed; {convert} or pip install torch"
        ) from None
    # torch's messages are not shown: they can recommend weights_only=False, which runs any code
    # the pickle holds.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if zipfile.is_zipfile(path):
            raise PretrainedError(
                f"{path} holds objects other than tensors, which are not loaded; {convert}"
            ) from None
        raise PretrainedError(
            f"{path} is damaged or holds objects other than tensors; download it again or {convert}"
        ) from None
    except Exception as e:  # torch raises many types for damaged files
        raise PretrainedError(
            f"{path} is damaged or not a PyTorch checkpoint (torch.load raised "
            f"{type(e).__name__}); download it again or {convert}"
        ) from None
    check_state_dict(state, path, torch.Tensor)
    return {k: v.detach().float().numpy() for k, v in state.items()}


def check_state_dict(state: Any, path: str, tensor_type: type) -> None:
    """PretrainedError unless `state` is a non-empty dict of str -> `tensor_type` (torch.Tensor
    for a pytorch_model.bin): the pickle may hold any plain data weights_only allows."""
    if not isinstance(state, dict):
        raise PretrainedError(
            f"{path} holds a {type(state).__name__}, not a state dict (tensor name -> tensor); "
            f"give the file transformers' save_pretrained writes, or {WEIGHTS}"
        )
    if not state:
        raise PretrainedError(f"{path} holds no tensors; download or save the model again")
    for key, value in state.items():
        if not isinstance(key, str):
            raise PretrainedError(
                f"{path} has a key {one_line(repr(key), 80)} that is not a tensor name, so the "
                f"file is not a transformers state dict; give the file save_pretrained writes, "
                f"or {WEIGHTS}"
            )
        if not isinstance(value, tensor_type):
            raise PretrainedError(
                f"{path}: entry {one_line(repr(key), 80)} holds a {type(value).__name__}, not a "
                f"tensor, so the file is not a transformers state dict; give the file "
                f"save_pretrained writes, or {WEIGHTS}"
            )


def read_hf(directory: str) -> Pretrained:
    """An export, a transformers ELECTRA pair (DIR/discriminator, DIR/generator) or one folder.

    A single (discriminator) folder gets a freshly initialised generator of 1/4 its width
    (seed 0), with a warning: fine; for fine-tuning, which uses the discriminator only.
    """
    if not os.path.isdir(directory):
        raise PretrainedError(
            f"{directory} does not exist or is not a directory; give a folder holding "
            "discriminator/ and generator/ (or one ELECTRA model folder)"
        )
    where = {
        DISCRIMINATOR: os.path.join(directory, DISCRIMINATOR),
        GENERATOR: os.path.join(directory, GENERATOR),
    }
    if os.path.isdir(where[DISCRIMINATOR]):
        has_generator = os.path.isdir(where[GENERATOR])
    elif os.path.isfile(os.path.join(directory, filenames.CONFIG_FILE)):
        where[DISCRIMINATOR], has_generator = directory, False
    else:
        raise PretrainedError(
            f"{directory} holds neither discriminator/ (an export or a model pair) nor "
            "config.json (one transformers model folder)"
        )
    disc_config = read_hf_config(where[DISCRIMINATOR])
    gen_config = read_hf_config(where[GENERATOR]) if has_generator else None
    spec = spec_from_hf(disc_config, gen_config, where)
    tensors = {DISCRIMINATOR: read_hf_tensors(where[DISCRIMINATOR])}
    if has_generator:
        tensors[GENERATOR] = read_hf_tensors(where[GENERATOR])
    params = params_from_hf(tensors, spec, where)
    source = f"{HF_PREFIX}{directory}"
    if not has_generator:
        params = _with_fresh_generator(params, spec)
        note = (
            f"no generator in {directory}: initialised one {spec.generator.hidden_size} wide "
            f"(1/{round(1 / DEFAULT_GENERATOR_FRACTION)} of the discriminator), seed 0"
        )
        logging.warning("%s", note)
        source += f" ({note})"
    check_params(params, spec, directory)
    tokenizer = read_hf_tokenizer(where[DISCRIMINATOR])
    if has_generator:
        _check_same_tokenizer(tokenizer, where)
    if tokenizer.vocab_size > spec.vocab_size:
        raise PretrainedError(
            f"{where[DISCRIMINATOR]}: the tokenizer has {tokenizer.vocab_size} tokens but the "
            f"model's vocab_size is {spec.vocab_size}"
        )
    return Pretrained(spec, params, tokenizer, source)


def _check_same_tokenizer(tokenizer: Any, where: dict[str, str]) -> None:
    """PretrainedError when the generator's folder holds a tokenizer other than the
    discriminator's: the two networks share their embeddings, so their weights belong to one
    tokenizer (a folder without tokenizer files takes the discriminator's)."""
    folder = where[GENERATOR]
    if not any(os.path.isfile(os.path.join(folder, n)) for n in (MODEL_FILENAME, VOCAB_FILENAME)):
        return
    other = read_hf_tokenizer(folder)
    if other.fingerprint != tokenizer.fingerprint:
        raise PretrainedError(
            f"{folder} holds another tokenizer ({describe(other)}) than {where[DISCRIMINATOR]} "
            f"({describe(tokenizer)}); a pair's networks share one vocabulary: put the "
            "generator and discriminator of one model side by side"
        )


def _with_fresh_generator(params: dict, spec: networks.ElectraSpec, seed: int = 0) -> dict:
    """`params` plus every subtree it lacks, initialised as networks.Electra does.

    Kernels and embeddings ~ truncated normal (+-2 std, std initializer_range), except the
    embedding projection's kernel, Glorot-uniform as in the original; LayerNorm scales 1, biases
    0; drawn with numpy, because compiling Flax's init for this takes seconds.
    """
    rng = np.random.default_rng(seed)

    def init(path, leaf) -> np.ndarray:
        keys = [str(getattr(p, "key", p)) for p in path]
        name = keys[-1]
        if name == "scale":
            return np.ones(leaf.shape, np.float32)
        if name.endswith("bias"):
            return np.zeros(leaf.shape, np.float32)
        if name == "kernel" and "embeddings_project" in keys:
            limit = np.sqrt(6 / sum(leaf.shape))
            return rng.uniform(-limit, limit, leaf.shape).astype(np.float32)
        z = rng.standard_normal(leaf.shape)
        while (outside := np.abs(z) > 2).any():
            z[outside] = rng.standard_normal(int(outside.sum()))
        return (z * spec.initializer_range).astype(np.float32)

    missing = {k: v for k, v in abstract_params(spec).items() if k not in params}
    return {**jax.tree_util.tree_map_with_path(init, missing), **params}
