"""A pre-trained ELECTRA from wherever it lives: a workdir, an export, or a transformers checkpoint.

    import electra_jax
    model = electra_jax.load("runs/tiny")              # or runs/tiny/hf, or "hf:path/to/dir"
    ids = model.tokenize(["The chef cooked a meal."])  # int32 input_ids, segment_ids, input_mask
    logits = model.replaced_token_logits(ids)          # [batch, length] float32; > 0: "replaced"
    hidden = model.encode(ids)                         # [batch, length, hidden]

`load_pretrained(path)` is the plain-data layer the fine-tuning code builds on: the spec, the
parameters as a nested dict of float32 numpy arrays (the tree of `model.Electra`), the tokenizer
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
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from electra_jax import model

HF_PREFIX = "hf:"


class PretrainedError(ValueError):
    """A path that does not hold a usable pre-trained model; the message names it, in one line."""


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pre-trained ELECTRA as plain data.

    spec: the full spec (generator and discriminator), as trained (dtype included).
    params: nested dict of float32 numpy arrays, the tree of `model.Electra`'s params.
    tokenizer: `data.tokenizer.Tokenizer`, or `export.WordPieceTokenizer` (same interface) for
      checkpoints with a BERT vocabulary such as Google's released ELECTRA models.
    source: what was loaded, for logs (path, and the step of a workdir's checkpoint).
    """

    spec: model.ElectraSpec
    params: dict
    tokenizer: Any
    source: str


def load_pretrained(path: str) -> Pretrained:
    """Loads a pre-training workdir, an export dir D, or "hf:DIR" (see the module docstring).

    Raises:
      PretrainedError: the path is missing, is none of these, or holds damaged files.
    """
    path = os.fspath(path)
    path, step = split_step(path)
    if step is not None:
        return load_workdir(path, step)
    if path.startswith(HF_PREFIX):
        from electra_jax import export

        return export.read_hf(path[len(HF_PREFIX) :])
    if not os.path.isdir(path):
        raise PretrainedError(
            f"{path} does not exist or is not a directory; give a pre-training workdir, an "
            "export dir (python -m electra_jax.export) or hf:DIR"
        )
    kind = _kind(path)
    if kind == "workdir":
        return load_workdir(path)
    if kind == "hf":
        from electra_jax import export

        return export.read_hf(path)
    raise PretrainedError(
        f"{path} is neither a workdir (config.json and checkpoints/) nor an export "
        "(discriminator/ and generator/ with config.json); give one of those or hf:DIR"
    )


def split_step(path: str) -> tuple[str, int | None]:
    """'WORKDIR@STEP' -> (WORKDIR, STEP); any other path (one that exists as named included,
    so a folder whose name has an '@' still loads) -> (path, None)."""
    head, sep, tail = path.rpartition("@")
    if not sep or not head or not tail.isdigit() or os.path.exists(path):
        return path, None
    return head, int(tail)


def _kind(path: str) -> str | None:
    """'workdir', 'hf' (an export or a transformers folder) or None, from the files present."""
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return "workdir"
    if os.path.isfile(os.path.join(path, "discriminator", "config.json")):
        return "hf"
    config_path = os.path.join(path, "config.json")
    if os.path.isfile(config_path):
        try:
            with open(config_path) as f:
                config = json.load(f)
        except (OSError, ValueError):
            return "workdir"  # load_workdir reports the damaged file
        # Our run config has a `model` section; a transformers config says `model_type`.
        return "hf" if isinstance(config, dict) and "model_type" in config else "workdir"
    return None


# ------------------------------------------------------------------------------------ workdir


