"""The held-out slice of prepared data: rows the run never trains on, read by its evaluation.

The slice is a function of two numbers only, the prepared data's row count N (its manifest's
`examples`) and `data.heldout_examples` K: K rows in blocks of BLOCK consecutive rows (the last
block may be shorter), the blocks centred in K / BLOCK equal stretches of the corpus order. So
every process, every seed and `python -m electra_jax.evaluate` find the same rows without a list
to keep; a block is a stretch of one document or two (rows are packed in corpus order), so the
held-out text is spread over the whole corpus while few of its documents also train. Training
reads the other N - K rows (`TrainRows`); with K = 0 it reads every row, as runs prepared before
the slice existed do.
"""

from __future__ import annotations

import numpy as np

from electra_jax.errors import DataError

BLOCK = 16  # rows per held-out block (2,048 tokens at seq_length 128)


def check_size(num_examples: int, heldout_examples: int, batch_size: int, source: str) -> None:
    """DataError unless K rows can be held out of N and leave at least one training batch."""
    if heldout_examples < 0:
        raise DataError(f"data.heldout_examples={heldout_examples} must be >= 0")
    if heldout_examples and 2 * heldout_examples > num_examples:
        raise DataError(
            f"data.heldout_examples={heldout_examples} is more than half of the "
            f"{num_examples} examples data.source '{source}' gave; lower it or add text"
        )
    if num_examples - heldout_examples < batch_size:
        raise DataError(
            f"data.source '{source}' gave {num_examples} examples; after the "
            f"{heldout_examples} held out (data.heldout_examples) fewer than one batch "
            f"(train.batch_size={batch_size}) is left; add text or lower those settings"
        )


def heldout_rows(num_examples: int, heldout_examples: int) -> np.ndarray:
    """The held-out row indices, sorted: int64 [K].

    Needs 2 K <= N (check_size), so that the stretches (N / blocks rows each) are at least as
    long as a block and the blocks never overlap.
    """
    n, k = int(num_examples), int(heldout_examples)
    if k == 0:
        return np.zeros((0,), np.int64)
    if 2 * k > n:
        raise DataError(f"cannot hold out {k} of {n} examples (at most half)")
    blocks = -(-k // BLOCK)
    sizes = np.full(blocks, BLOCK, np.int64)
    sizes[-1] = k - BLOCK * (blocks - 1)
    stretch = n / blocks
    starts = np.floor(np.arange(blocks) * stretch + (stretch - sizes) / 2).astype(np.int64)
    rows = np.concatenate([s + np.arange(z) for s, z in zip(starts, sizes, strict=True)])
    return rows


class TrainRows:
    """The rows left for training, as a dense index space [0, N - K) over the N rows.

    Index j is the j-th row not held out: j plus the number of held-out rows at or before it,
    found by bisection on the K held-out rows, so no [N] array is built for a large corpus.
    """

    def __init__(self, num_examples: int, heldout: np.ndarray):
        self.num_examples = int(num_examples)
        self._heldout = np.asarray(heldout, np.int64)
        # Training rows before each held-out row: a non-decreasing [K] array.
        self._before = self._heldout - np.arange(len(self._heldout))

    def __len__(self) -> int:
        return self.num_examples - len(self._heldout)

    def row(self, index: int) -> int:
        """The prepared row of training index `index` in [0, N - K)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"training index {index} is not in [0, {len(self)})")
        return index + int(np.searchsorted(self._before, index, side="right"))


def spread_rows(count: int, limit: int) -> np.ndarray:
    """Up to `limit` indices of [0, count), evenly spread, sorted: int64 [min(count, limit)]."""
    if count <= limit:
        return np.arange(count, dtype=np.int64)
    return np.floor((np.arange(limit) + 0.5) * (count / limit)).astype(np.int64)


def piece_counts(
    input_ids: np.ndarray, vocab_size: int, special_ids: tuple[int, ...]
) -> np.ndarray:
    """How often each piece occurs in `input_ids` (int [..., L]; padding, out-of-range and the
    special ids not counted): int64 [vocab_size]."""
    ids = np.asarray(input_ids).ravel()
    counts = np.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
    counts = counts.astype(np.int64)
    counts[list(special_ids)] = 0
    return counts


def unigram_cdf(input_ids: np.ndarray, vocab_size: int, special_ids: tuple[int, ...]) -> np.ndarray:
    """The cumulative unigram distribution of the pieces in `input_ids`: float32 [vocab_size],
    non-decreasing, ending at 1 (uniform over the non-special pieces where nothing is counted).

    The held-out evaluation draws replacements from it (`disc_auc_unigram`): a corruption the
    same for every step and run of one corpus, unlike the run's own generator's, which gets
    harder as the generator learns."""
    counts = piece_counts(input_ids, vocab_size, special_ids).astype(np.float64)
    if counts.sum() == 0:
        counts = np.ones((vocab_size,), np.float64)
        counts[list(special_ids)] = 0.0
    cdf = np.cumsum(counts) / counts.sum()
    return cdf.astype(np.float32)


def frequent_pieces(
    input_ids: np.ndarray, vocab_size: int, special_ids: tuple[int, ...], share: float = 0.5
) -> np.ndarray:
    """The most frequent pieces that together make `share` of the tokens: bool [vocab_size].

    input_ids: int [..., L] rows of the corpus (padding and the special ids are not counted).
    Pieces are taken in order of decreasing count (ties by id) until their counts reach `share`
    of all counted tokens, the piece that crosses it included. The held-out evaluation reads
    the discriminator's AUC over the positions showing one of these pieces (`disc_auc_frequent`):
    a replacement by a frequent piece cannot be told by its rarity, only by its context.
    """
    counts = piece_counts(input_ids, vocab_size, special_ids)
    total = int(counts.sum())
    out = np.zeros((vocab_size,), bool)
    if total == 0:
        return out
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count down, then id up
    reached = np.cumsum(counts[order])
    n = int(np.searchsorted(reached, share * total, side="left")) + 1
    out[order[:n]] = True
    return out
