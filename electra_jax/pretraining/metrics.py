"""What a run reports: counted FLOPs, MFU, metrics.jsonl, TensorBoard scalars, progress lines.

Only process 0 writes. FLOPs are counted analytically from the model's shapes (matmuls x 2 per
multiply-add, x 3 for forward + backward), so MFU compares what the model needs with what the
hardware could do, independent of how XLA schedules it.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from electra_jax.errors import ConfigError
from electra_jax.model.networks import ElectraSpec, EncoderSpec
from electra_jax.model.sharding import log  # noqa: F401  (metrics.log: the wing's lines)
from electra_jax.objectives import registry
from electra_jax.objectives.catalog import DEFAULT
from electra_jax.objectives.core import FlopParts
from electra_jax.pretraining import topology, wandb_mirror
from electra_jax.store import filenames, jsonio, paths, workdir_files

# Dense (no 2:4 sparsity) bfloat16 tensor-core peak FLOP/s per GPU, matched against jax's
# device_kind (the CUDA device name: 'NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe', 'NVIDIA L4'),
# each with the NVIDIA page that publishes it. Where a page gives the figure with sparsity only
# (marked so), the dense one is half of it. TPUs' are in topology.GENERATIONS (per chip, with HBM
# and their sources).
_NVIDIA = "https://www.nvidia.com/en-us/data-center/"
GPU_PEAKS = {
    "A100": (312e12, _NVIDIA + "a100/"),
    # The SXM card (device_kind 'NVIDIA H100 80GB HBM3'); the PCIe card and the NVL (two PCIe
    # cards over NVLink) run slower clocks: 1,979, 1,513 and 1,671 TFLOP/s with sparsity.
    "H100": (989e12, _NVIDIA + "h100/"),
    "H100 PCIe": (756e12, _NVIDIA + "h100/"),
    "H100 NVL": (835e12, _NVIDIA + "h100/"),
    "H200": (989e12, _NVIDIA + "h200/"),
    "H200 NVL": (835e12, _NVIDIA + "h200/"),
    # HGX B200: 36 PFLOP/s with sparsity for its 8 GPUs. GB200 NVL72: 10 PFLOP/s with sparsity
    # per superchip of 2 GPUs, which run faster than the HGX ones.
    "B200": (2250e12, _NVIDIA + "hgx/"),
    "GB200": (2500e12, _NVIDIA + "gb200-nvl72/"),
    "L4": (121e12, _NVIDIA + "l4/"),  # 242 TFLOP/s with sparsity
    "L40S": (362e12, _NVIDIA + "l40s/"),
}


def _gpu_peak(device_kind: str) -> float | None:
    """The table's peak for a GPU device kind: the longest name that stands whole in it, so
    that 'H100 PCIe' wins over 'H100', 'L40S' is not taken for 'L4', nor 'GB200' for 'B200'."""
    for name in sorted(GPU_PEAKS, key=len, reverse=True):
        if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", device_kind, re.IGNORECASE):
            return GPU_PEAKS[name][0]
    return None


def peak_flops_per_device(device_kind: str, override: float = 0.0) -> float | None:
    """The configured peak if given, else the tables' entry for this device kind (a TPU
    generation's per device: its chip's, halved where each core is a device, as on v2, v3 and
    TPU7x), else None."""
    if override and override > 0:
        return float(override)
    generation = topology.generation_for_kind(device_kind)
    if generation is not None:
        return generation.bf16_flops_per_device
    return _gpu_peak(device_kind)


def unknown_peak_line(device, override: float = 0.0) -> str | None:
    """One line for an accelerator whose peak no table knows, naming the setting that gives it;
    None on a CPU (no MFU is expected there) or where the peak is known."""
    if device.platform == "cpu" or peak_flops_per_device(device.device_kind, override):
        return None
    return (
        f"warning: no peak FLOP/s is known for {device.device_kind!r}, so metrics.jsonl's mfu "
        "stays empty; set --config.log.peak_flops=<its dense bfloat16 FLOP/s per device>"
    )


def _encoder_flops_per_token(e: EncoderSpec, embedding_size: int, seq_length: int) -> int:
    """Forward FLOPs per token of one encoder stack (2 per multiply-add)."""
    h, f = e.hidden_size, e.intermediate_size
    flops = 2 * embedding_size * h if embedding_size != h else 0
    per_layer = 2 * 4 * h * h + 2 * 2 * h * f  # q, k, v, output; the two feed-forward matmuls
    per_layer += 2 * 2 * seq_length * h  # scores q.k and the weighted sum of values
    return flops + e.num_layers * per_layer


def count_flops(
    spec: ElectraSpec,
    batch_size: int,
    seq_length: int,
    num_slots: int,
    objective: str = DEFAULT,
) -> dict:
    """Training FLOPs of one step (forward + backward = 3 x forward) by part, for `objective`.

    Counts what the objective's step runs (the parts its `Objective.flops` adds up, in
    objectives/), so that objectives compare at equal compute: the encoders at every token, the
    generator's MLM head at the N masked slots, the replaced-token head at every token, the MLM
    head (dense + LayerNorm + the tied embedding output over the vocabulary) at the slots or
    every token, the generator's 1-unit baseline. The MLM head counts with the discriminator, as
    in `model.network_param_counts`. Parts an objective leaves unused are left out, as XLA drops
    them.

    Returns {'generator', 'discriminator', 'total'} in FLOPs for batch_size x seq_length tokens.
    """
    step = registry.get(objective)
    tokens = batch_size * seq_length
    slots = batch_size * num_slots
    e, v = spec.embedding_size, spec.vocab_size
    hd, hg = spec.discriminator.hidden_size, spec.generator.hidden_size
    rtd_head = 2 * hd * hd + 2 * hd  # dense, then the 1-unit output, per token
    mlm_head = 2 * hd * e + 2 * e * v  # dense to E, then the tied output over V, per position
    gen, disc = step.flops(
        FlopParts(
            generator=tokens * _encoder_flops_per_token(spec.generator, e, seq_length)
            + slots * (2 * hg * e + 2 * e * v),
            baseline=slots * 2 * hg,
            discriminator=tokens * _encoder_flops_per_token(spec.discriminator, e, seq_length),
            rtd_head=tokens * rtd_head,
            mlm_head_slots=slots * mlm_head,
            mlm_head_tokens=tokens * mlm_head,
            has_mlm_head=spec.mlm_head,
        )
    )
    train = {"generator": 3 * gen, "discriminator": 3 * disc}
    train["total"] = sum(train.values())
    return train


def read_rows(path: str, error: type[Exception] = workdir_files.WorkdirFileError) -> list[dict]:
    """The rows of a metrics.jsonl (or another JSON-lines file of the run), local or gs:// (a
    half-written last line from a crash is dropped); `error` naming the file and line for
    anything the run cannot have written (workdir_files.read_rows)."""
    return workdir_files.read_rows(path, error, by_step=True)


# A gs:// workdir's metrics.jsonl and events are uploaded whole at least this often (and at every
# checkpoint and at the end), since an object cannot be appended to.
REMOTE_UPLOAD_SECONDS = 60.0


class MetricsWriter:
    """metrics.jsonl + TensorBoard events, process 0 only.

    On resume from step N, rows past N (logged by the interrupted run after its last checkpoint)
    are dropped, so the file reads as one uninterrupted run.

    A gs:// workdir: an object store has no append, so both files are written as they are locally
    into a temporary folder on this host and uploaded whole (each one upload, which never leaves
    a partial object) at every checkpoint (`flush`, which the loop calls before each save), at
    most every REMOTE_UPLOAD_SECONDS otherwise, and at the end. metrics.jsonl stays one file that
    readers (read_rows, benchmarks, learning curves) read as before; rewriting it costs its size
    (a million steps logged every 100 are ~4 MB) once per checkpoint. A run killed outright loses
    only the rows since the last upload, all logged after its last checkpoint, which a resume
    drops anyway. TensorBoard gets one event file per run invocation, as locally.

    With `config` (the run's) naming a `log.wandb_project`, every row and the config are
    mirrored to W&B too (wandb_mirror.py).
    """

    def __init__(self, workdir: str, enabled: bool, resume_step: int = 0, config: Any = None):
        self.enabled = enabled
        self.path = paths.join(workdir, filenames.METRICS_FILE)
        self.previous: list[dict] = []
        self._tb = None
        self._mirror = None
        if not enabled:
            return
        if config is not None and config.log.wandb_project:
            self._mirror = wandb_mirror.Mirror.start(workdir, config, log)
        # ConfigError: train's one line for bad input (a row the run cannot have written).
        # All of them, for what a resume lost (timing.resume_columns).
        self.previous = read_rows(self.path, ConfigError)
        kept = [r for r in self.previous if r["step"] <= resume_step]
        # The workdir itself, or for a gs:// one a temporary folder on this host (uploaded).
        self._local = paths.LocalFolder(workdir, prefix="electra_jax-metrics-")
        local_path = os.path.join(self._local.path, filenames.METRICS_FILE)
        tb_dir = os.path.join(self._local.path, filenames.TENSORBOARD_DIR)
        self._uploaded = time.monotonic()
        jsonio.write_jsonl(local_path, kept)
        self._local.upload(filenames.METRICS_FILE)
        # Never through a link (paths.LinkRefused): the file it points at is not the run's.
        self._file = open(local_path, "a", opener=paths.no_follow_opener)  # noqa: SIM115
        # tensorboard: only on the path that uses it (an optional extra, or slow to import).
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._tb = EventFileWriter(tb_dir)

    def flush(self) -> None:
        """A gs:// workdir: uploads metrics.jsonl and the event file as they are now (the loop
        calls this before each checkpoint). Locally every row is on disk
        already: nothing is copied."""
        if not self.enabled:
            return
        self._file.flush()
        self._tb.flush()
        self._local.upload(filenames.METRICS_FILE, filenames.TENSORBOARD_DIR)
        self._uploaded = time.monotonic()

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step)}
        row.update({k: (None if v is None else float(v)) for k, v in scalars.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self._write_tensorboard(step, row)
        if self._mirror is not None:
            self._mirror.log(row)
        if time.monotonic() - self._uploaded > REMOTE_UPLOAD_SECONDS:
            self.flush()

    def _write_tensorboard(self, step: int, row: dict) -> None:
        # tensorboard: only on the path that uses it (an optional extra, or slow to import).
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [
            summary_pb2.Summary.Value(tag=k, simple_value=v)
            for k, v in row.items()
            if k != "step" and v is not None
        ]
        event = event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
        )
        self._tb.add_event(event)
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.flush()
            self._file.close()
            self._tb.close()
            if self._mirror is not None:
                self._mirror.close()
            self._local.close()


def progress_line(step: int, num_steps: int, row: dict, seconds_left: float | None) -> str:
    eta = "?" if seconds_left is None else time.strftime("%H:%M:%S", time.gmtime(seconds_left))
    return (
        f"step {step}/{num_steps}  loss {row['loss']:.4f}  gen {row['gen_loss']:.4f} "
        f"(acc {row['gen_accuracy']:.3f})  disc {row['disc_loss']:.4f} "
        f"(acc {row['disc_accuracy']:.3f})  replaced {row['replaced_fraction']:.3f}  "
        f"{row['tokens_per_sec']:.0f} tok/s  eta {eta}"
        + (f"  held-out auc {row['eval/disc_auc']:.3f}" if row.get("eval/disc_auc") else "")
    )