def read_run_config(workdir: str) -> dict:
    """WORKDIR/config.json, the resolved config the run was started with."""
    path = os.path.join(workdir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise PretrainedError(
            f"{path} is missing: {workdir} is not a pre-training workdir (train writes "
            "config.json at step 0)"
        ) from None
    except (OSError, ValueError) as e:
        raise PretrainedError(
            f"{path} cannot be read ({e}); restore it from a copy of the run"
        ) from None
    if not isinstance(config, dict) or not {"model", "generator"} <= set(config):
        raise PretrainedError(
            f"{path} has no model/generator sections: not the config of an electra_jax run"
        )
    return config


def spec_from_run_config(config: dict, vocab_size: int, where: str) -> model.ElectraSpec:
    """The model's spec from a run's config.json (as saved by loop.train)."""
    import ml_collections

    try:
        from electra_jax import objective

        name = config.get("objective", {}).get("name", "electra")
        return model.spec_from_config(
            ml_collections.ConfigDict(config["model"]),
            ml_collections.ConfigDict(config["generator"]),
            vocab_size,
            mlm_head=objective.needs_mlm_head(name),
        )
    except (KeyError, AttributeError, TypeError) as e:
        raise PretrainedError(
            f"{where} lacks a model field ({e}); is it from this version?"
        ) from None


def abstract_params(spec: model.ElectraSpec) -> Any:
    """The parameter tree's shapes (jax.ShapeDtypeStruct leaves), computed without allocating."""
    import jax

    return jax.eval_shape(lambda: model.init_params(model.Electra(spec), jax.random.PRNGKey(0)))


def check_params(params: Any, spec: model.ElectraSpec, where: str) -> None:
    """Raises PretrainedError unless `params` has exactly the tree and shapes `spec` implies."""
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


def restore_params(
    workdir: str, spec: model.ElectraSpec, step: int | None = None
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
    import jax
    import orbax.checkpoint as ocp

    from electra_jax import checkpointing

    directory = checkpointing.checkpoint_dir(workdir)
    if not checkpointing.has_checkpoints(workdir):
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
    from electra_jax.data import DataError
    from electra_jax.data.tokenizer import load_saved

    config = read_run_config(workdir)
    try:
        tokenizer = load_saved(os.path.join(workdir, "tokenizer"))
    except DataError as e:
        raise PretrainedError(f"{workdir}: {e}") from None
    spec = spec_from_run_config(config, tokenizer.vocab_size, os.path.join(workdir, "config.json"))
    params, step = restore_params(workdir, spec, step)
    return Pretrained(spec, params, tokenizer, f"{workdir} (checkpoint {step})")


# ------------------------------------------------------------------------------------ inference


class Model:
    """A loaded ELECTRA for inference: tokenize, replaced-token logits, discriminator states.

    Computes in float32 with the einsum attention (portable, and equal to the Hugging Face
    export's numbers), whatever dtype the run trained with. Inputs are padded internally to a
    length bucket (a power of two >= 16, at most max_position_embeddings) so that a new batch
    length seldom compiles a new program; padding keys are masked, so outputs are unchanged.
    """

    def __init__(self, pretrained: Pretrained):
        import jax

        self.pretrained = pretrained
        self.spec = dataclasses.replace(
            pretrained.spec, dtype="float32", remat="none", attention="einsum"
        )
        self.tokenizer = pretrained.tokenizer
        self.source = pretrained.source
        self.params = jax.device_put(pretrained.params)
        module = model.Electra(self.spec)

        def logits(params, ids, segments, mask):
            return module.apply(
                {"params": params}, ids, segments, mask, method=model.Electra.discriminator_logits
            )

        def hidden(params, ids, segments, mask):
            return module.apply(
                {"params": params}, ids, segments, mask, method=model.Electra.discriminator_hidden
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
        return tokenize(
            self.tokenizer,
            texts,
            max_length or self.spec.max_position_embeddings,
            pad_to=max_length,
        )

    def _run(self, fn, ids) -> np.ndarray:
        ids, segments, mask = _as_batch(ids)
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


def _as_batch(ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(ids, Mapping):
        input_ids = np.asarray(ids["input_ids"], np.int32)
        segments = ids.get("segment_ids")
        mask = ids.get("input_mask")
    else:
        input_ids, segments, mask = np.asarray(ids, np.int32), None, None
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    segments = np.zeros_like(input_ids) if segments is None else np.asarray(segments, np.int32)
    mask = np.ones_like(input_ids) if mask is None else np.asarray(mask, np.int32)
    return input_ids, segments, mask


def tokenize(
    tokenizer: Any,
    texts: str | Sequence[str | tuple[str, str]],
    max_length: int,
    pad_to: int | None = None,
) -> dict[str, np.ndarray]:
    """BERT-style rows from a tokenizer with our interface (see Model.tokenize)."""
    if isinstance(texts, str):
        texts = [texts]
    pairs = [isinstance(t, (tuple, list)) for t in texts]
    firsts = [t[0] if p else t for t, p in zip(texts, pairs, strict=True)]
    for t, p in zip(texts, pairs, strict=True):
        if (p and (len(t) != 2 or not all(isinstance(s, str) for s in t))) or (
            not p and not isinstance(t, str)
        ):
            raise TypeError(f"tokenize takes strings or (a, b) pairs of strings, got {t!r}")
    seconds = [t[1] for t, p in zip(texts, pairs, strict=True) if p]
    a_ids = tokenizer.encode_batch(firsts) if firsts else []
    b_iter = iter(tokenizer.encode_batch(seconds) if seconds else [])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    rows, segs = [], []
    for a, is_pair in zip(a_ids, pairs, strict=True):
        b = next(b_iter) if is_pair else None
        a = list(a)
        if b is None:
            if max_length < 2:
                raise ValueError(f"max_length={max_length} leaves no room for [CLS] and [SEP]")
            a = a[: max_length - 2]
            rows.append([cls, *a, sep])
            segs.append([0] * (len(a) + 2))
            continue
        if max_length < 3:
            raise ValueError(f"max_length={max_length} leaves no room for [CLS] and two [SEP]")
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
