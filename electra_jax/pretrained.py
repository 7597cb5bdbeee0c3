"""A pre-trained ELECTRA from wherever it lives: a workdir, an export, or a transformers checkpoint.

    import electra_jax
    model = electra_jax.load("runs/tiny")              # or runs/tiny/hf, or "hf:path/to/dir"
    ids = model.tokenize(["The chef cooked a meal."])  # int32 input_ids, segment_ids, input_mask
    logits = model.replaced_token_logits(ids)          # [batch, length] float32; > 0: "replaced"
    hidden = model.encode(ids)                         # [batch, length, hidden]

`load_pretrained(path)` is the plain-data layer the fine-tuning code builds on: the spec, the
parameters as a nested dict of float32 numpy arrays (the tree of `networks.Electra`), the tokenizer
and a description of the source. `load(path)` wraps it in `Model`, whose functions are compiled.

Paths:
  WORKDIR       a pre-training workdir: config.json, tokenizer/spm.model, the newest readable
                checkpoint in checkpoints/ (only the parameters are read; nothing is written)
  WORKDIR@STEP  the same workdir's checkpoint of that step (e.g. an earlier compute budget)
  D             an export (`python -m electra_jax.export`): D/discriminator and D/generator
  hf:DIR        DIR holding transformers ELECTRA folders discriminator/ and generator/ (an export,
                or e.g. google/electra-small-discriminator and -generator downloaded side by
                side), or one discriminator folder (the generator is then freshly initialised)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from electra_jax.config import groups, pretrain_keys, schema
from electra_jax.data.tokenizer import load_saved
from electra_jax.errors import DataError
from electra_jax.hf.names import DISCRIMINATOR
from electra_jax.hf.read import HF_PREFIX, read_hf
from electra_jax.model import networks
from electra_jax.model.weights import (  # noqa: F401  (PretrainedError and Pretrained: public here too)
    Pretrained,
    PretrainedError,
    abstract_params,
    check_finite,
    check_params,
    check_size,
    check_spec,
)
from electra_jax.objectives import registry
from electra_jax.run import workdir as workdir_lib
from electra_jax.run.workdir import DATA_RECORD
from electra_jax.store import checkpoint_steps, filenames, jsonio, paths
from electra_jax.store.jsonio import json_kind, one_line


def load_pretrained(path: str) -> Pretrained:
    """Loads a pre-training workdir, an export dir D, or "hf:DIR" (see the module docstring).

    Raises:
      PretrainedError: the path is missing, is none of these, or holds damaged files.
    """
    path = os.fspath(path)
    path, step = checkpoint_steps.split_step(path)
    if step is not None:
        # Only a pre-training workdir has checkpoints to pick; anything else is named as what
        # it is, not sent to the workdir reader, which would ask to restore a config.json.
        kind = "hf" if path.startswith(HF_PREFIX) else folder_kind(path)
        if kind in ("fine-tuning", "hf"):
            what = "a fine-tuning workdir" if kind == "fine-tuning" else "an export or hf: folder"
            raise PretrainedError(
                f"{path}@{step}: @STEP picks a checkpoint of a pre-training workdir, and {path} "
                f"is {what}, which keeps none; give {path} without @{step}"
            )
        return load_workdir(path, step)
    if path.startswith(HF_PREFIX):
        return read_hf(path[len(HF_PREFIX) :])
    if not paths.isdir(path):
        raise PretrainedError(
            f"{path} does not exist or is not a directory; give a pre-training workdir, an "
            "export dir (python -m electra_jax.export) or hf:DIR"
        )
    kind = folder_kind(path)
    if kind == "fine-tuning":
        raise PretrainedError(
            f"{path} is a fine-tuning workdir; electra_jax.load({path!r}) predicts with it, and "
            "init_from takes a pre-training workdir, an export or hf:DIR"
        )
    if kind == "workdir":
        return load_workdir(path)
    if kind == "hf":
        return read_hf(path)
    raise PretrainedError(
        f"{path} is neither a workdir (config.json and checkpoints/) nor an export "
        "(discriminator/ and generator/ with config.json); give one of those or hf:DIR"
    )


def folder_kind(path: str) -> str | None:
    """'workdir', 'hf' (an export or a transformers folder), 'fine-tuning' or None, from the
    files present."""
    if workdir_lib.kind_of(path) == workdir_lib.FINETUNE:
        return "fine-tuning"
    if paths.isdir(paths.join(path, filenames.CHECKPOINTS_DIR)):
        return "workdir"
    if paths.isfile(paths.join(path, DISCRIMINATOR, filenames.CONFIG_FILE)):
        return "hf"
    config_path = paths.join(path, filenames.CONFIG_FILE)
    if paths.isfile(config_path):
        try:
            config = jsonio.loads(paths.read_bytes(config_path))
        except (OSError, ValueError):
            return "workdir"  # load_workdir reports the damaged file
        # Our run config has a `model` section; a transformers config says `model_type`.
        return "hf" if isinstance(config, dict) and "model_type" in config else "workdir"
    return None


# ------------------------------------------------------------------------------------ workdir


def read_run_config(workdir: str) -> dict:
    """WORKDIR/config.json, the resolved config the run was started with, upgraded: the keys
    added since the run was stored filled in as schema.Key.absent says the run had them
    (unrolled layers, one shared embedding, no held-out rows). The one reader of a stored
    pre-training config; PretrainedError (one line) for a missing, unreadable or damaged one."""
    path = paths.join(workdir, filenames.CONFIG_FILE)
    try:
        config = jsonio.loads(paths.read_bytes(path))
    except FileNotFoundError:
        raise PretrainedError(
            f"{path} is missing: {workdir} is not a pre-training workdir (train writes "
            "config.json at step 0)"
        ) from None
    except (OSError, ValueError) as e:
        raise PretrainedError(
            f"{path} cannot be read ({one_line(e)}); restore it from a copy of the run"
        ) from None
    if not isinstance(config, dict):
        raise PretrainedError(
            f"{path} holds a JSON {json_kind(config)}, not an object: not the config of an "
            "electra_jax run; restore it from a copy of the run"
        )
    for section in ("model", "generator"):
        if section not in config:
            raise PretrainedError(
                f"{path} has no {section} section: not the config of an electra_jax run; "
                "restore it from a copy of the run"
            )
    for section in ("model", "generator", "objective"):
        if section in config and not isinstance(config[section], dict):
            raise PretrainedError(
                f"{path}: the {section} section is a JSON {json_kind(config[section])}, not an "
                "object; restore config.json from a copy of the run"
            )
    # Every config.json has the sizes: one missing is damage (a KeyError), not age.
    try:
        for section, fields in (("model", _RUN_SIZES), ("generator", ("hidden_fraction",))):
            for field in fields:
                config[section][field]  # noqa: B018
    except KeyError as e:
        raise PretrainedError(
            f"{path} lacks a model field or holds one of the wrong type ({one_line(e, 120)}); "
            "is it from this version?"
        ) from None
    return schema.upgrade(config, pretrain_keys.KEYS)


# The sizes of a run config's model section (the shared model shape), named as SIZE_LIMITS
# names them.
_RUN_SIZES = tuple(name.partition(".")[2] for name in groups.MODEL_SHAPE)


def spec_from_run_config(config: dict, vocab_size: int, where: str) -> networks.ElectraSpec:
    """The model's spec from a run's config.json as read_run_config returns it (upgraded)."""
    for field in _RUN_SIZES:  # before generator_spec computes with them
        if field in config["model"]:
            check_size(config["model"][field], f"model.{field}", field, where)
    try:
        spec = networks.spec_from_config(
            ml_collections.ConfigDict(config["model"]),
            ml_collections.ConfigDict(config["generator"]),
            vocab_size,
            **registry.model_heads(ml_collections.ConfigDict(config["objective"])),
        )
    except (KeyError, AttributeError, TypeError, ValueError, OverflowError) as e:
        raise PretrainedError(
            f"{where} lacks a model field or holds one of the wrong type ({one_line(e, 120)}); "
            "is it from this version?"
        ) from None
    check_spec(spec, where)
    return spec


@contextlib.contextmanager
def _quiet_absl():
    # orbax logs at WARNING that a read-only manager is read-only; nothing a user can act on.
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _set_aside(directory: str) -> list[str]:
    """The checkpoints a run set aside as damaged in `directory` (`<step>.corrupt`), newest
    first."""
    suffix = checkpoint_steps.CORRUPT_SUFFIX
    try:
        names = paths.listdir(directory)
    except OSError:
        return []
    steps = [n for n in names if n.endswith(suffix) and n[: -len(suffix)].isdigit()]
    return sorted(steps, key=lambda n: -int(n[: -len(suffix)]))


def restore_params(
    workdir: str, spec: networks.ElectraSpec, step: int | None = None
) -> tuple[dict, int]:
    """The params of the newest restorable checkpoint in WORKDIR/checkpoints, as numpy arrays;
    with `step`, of that checkpoint only (no fallback: another step is another model).

    Only the `params` subtree of the saved TrainState is read (orbax partial restore), into host
    memory, so the optimizer state is never loaded and no device layout is needed. The manager is
    read-only: a run training in the same workdir is not disturbed. A checkpoint that fails to
    restore is skipped with a warning (train moves such ones aside; loading never renames).

    Returns:
      (params, step).
    """
    directory = checkpoint_steps.checkpoint_dir(workdir)
    if not checkpoint_steps.has_checkpoints(workdir):
        damaged = _set_aside(directory)
        if damaged:  # not "train first": the run trained, and its checkpoints were damaged
            raise PretrainedError(
                f"{directory} holds no usable checkpoint: every one there was set aside as "
                f"damaged ({', '.join(damaged[:5])}{' ...' if len(damaged) > 5 else ''}) by a "
                "run that could not restore it; nothing was loaded. The training's log said "
                "why; train again in a new --workdir, or restore the checkpoints from a copy"
            )
        raise PretrainedError(
            f"{directory} holds no checkpoint yet; train first (python -m electra_jax.train "
            f"--workdir={workdir} ...) or point at another workdir"
        )
    target = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), abstract_params(spec))
    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target
    )
    failed = []
    with _quiet_absl():
        manager = ocp.CheckpointManager(
            directory,
            options=ocp.CheckpointManagerOptions(read_only=True, create=False),
            item_names=("state", "data"),
        )
        try:
            steps = sorted(manager.all_steps(), reverse=True)
            if step is not None:
                if step not in steps:
                    raise PretrainedError(
                        f"{directory} has no checkpoint of step {step}; it has "
                        f"{', '.join(map(str, sorted(steps))) or 'none'}"
                    )
                steps = [step]
            for step in steps:
                try:
                    restored = manager.restore(
                        step,
                        args=ocp.args.Composite(
                            state=ocp.args.PyTreeRestore(
                                item={"params": target},
                                restore_args={"params": restore_args},
                                partial_restore=True,
                            )
                        ),
                    )
                except Exception as e:  # orbax and tensorstore raise many types for bad files
                    reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
                    failed.append(f"{step} ({reason})")
                    continue
                params = restored["state"]["params"]
                check_params(params, spec, f"{directory}/{step}")
                # Not skipped for an older one: a diverged checkpoint is readable, and
                # another step is another model.
                check_finite(params, f"{directory}/{step}")
                if failed:
                    logging.warning("skipped unreadable checkpoint(s) %s", "; ".join(failed))
                params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
                return params, int(step)
        finally:
            manager.close()
    raise PretrainedError(
        f"no checkpoint in {directory} can be restored: {'; '.join(failed)}"
        if failed
        else f"{directory} holds no finished checkpoint; train first"
    )


def load_workdir(workdir: str, step: int | None = None) -> Pretrained:
    """The newest checkpoint's (or step `step`'s) parameters, the run's tokenizer and the spec
    from config.json."""
    config = read_run_config(workdir)
    try:
        tokenizer = load_saved(os.path.join(workdir, filenames.TOKENIZER_DIR))
    except DataError as e:
        raise PretrainedError(f"{workdir}: {one_line(e, 1000)}") from None
    check_recorded_tokenizer(workdir, tokenizer)
    spec = spec_from_run_config(
        config, tokenizer.vocab_size, os.path.join(workdir, filenames.CONFIG_FILE)
    )
    params, step = restore_params(workdir, spec, step)
    return Pretrained(spec, params, tokenizer, f"{workdir} (checkpoint {step})", step)


# ------------------------------------------------------------------------------------ inference


class Model:
    """A loaded ELECTRA for inference: tokenize, replaced-token logits, discriminator states.

    Computes in float32 with the einsum attention (portable, and equal to the Hugging Face
    export's numbers), whatever dtype the run trained with. Inputs are padded internally to a
    length bucket (a power of two >= 16, at most max_position_embeddings) so that a new batch
    length seldom compiles a new program; padding keys are masked, so outputs are unchanged.
    """

    def __init__(self, pretrained: Pretrained):
        self.pretrained = pretrained
        self.spec = dataclasses.replace(
            pretrained.spec, dtype="float32", remat="none", attention="einsum"
        )
        self.tokenizer = pretrained.tokenizer
        self.source = pretrained.source
        self.params = jax.device_put(pretrained.params)
        module = networks.Electra(self.spec)

        def logits(params, ids, segments, mask):
            return module.apply(
                {"params": params},
                ids,
                segments,
                mask,
                method=networks.Electra.discriminator_logits,
            )

        def hidden(params, ids, segments, mask):
            return module.apply(
                {"params": params},
                ids,
                segments,
                mask,
                method=networks.Electra.discriminator_hidden,
            )

        self._logits = jax.jit(logits)
        self._hidden = jax.jit(hidden)

    def __repr__(self) -> str:
        d = self.spec.discriminator
        return (
            f"electra_jax.Model({self.source}: {d.num_layers} layers, hidden {d.hidden_size}, "
            f"vocab {self.spec.vocab_size})"
        )

    def tokenize(
        self, texts: str | Sequence[str | tuple[str, str]], max_length: int | None = None
    ) -> dict[str, np.ndarray]:
        """[CLS] A [SEP] (B [SEP]) rows for texts or (a, b) pairs: dict of int32 [batch, length].

        Keys input_ids, segment_ids (0 for [CLS] A [SEP], 1 for B [SEP]) and input_mask (1 for
        tokens, 0 for padding). Rows are padded to the longest, or to max_length when given; a row
        longer than max_length (default: max_position_embeddings) loses tokens from the end of
        its longer segment first, as BERT's truncation does.
        """
        most = self.spec.max_position_embeddings
        if max_length is not None:  # 0 is not "the default": it is refused, as is most + 1
            length_argument("max_length", max_length, 2, most)
        return tokenize(self.tokenizer, texts, max_length or most, pad_to=max_length)

    def _run(self, fn, ids) -> np.ndarray:
        ids, segments, mask = _as_batch(ids, self.spec.vocab_size, self.spec.type_vocab_size)
        batch, length = ids.shape
        if length > self.spec.max_position_embeddings:
            raise ValueError(
                f"length {length} exceeds max_position_embeddings="
                f"{self.spec.max_position_embeddings}; tokenize with max_length"
            )
        bucket = min(max(16, 1 << (length - 1).bit_length()), self.spec.max_position_embeddings)
        pad = ((0, 0), (0, bucket - length))
        out = fn(
            self.params,
            np.pad(ids, pad, constant_values=self.tokenizer.pad_id),
            np.pad(segments, pad),
            np.pad(mask, pad),
        )
        return np.asarray(out)[:, :length]

    def replaced_token_logits(self, ids: Mapping[str, Any] | Any) -> np.ndarray:
        """Discriminator logits: a `tokenize` dict (or bare input_ids [B, L]) -> [B, L] float32.

        > 0 means "replaced". Without segment_ids / input_mask, all tokens are segment 0 and real.
        """
        return self._run(self._logits, ids)

    def encode(self, ids: Mapping[str, Any] | Any) -> np.ndarray:
        """Discriminator's last hidden states: [B, L] ids -> [B, L, H] float32."""
        return self._run(self._hidden, ids)


def _as_batch(
    ids: Mapping[str, Any] | Any, vocab_size: int, type_vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, segment_ids, input_mask) as int32 [B, L], each checked against the model.

    JAX's gather fills the row of an id outside an embedding table with NaNs, which would
    silently turn the whole output into NaNs; so every value is checked here.

    Raises:
      ValueError: a missing or ragged array, a shape mismatch, or a value out of its range; the
        message names the field, the value, where it is and the allowed range.
    """
    if isinstance(ids, Mapping):
        if "input_ids" not in ids:
            raise ValueError(
                f"the batch has no input_ids (its keys: {sorted(map(str, ids))}); pass a "
                "tokenize() dict or an int array [batch, length]"
            )
        input_ids, segments, mask = ids["input_ids"], ids.get("segment_ids"), ids.get("input_mask")
    else:
        input_ids, segments, mask = ids, None, None
    input_ids = _int_array("input_ids", input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    segments = np.zeros_like(input_ids) if segments is None else _int_array("segment_ids", segments)
    mask = np.ones_like(input_ids) if mask is None else _int_array("input_mask", mask)
    for name, value in (("segment_ids", segments), ("input_mask", mask)):
        if value.shape != input_ids.shape:
            raise ValueError(
                f"{name} has shape {value.shape} but input_ids has {input_ids.shape}; give all "
                "three as [batch, length] arrays of one shape"
            )
    _check_range(
        "input_ids",
        input_ids,
        vocab_size,
        "token ids must be in [0, {stop}) (the model's vocab_size); tokenize with this "
        "model's tokenizer",
    )
    _check_range(
        "segment_ids",
        segments,
        type_vocab_size,
        "segment ids must be in [0, {stop}) (the model's type_vocab_size)",
    )
    _check_range("input_mask", mask, 2, "it must be 1 for tokens and 0 for padding")
    return input_ids.astype(np.int32), segments.astype(np.int32), mask.astype(np.int32)


def _int_array(name: str, value: Any) -> np.ndarray:
    """`value` as an integer numpy array (bool too, for input_mask); ValueError otherwise."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"{name} is not a rectangular array [batch, length]; pad its rows to one length"
        ) from None
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind not in ("iub" if name == "input_mask" else "iu"):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}; pass ids as ints")
    return array


