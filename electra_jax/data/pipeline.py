"""Grain input pipeline over prepared shards: global shuffle, per-process slices of each batch.

The row order is a function of the seed only: every process builds the same shuffled, repeated
stream of rows and cuts it into local batches; process p takes local batches p, p + P, p + 2P, ...
So the global batch of step s is rows [s * G, (s + 1) * G) of the stream whatever the number of
processes P, and two processes train on the same numbers as one. The iterator's state is a step
counter (Grain's ``next_index``: global batches read), the same on every process and for any P: a
checkpoint saves it once (checkpointing.POSITION), and a run resumes from it on another number of
processes at the same global batch.

A mixture (data.mixture, shards.PreparedMixture) changes only the stream of rows: each part's
training rows shuffled and repeated as one corpus's (with a seed of its own), blended by index
(mixture.locate), so row k of the stream is still a function of (seed, k) alone and all of the
above holds as it is.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import resource
import sys

import grain
import numpy as np

from electra_jax.data import heldout, mixture
from electra_jax.data.shards import ROW_DTYPE, PreparedData, PreparedMixture
from electra_jax.errors import DataError


@dataclasses.dataclass(frozen=True)
class _Shard:
    """A shard with its record count known from the manifest (ArrayRecord's FileInstruction
    protocol), so that the data source does not open every shard again to count."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


# Files a process opens besides the shards (Python, jax, orbax, TensorBoard, sockets): the room
# left under the open-file limit when every shard is open at once.
_OTHER_OPEN_FILES = 256


def make_room_for_shards(num_shards: int, directory: str) -> None:
    """Raises this process's soft limit on open files (RLIMIT_NOFILE) to what reading
    `num_shards` shards needs: ArrayRecord keeps each shard it has read from open, and a shuffled
    epoch reads them all. The soft limit (1024 by default on Linux) is raised up to the hard
    one, which needs no privilege; DataError (one line, the way out) when even that is short."""
    need = num_shards + _OTHER_OPEN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise DataError(
            f"the prepared data in {directory} has {num_shards} shards, and reading them needs "
            f"about {need} open files, above this machine's limit of {hard} (ulimit -Hn): "
            "prepare it again with fewer, larger shards (a larger data.examples_per_shard, in "
            "a new data.cache_dir or after deleting that folder), or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


class _ShardSource:
    """The prepared shards as one random-access source; a record that cannot be read (a shard
    damaged after it was checked) raises one DataError line naming the shard, in whichever
    thread reads it: Grain hands it on to the caller of ``next``."""

    def __init__(self, prepared: PreparedData):
        self._paths = list(prepared.shard_paths)
        self._directory = prepared.directory
        make_room_for_shards(len(self._paths), self._directory)
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


class _TrainSource:
    """The rows of a source that are not held out (data/heldout.py), as a dense source."""

    def __init__(self, source: _ShardSource, rows: heldout.TrainRows):
        self._source, self._rows = source, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        return self._source[self._rows.row(index)]

    def __repr__(self) -> str:
        return f"_TrainSource({self._source!r}, {len(self._rows)} rows)"


class _Blend:
    """The parts' streams of rows as one endless random-access source: row k is row j of part
    i's stream, (i, j) = mixture.locate(k, proportions)."""

    def __init__(self, streams: list, proportions: tuple[int, ...]):
        self._streams, self._proportions = streams, tuple(proportions)

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index):
        part, row = mixture.locate(int(index), self._proportions)
        return self._streams[part][row]

    def __repr__(self) -> str:
        return f"_Blend({len(self._streams)} parts, proportions {self._proportions})"


def _part_seed(seed: int, part: int) -> int:
    """The shuffle seed of a mixture's part: an order of its own, the same on every host."""
    return int(np.random.default_rng([seed & (2**64 - 1), 3, part]).integers(2**32))


def _rows(prepared: PreparedData, seed: int, heldout_examples: int) -> grain.MapDataset:
    """The training rows of one prepared corpus, shuffled, repeated endlessly and parsed."""
    source = _ShardSource(prepared)
    if heldout_examples:
        rows = heldout.heldout_rows(prepared.num_examples, heldout_examples)
        source = _TrainSource(source, heldout.TrainRows(prepared.num_examples, rows))
    ds = grain.MapDataset.source(source)
    # Shuffle, then repeat: Grain's shuffle reseeds with seed + epoch for indices past the first
    # epoch, so each epoch has its own order. Shuffle seeds must fit in 32 bits.
    ds = ds.shuffle(seed=seed % 2**32).repeat(None)
    return ds.map(_ParseRow(prepared.seq_length, prepared.directory))


def _blended_rows(blend: PreparedMixture, seed: int, heldout_examples: int) -> grain.MapDataset:
    """The stream of a mixture's rows: each part's as `_rows` gives it (with a seed of its
    own), blended by mixture.locate. A part needs a row left after its held-out slice."""
    streams = []
    for i, (name, part) in enumerate(zip(blend.names, blend.parts, strict=True)):
        try:
            heldout.check_size(
                part.num_examples, heldout_examples, 1, part.manifest.get("source", part.directory)
            )
        except DataError as e:
            raise mixture.in_part(name, e) from None
        streams.append(_rows(part, _part_seed(seed, i), heldout_examples))
    return grain.MapDataset.source(_Blend(streams, blend.proportions))


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


