"""What a run reports: counted FLOPs, MFU, metrics.jsonl, TensorBoard scalars, progress lines.

Only process 0 writes. FLOPs are counted analytically from the model's shapes (matmuls x 2 per
multiply-add, x 3 for forward + backward), so MFU compares what the model needs with what the
hardware could do, independent of how XLA schedules it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from electra_jax.model.networks import ElectraSpec, EncoderSpec
from electra_jax.model.sharding import log  # noqa: F401  (metrics.log: the wing's lines)
from electra_jax.objectives import registry
from electra_jax.objectives.catalog import DEFAULT
from electra_jax.objectives.core import FlopParts
from electra_jax.pretraining import topology, wandb_mirror
from electra_jax.store import filenames, jsonio, paths

# Dense bfloat16 peak FLOP/s per GPU (vendor figures), matched against jax's device_kind. TPUs'
# are in topology.GENERATIONS (per chip, with HBM and their sources), one device each.
PEAK_FLOPS = {
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}


def peak_flops_per_device(device_kind: str, override: float = 0.0) -> float | None:
    """The configured peak if given, else the tables' entry for this device kind (a TPU
    generation's per device: its chip's, halved where each core is a device, as on v2 and
    v3), else None."""
    if override and override > 0:
        return float(override)
    generation = topology.generation_for_kind(device_kind)
    if generation is not None:
        return generation.bf16_flops_per_device
    for name, peak in PEAK_FLOPS.items():
        if name.lower() in device_kind.lower():
            return peak
    return None


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


def read_rows(path: str) -> list[dict]:
    """The rows of a metrics.jsonl, local or gs:// (a half-written last line from a crash is
    dropped)."""
    rows = []
    try:
        text = paths.read_text(path)
    except FileNotFoundError:
        return rows
    for line in text.splitlines(keepends=True):
        try:
            rows.append(jsonio.loads(line))
        except ValueError:  # half-written (or nested too deep to be a row of ours)
            break
    return rows


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
        self._tb = None
        self._mirror = None
        if not enabled:
            return
        if config is not None and config.log.wandb_project:
            self._mirror = wandb_mirror.Mirror.start(workdir, config, log)
        kept = [r for r in read_rows(self.path) if r.get("step", 0) <= resume_step]
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