def _check_range(name: str, array: np.ndarray, stop: int, rule: str) -> None:
    """ValueError naming the first value of `array` outside [0, stop), where it is, and `rule`
    (with {stop} filled in)."""
    bad = (array < 0) | (array >= stop)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} holds {array[where]} at {list(where)}; {rule.format(stop=stop)}")


def text_argument(name: str, value: Any) -> str:
    """`value`, a string that a tokenizer can read; TypeError or ValueError naming `name`.

    A lone surrogate (text decoded with errors='surrogateescape', or half of a pair cut from a
    UTF-16 source) has no UTF-8 form, and the tokenizers fail on it deep inside."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{name} holds a lone surrogate {value[e.start]!r} at character {e.start}, which is "
            "not text; decode the source with its real encoding (or errors='replace')"
        ) from None
    return value


def texts_argument(texts: Any, name: str = "texts") -> list[str | tuple[str, str]]:
    """A string, or a non-empty list of strings or (a, b) pairs of strings, as a list; each
    string checked by `text_argument`. TypeError or ValueError naming `name` (and the item)."""
    if isinstance(texts, str):
        return [text_argument(name, texts)]
    if isinstance(texts, bytes | bytearray) or not isinstance(texts, Sequence):
        raise TypeError(
            f"{name} must be a string or a list of strings or (a, b) pairs of strings, got "
            f"{type(texts).__name__}"
        )
    if not texts:
        raise ValueError(f"{name} is empty; give at least one string or (a, b) pair")
    out: list[str | tuple[str, str]] = []
    for i, t in enumerate(texts):
        if isinstance(t, tuple | list):
            if len(t) != 2:
                raise TypeError(f"{name}[{i}] must be a string or an (a, b) pair, got {len(t)}")
            a, b = (text_argument(f"{name}[{i}][{j}]", s) for j, s in enumerate(t))
            out.append((a, b))
        else:
            if not isinstance(t, str):
                raise TypeError(
                    f"{name}[{i}] must be a string or an (a, b) pair of strings, got "
                    f"{type(t).__name__}"
                )
            out.append(text_argument(f"{name}[{i}]", t))
    return out


def length_argument(name: str, value: Any, least: int, most: int | None = None) -> int:
    """`value`, a whole number in [least, most]; TypeError or ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__}")
    if value < least or (most is not None and value > most):
        room = f"at least {least}" if most is None else f"in [{least}, {most}]"
        raise ValueError(f"{name}={value} must be {room}")
    return int(value)


