"""Grain input pipeline over prepared shards: global shuffle, per-process slices of each batch.

The row order is a function of the seed only: every process builds the same shuffled, repeated
stream of rows and cuts it into local batches; process p takes local batches p, p + P, p + 2P, ...
So the global batch of step s is rows [s * G, (s + 1) * G) of the stream whatever the number of
processes P, and two processes train on the same numbers as one. The iterator's state is a step
counter (Grain's ``next_index``), small enough to save in every checkpoint.
"""

from __future__ import annotations

import grain
import numpy as np

from electra_jax.data import DataError
from electra_jax.data.prepare import ROW_DTYPE, PreparedData
from electra_jax.data.tokenizer import PAD_ID


class _ParseRow(grain.transforms.Map):
    """Record bytes -> int32 [2, seq_length] (input ids, segment ids)."""

    def __init__(self, seq_length: int):
        self._seq_length = seq_length

    def map(self, record: bytes) -> np.ndarray:
        row = np.frombuffer(record, dtype=ROW_DTYPE)
        if row.size != 2 * self._seq_length:
            raise DataError(
                f"a prepared record has {row.size} ints, expected 2 x seq_length="
                f"{2 * self._seq_length}; delete the prepared directory to rebuild it"
            )
        # A no-op view on little-endian hosts; the batch stacks rows into a fresh array anyway.
        return row.reshape(2, self._seq_length).astype(np.int32, copy=False)


def _to_features(rows: np.ndarray) -> dict[str, np.ndarray]:
    """int32 [batch, 2, seq_length] rows -> dict of int32 [batch, seq_length] arrays."""
    input_ids = np.ascontiguousarray(rows[:, 0])
    return {
        "input_ids": input_ids,
        "segment_ids": np.ascontiguousarray(rows[:, 1]),
        "input_mask": (input_ids != PAD_ID).astype(np.int32),
    }


def make_dataset(
    prepared: PreparedData,
    global_batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """This process's infinite dataset of local batches (see ``make_iterator``)."""
    if process_count <= 0 or not 0 <= process_index < process_count:
        raise DataError(f"process_index={process_index} is not in [0, {process_count})")
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise DataError(
            f"train.batch_size={global_batch_size} must be a positive multiple of the number of "
            f"processes ({process_count})"
        )
    source_name = prepared.manifest.get("source", prepared.directory)
    if prepared.num_examples < global_batch_size:
        raise DataError(
            f"data.source '{source_name}' gave {prepared.num_examples} examples of "
            f"{prepared.seq_length} tokens, fewer than one batch (train.batch_size="
            f"{global_batch_size}); add text or lower train.batch_size / data.seq_length"
        )
    local_batch = global_batch_size // process_count
    ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(prepared.shard_paths))
    # Shuffle, then repeat: Grain's shuffle reseeds with seed + epoch for indices past the first
    # epoch, so each epoch has its own order. Shuffle seeds must fit in 32 bits.
    ds = ds.shuffle(seed=seed % 2**32).repeat(None)
    ds = ds.map(_ParseRow(prepared.seq_length))
    ds = ds.batch(local_batch, drop_remainder=True)
    # Local batch k of the stream belongs to global step k // P and to process k % P.
    ds = ds[process_index::process_count]
    return ds.map(_to_features)


def make_iterator(
    prepared: PreparedData,
    global_batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_threads: int = 2,
    prefetch: int = 8,
) -> grain.DatasetIterator:
    """An endless, checkpointable iterator of this process's batches.

    Args:
      prepared: from ``prepare``.
      global_batch_size: rows per step over all processes; a multiple of process_count.
      seed: fixes the order (a global shuffle, different in every epoch).
      process_index, process_count: this JAX process and how many there are.
      num_threads: Grain read threads (0 reads in the caller's thread).
      prefetch: batches read ahead.

    Returns:
      a grain DatasetIterator (``next(it)``, ``it.get_state()``, ``it.set_state(state)``; works
      with ``grain.checkpoint.CheckpointSave/CheckpointRestore``) yielding dicts of int32
      [global_batch_size // process_count, seq_length] arrays: ``input_ids``, ``segment_ids``,
      ``input_mask`` (1 where input_ids != PAD_ID). Batch s of process p is rows
      [p * L, (p + 1) * L) of the global batch s, L = global_batch_size // process_count.

    Raises:
      DataError: batch size not a multiple of process_count, or fewer examples than one batch.
    """
    ds = make_dataset(prepared, global_batch_size, seed, process_index, process_count)
    read_options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
    return iter(ds.to_iter_dataset(read_options))
