"""Grain input pipeline over prepared shards: global shuffle, per-process slices of each batch.

The row order is a function of the seed only: every process builds the same shuffled, repeated
stream of rows and cuts it into local batches; process p takes local batches p, p + P, p + 2P, ...
So the global batch of step s is rows [s * G, (s + 1) * G) of the stream whatever the number of
processes P, and two processes train on the same numbers as one. The iterator's state is a step
counter (Grain's ``next_index``), small enough to save in every checkpoint.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools

import grain
import numpy as np

from electra_jax.data import DataError
from electra_jax.data.prepare import ROW_DTYPE, PreparedData
from electra_jax.data.tokenizer import PAD_ID


@dataclasses.dataclass(frozen=True)
class _Shard:
    """A shard with its record count known from the manifest (ArrayRecord's FileInstruction
    protocol), so that the data source does not open every shard again to count."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


class _ShardSource:
    """The prepared shards as one random-access source; a record that cannot be read (a shard
    damaged after it was checked) raises one DataError line naming the shard, in whichever
    thread reads it: Grain hands it on to the caller of ``next``."""

    def __init__(self, prepared: PreparedData):
        self._paths = list(prepared.shard_paths)
        self._directory = prepared.directory
        counts = prepared.manifest.get("shard_examples")
        if isinstance(counts, list) and len(counts) == len(self._paths):
            shards = [_Shard(p, 0, n, n) for p, n in zip(self._paths, counts, strict=True)]
            self._source = grain.sources.ArrayRecordDataSource(shards)
            self._ends = list(itertools.accumulate(counts))
        else:  # Built by hand, without counts: the source counts the records itself.
            self._source = grain.sources.ArrayRecordDataSource(self._paths)
            self._ends = None

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index):
        try:
            return self._source[index]
        except (RuntimeError, OSError) as e:
            if self._ends is not None and 0 <= int(index) < self._ends[-1]:
                path = self._paths[bisect.bisect_right(self._ends, int(index))]
                shard = f"prepared shard {path}"
            else:
                shard = f"a prepared shard in {self._directory}"
            reason = " ".join(str(e).split())
            raise DataError(
                f"{shard} cannot be read ({reason}); delete {self._directory} so that the next "
                "run prepares it again"
            ) from None

    def __repr__(self) -> str:
        return f"_ShardSource({self._directory}, {len(self._paths)} shards)"


class _ParseRow(grain.transforms.Map):
    """Record bytes -> int32 [2, seq_length] (input ids, segment ids)."""

    def __init__(self, seq_length: int, directory: str):
        self._seq_length = seq_length
        self._directory = directory

    def map(self, record: bytes) -> np.ndarray:
        row = np.frombuffer(record, dtype=ROW_DTYPE)
        if row.size != 2 * self._seq_length:
            raise DataError(
                f"a prepared record in {self._directory} has {row.size} ints, expected 2 x "
                f"seq_length={2 * self._seq_length}; delete {self._directory} so that the next "
                "run prepares it again"
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
    ds = grain.MapDataset.source(_ShardSource(prepared))
    # Shuffle, then repeat: Grain's shuffle reseeds with seed + epoch for indices past the first
    # epoch, so each epoch has its own order. Shuffle seeds must fit in 32 bits.
    ds = ds.shuffle(seed=seed % 2**32).repeat(None)
    ds = ds.map(_ParseRow(prepared.seq_length, prepared.directory))
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