def _to_features(rows: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """int32 [batch, 2, seq_length] rows -> dict of int32 [batch, seq_length] arrays; the input
    mask is 0 at `pad_id`, the [PAD] of the tokenizer that padded the rows (a BERT vocab.txt may
    hold it at any id, and its id 0 may be a real token)."""
    input_ids = np.ascontiguousarray(rows[:, 0])
    return {
        "input_ids": input_ids,
        "segment_ids": np.ascontiguousarray(rows[:, 1]),
        "input_mask": (input_ids != pad_id).astype(np.int32),
    }


def make_dataset(
    prepared: PreparedData | PreparedMixture,
    global_batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    heldout_examples: int = 0,
) -> grain.MapDataset:
    """This process's infinite dataset of local batches (see ``make_iterator``)."""
    if process_count <= 0 or not 0 <= process_index < process_count:
        raise DataError(f"process_index={process_index} is not in [0, {process_count})")
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise DataError(
            f"train.batch_size={global_batch_size} must be a positive multiple of the number of "
            f"processes ({process_count})"
        )
    local_batch = global_batch_size // process_count
    if isinstance(prepared, PreparedMixture):
        ds = _blended_rows(prepared, seed, heldout_examples)
    else:
        source_name = prepared.manifest.get("source", prepared.directory)
        if prepared.num_examples < global_batch_size:
            raise DataError(
                f"data.source '{source_name}' gave {prepared.num_examples} examples of "
                f"{prepared.seq_length} tokens, fewer than one batch (train.batch_size="
                f"{global_batch_size}); add text or lower train.batch_size / data.seq_length"
            )
        heldout.check_size(prepared.num_examples, heldout_examples, global_batch_size, source_name)
        ds = _rows(prepared, seed, heldout_examples)
    ds = ds.batch(local_batch, drop_remainder=True)
    # Local batch k of the stream belongs to global step k // P and to process k % P.
    ds = ds[process_index::process_count]
    return ds.map(functools.partial(_to_features, pad_id=prepared.pad_id))


def make_iterator(
    prepared: PreparedData | PreparedMixture,
    global_batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_threads: int = 2,
    prefetch: int = 8,
    heldout_examples: int = 0,
) -> grain.DatasetIterator:
    """An endless, checkpointable iterator of this process's batches.

    Args:
      prepared: from ``shards.prepare``, or ``shards.prepare_mixture`` (its parts blended by
        weight, each with its own held-out slice).
      global_batch_size: rows per step over all processes; a multiple of process_count.
      seed: fixes the order (a global shuffle, different in every epoch).
      process_index, process_count: this JAX process and how many there are.
      num_threads: Grain read threads (0 reads in the caller's thread).
      prefetch: batches read ahead.
      heldout_examples: rows never read here, kept for the evaluation (data/heldout.py); the
        shuffle runs over the other rows.

    Returns:
      a grain DatasetIterator (``next(it)``, ``it.get_state()``, ``it.set_state(state)``; works
      with ``grain.checkpoint.CheckpointSave/CheckpointRestore``) yielding dicts of int32
      [global_batch_size // process_count, seq_length] arrays: ``input_ids``, ``segment_ids``,
      ``input_mask`` (1 where input_ids != prepared.pad_id). Batch s of process p is rows
      [p * L, (p + 1) * L) of the global batch s, L = global_batch_size // process_count.

    Raises:
      DataError: batch size not a multiple of process_count, or fewer training examples than
        one batch.
    """
    ds = make_dataset(
        prepared, global_batch_size, seed, process_index, process_count, heldout_examples
    )
    read_options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
    return iter(ds.to_iter_dataset(read_options))


def read_rows(prepared: PreparedData, rows) -> dict[str, np.ndarray]:
    """Prepared rows by index, in the given order: dict of int32 [len(rows), seq_length]
    arrays (``input_ids``, ``segment_ids``, ``input_mask``), as the iterator's batches."""
    source = _ShardSource(prepared)
    parse = _ParseRow(prepared.seq_length, prepared.directory)
    parsed = [parse.map(source[int(i)]) for i in rows]
    if not parsed:
        return _to_features(np.zeros((0, 2, prepared.seq_length), np.int32), prepared.pad_id)
    return _to_features(np.stack(parsed), prepared.pad_id)


def heldout_batches(
    prepared: PreparedData,
    heldout_examples: int,
    batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> list[dict[str, np.ndarray]]:
    """The held-out rows as this process's parts of whole global batches: a list of dicts of
    int32 [batch_size // process_count, seq_length] arrays (process p takes rows
    [p * b, (p + 1) * b) of each global batch, as the training batches). Rows that do not fill
    a last global batch are left out (validate.check_config keeps them whole)."""
    rows = heldout.heldout_rows(prepared.num_examples, heldout_examples)
    local = batch_size // process_count
    out = []
    for start in range(0, len(rows) - batch_size + 1, batch_size):
        mine = rows[start + process_index * local : start + (process_index + 1) * local]
        out.append(read_rows(prepared, mine))
    return out


def training_sample(
    prepared: PreparedData | PreparedMixture, heldout_examples: int, limit: int = 4096
) -> dict[str, np.ndarray]:
    """Up to `limit` training rows spread evenly over the corpus order (never a held-out row):
    the batch dict of ``read_rows``, for corpus statistics such as the frequent pieces. Of a
    mixture, each part's share of `limit` by weight (mixture.counts), parts in order."""
    if isinstance(prepared, PreparedMixture):
        shares = mixture.counts(limit, prepared.proportions)
        samples = [
            training_sample(part, heldout_examples, n)
            for part, n in zip(prepared.parts, shares, strict=True)
            if n
        ]
        return {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
    held = heldout.heldout_rows(prepared.num_examples, heldout_examples)
    train = heldout.TrainRows(prepared.num_examples, held)
    picks = heldout.spread_rows(len(train), limit)
    return read_rows(prepared, [train.row(i) for i in picks])
