"""What a fine-tuning workdir keeps of its model, and reading it back.

    WORKDIR/config.json        the run's full config (written when the run starts)
    WORKDIR/model.json         what the network is: family, task, label names, the spec, the
                               tokenizer's fingerprint, where the encoder came from (and the
                               pre-training's own records: corpus, steps, FLOPs), the command
    WORKDIR/tokenizer/         the tokenizer the run used (spm.model, or a BERT vocab.txt)
    WORKDIR/checkpoints/       orbax checkpoints every checkpoint.every_steps (and at the end):
                               the train state and every step's loss, for an exact resume
    WORKDIR/model.safetensors  the final weights, written when training ends

The final weights are a safetensors file of the parameter tree (keys joined with '/'), not an
orbax checkpoint: one file, written atomically (a temporary file renamed into place), readable
with numpy alone (no orbax, no device layout, no optimizer state, a third of the checkpoint's
size), memory-mapped by whoever reads it; the checkpoints are there to resume a run.
Every file is written atomically (jsonio.write_atomic: temporary file + os.replace).

The workdir may be gs:// (paths.py): there a file is one upload, which appears whole when it
completes; the weights and the tokenizer are written to a local temporary file or folder first
and then uploaded, the weights are read back with one download.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np

from electra_jax.data.tokenizer import MODEL_FILENAME, load_saved
from electra_jax.errors import DataError, PretrainedError
from electra_jax.finetune.prior_run import (  # noqa: F401  (read as saved.X by fine-tuning)
    FORMAT,
    VERSION,
    read_json,
    read_model,
)
from electra_jax.hf.read import HF_PREFIX
from electra_jax.model import networks as model_lib
from electra_jax.model.weights import check_finite, check_spec
from electra_jax.objectives.core import num_mask_slots
from electra_jax.pretrained import read_run_config
from electra_jax.pretraining import metrics
from electra_jax.store import checkpoint_steps, paths
from electra_jax.store.filenames import (  # noqa: F401  (read as saved.X by fine-tuning)
    CONFIG_FILE,
    EXPORT_MANIFEST,
    METRICS_FILE,
    MODEL_FILE,
    RESULTS_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
)
from electra_jax.store.jsonio import one_line

# ------------------------------------------------------------------------------------ the spec


def spec_to_json(spec: model_lib.ElectraSpec) -> dict:
    """The spec as JSON fields (activation_sharding, platform and batch_sharding, which describe
    the devices of one run, are not kept)."""
    out = dataclasses.asdict(spec)
    for devices in ("activation_sharding", "platform", "batch_sharding"):
        out.pop(devices)
    return out


def spec_from_json(fields: Any, where: str) -> model_lib.ElectraSpec:
    """The spec of model.json; PretrainedError for a damaged one."""
    try:
        fields = dict(fields)
        for network in ("discriminator", "generator"):
            fields[network] = model_lib.EncoderSpec(**fields[network])
        spec = model_lib.ElectraSpec(**fields)
    except (TypeError, KeyError, ValueError) as e:
        raise PretrainedError(
            f"{where}: the spec is damaged ({one_line(e, 120)}); restore model.json from a copy "
            "of the run"
        ) from None
    check_spec(spec, where)
    return spec


# ------------------------------------------------------------------------------------ weights


def flatten(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """{'a/b/kernel': array} of a nested parameter tree, as contiguous float32 numpy arrays."""
    out = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = np.ascontiguousarray(np.asarray(value, np.float32))
    return out


def unflatten(tensors: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in tensors.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def save_weights(workdir: str, params: dict) -> str:
    """WORKDIR/model.safetensors from a parameter tree, atomically; returns its path. In a
    bucket, written to a local temporary file first, then uploaded in one upload."""
    # safetensors: only on the path that uses it (an optional extra, or slow to import).
    from safetensors.numpy import save_file

    path = paths.join(workdir, WEIGHTS_FILE)
    paths.write_via(path, lambda tmp: save_file(flatten(params), tmp, metadata={"format": FORMAT}))
    return path


def load_weights(workdir: str, expected: dict) -> dict:
    """WORKDIR/model.safetensors as a nested tree of float32 numpy arrays, checked against the
    shapes of `expected` (a tree of arrays or ShapeDtypeStructs)."""
    # safetensors: only on the path that uses it (an optional extra, or slow to import).
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = paths.join(workdir, WEIGHTS_FILE)
    if not paths.isfile(path):
        raise PretrainedError(
            f"{path} is missing: {workdir} holds no saved weights (a fine-tuning saves them when "
            "its last step is done); finish the run (rerun the same command) first"
        )
    try:
        # A bucket's file in one download (safetensors reads only local files itself).
        with paths.local_copy(path) as local:
            tensors = load_file(local)
    except (OSError, SafetensorError) as e:
        raise PretrainedError(
            f"{path} cannot be read ({one_line(e, 200)}); rerun the fine-tuning to write it again"
        ) from None
    want = {k: tuple(v.shape) for k, v in flatten_shapes(expected).items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        wrong = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
        raise PretrainedError(
            f"{path} does not hold this network's parameters ({wrong[0]}: "
            f"{got.get(wrong[0])} saved, {want.get(wrong[0])} expected); rerun the fine-tuning"
        )
    check_finite(tensors, path)
    return unflatten(tensors)


def flatten_shapes(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(flatten_shapes(value, name + "/") if isinstance(value, dict) else {name: value})
    return out


# ------------------------------------------------------------------------------------ tokenizer


def save_tokenizer(tokenizer: Any, workdir: str) -> None:
    """WORKDIR/tokenizer/ with the tokenizer's files, unless they are there already (a tokenizer
    trained for the run is trained into that folder). Written into a temporary folder that is
    renamed into place; in a bucket, written locally and then uploaded file by file, spm.model
    last (its presence says the set is whole)."""
    folder = paths.join(workdir, TOKENIZER_DIR)
    if paths.isdir(folder):
        try:
            if load_saved(folder).fingerprint == tokenizer.fingerprint:
                return
        except Exception:  # a damaged or foreign folder: replaced by the files below
            pass
    paths.replace_files(folder, tokenizer.save, last=MODEL_FILENAME)


def load_tokenizer(workdir: str, fingerprint: str | None = None):
    """The run's tokenizer from WORKDIR/tokenizer, checked against model.json's fingerprint."""
    folder = paths.join(workdir, TOKENIZER_DIR)
    try:
        tokenizer = load_saved(folder)
    except DataError as e:
        raise PretrainedError(f"{workdir}: {one_line(e, 1000)}") from None
    if fingerprint and tokenizer.fingerprint != fingerprint:
        raise PretrainedError(
            f"{folder} is not the tokenizer this run trained with (its fingerprint differs from "
            f"{paths.join(workdir, MODEL_FILE)}'s); restore it from a copy of the run"
        )
    return tokenizer


# ------------------------------------------------------------------------------------ records


def pretraining_record(init_from: str, pre: Any) -> dict:
    """What a fine-tuning records of the model it starts from, from that model's own files: the
    source; for a pre-training workdir also its corpus, objective, step, batch and sequence
    length, its counted training FLOPs up to that step (metrics.count_flops, as the run's MFU
    uses) and the metrics.jsonl row of that step; for an export, its export.json."""
    record: dict = {"source": pre.source, "init_from": init_from}
    path, _ = checkpoint_steps.split_step(init_from)
    if path.startswith(HF_PREFIX):
        path = path[len(HF_PREFIX) :]
    record["path"] = paths.absolute(path)
    step = getattr(pre, "step", None)
    if step is None:
        manifest = paths.join(path, EXPORT_MANIFEST)
        record["kind"] = "export" if paths.isfile(manifest) else "transformers"
        if paths.isfile(manifest):
            with contextlib.suppress(PretrainedError):
                record["export"] = read_json(manifest, "")
        return record
    record["kind"] = "workdir"
    record["step"] = int(step)
    try:
        config = read_run_config(path)  # upgraded: an older one's keys as they meant
        data, train, obj = config["data"], config["train"], config["objective"]
        name, mask_prob = obj["name"], obj["mask_prob"]
        seq_length, batch_size = int(data["seq_length"]), int(train["batch_size"])
        flops = metrics.count_flops(
            pre.spec, batch_size, seq_length, num_mask_slots(seq_length, mask_prob), name
        )["total"]
        record.update(
            corpus=data.get("mixture") or data.get("source"),
            objective=name,
            seq_length=seq_length,
            batch_size=batch_size,
            planned_steps=train.get("num_steps"),
            flops_per_step=flops,
            flops=flops * int(step),
        )
    except (PretrainedError, KeyError, TypeError, ValueError):
        pass  # an older config.json: the card says what it does not know
    rows = [
        r
        for r in metrics.read_rows(paths.join(path, METRICS_FILE))
        if isinstance(r, dict) and isinstance(r.get("step"), int) and r["step"] <= step
    ]
    if rows:
        record["metrics"] = rows[-1]
    return record