def tokenize(
    tokenizer: Any,
    texts: str | Sequence[str | tuple[str, str]],
    max_length: int,
    pad_to: int | None = None,
) -> dict[str, np.ndarray]:
    """BERT-style rows from a tokenizer with our interface (see Model.tokenize)."""
    texts = texts_argument(texts)
    pairs = [isinstance(t, tuple) for t in texts]
    # [CLS] A [SEP], and B [SEP] after it for a pair: room for the special tokens at least.
    length_argument("max_length", max_length, 3 if any(pairs) else 2)
    firsts = [t[0] if p else t for t, p in zip(texts, pairs, strict=True)]
    seconds = [t[1] for t, p in zip(texts, pairs, strict=True) if p]
    a_ids = tokenizer.encode_batch(firsts) if firsts else []
    b_iter = iter(tokenizer.encode_batch(seconds) if seconds else [])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    rows, segs = [], []
    for a, is_pair in zip(a_ids, pairs, strict=True):
        b = next(b_iter) if is_pair else None
        a = list(a)
        if b is None:
            a = a[: max_length - 2]
            rows.append([cls, *a, sep])
            segs.append([0] * (len(a) + 2))
            continue
        b = list(b)
        while len(a) + len(b) > max_length - 3:
            (a if len(a) > len(b) else b).pop()
        rows.append([cls, *a, sep, *b, sep])
        segs.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
    width = pad_to if pad_to is not None else max((len(r) for r in rows), default=0)
    out = {
        "input_ids": np.full((len(rows), width), tokenizer.pad_id, np.int32),
        "segment_ids": np.zeros((len(rows), width), np.int32),
        "input_mask": np.zeros((len(rows), width), np.int32),
    }
    for i, (row, seg) in enumerate(zip(rows, segs, strict=True)):
        out["input_ids"][i, : len(row)] = row
        out["segment_ids"][i, : len(row)] = seg
        out["input_mask"][i, : len(row)] = 1
    return out


def load(path: str) -> Model:
    """`electra_jax.load`: a workdir, an export dir or "hf:DIR" -> a compiled `Model`."""
    return Model(load_pretrained(path))


def check_recorded_tokenizer(workdir: str, tokenizer) -> None:
    """PretrainedError when the run's data record (workdir.DATA_RECORD, written by train) names
    another tokenizer than WORKDIR/tokenizer holds: the checkpoints were trained with that one,
    and another of the same size would load and tokenize without a word. A workdir without a
    readable record (one from before it) is taken as it is."""
    path = paths.join(workdir, DATA_RECORD)
    try:
        record = jsonio.loads(paths.read_bytes(path))
        recorded = record["fields"]["tokenizer_fingerprint"]
    except (OSError, ValueError, TypeError, KeyError):
        return  # missing or damaged: train reports a damaged record; loading needs none
    if isinstance(recorded, str) and recorded != tokenizer.fingerprint:
        raise PretrainedError(
            f"{paths.join(workdir, 'tokenizer')} is not the tokenizer the run trained with "
            f"({path} records sha256 {recorded[:12]}, the folder holds "
            f"{tokenizer.fingerprint[:12]}): put the run's tokenizer back from a copy"
        )
