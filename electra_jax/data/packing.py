"""ELECTRA's example packing: tokenized sentences of a document -> fixed-length rows.

Follows the ExampleBuilder of google-research/electra ``build_pretraining_dataset.py``: sentences
accumulate until they reach a target length (or the document ends), then split into segments A and
B at a sentence boundary, giving ``[CLS] A [SEP] B [SEP]``. A fraction of examples is single-segment
(like classification inputs) and a fraction is packed against a random short target (so the model
also sees short inputs, as in fine-tuning). There is no next-sentence objective, so B simply
continues A.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

# A first-segment target no example can reach: every sentence then goes to segment A.
_UNLIMITED = 100_000


@dataclasses.dataclass(frozen=True)
class PackedExample:
    """One packed row and how it was made (for the manifest's statistics).

    row: int32 [2, seq_length]: row[0] input ids, row[1] segment ids.
    target_length: the length the sentences were accumulated against (< seq_length when short).
    forced_single_segment: the single-segment coin came up (all sentences went to segment A).
    """

    row: np.ndarray
    target_length: int
    forced_single_segment: bool


def make_row(
    first: list[int], second: list[int], seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> np.ndarray:
    """Lays out ``[CLS] first [SEP] (second [SEP])`` padded to seq_length.

    Args:
      first, second: token ids of the segments (second may be empty: no second [SEP] then);
        the caller has trimmed them to fit.

    Returns:
      int32 [2, seq_length]: input ids, then segment ids (0 for [CLS] A [SEP], 1 for B [SEP],
      0 on padding).
    """
    ids = [cls_id, *first, sep_id]
    n_first = len(ids)
    if second:
        ids += [*second, sep_id]
    if len(ids) > seq_length:
        raise ValueError(f"segments of {len(ids)} tokens do not fit seq_length={seq_length}")
    row = np.full((2, seq_length), pad_id, dtype=np.int32)
    row[1] = 0
    row[0, : len(ids)] = ids
    row[1, n_first : len(ids)] = 1
    return row


class ExampleBuilder:
    """Accumulates the sentences of documents and emits packed examples.

    Call ``add_sentence`` for each tokenized sentence and ``end_document`` after each document;
    both return a PackedExample or None. All randomness comes from ``rng``, drawn in the same order
    as the original (single-segment coin, the per-sentence coins that are reached, short-target
    coin), so a seed fixes the output.
    """

    def __init__(
        self,
        seq_length: int,
        rng: np.random.Generator,
        single_segment_prob: float,
        short_seq_prob: float,
        cls_id: int,
        sep_id: int,
        pad_id: int,
    ):
        if seq_length < 5:
            # randint(5, max_length) for short targets needs max_length >= 5.
            raise ValueError(f"seq_length must be >= 5, got {seq_length}")
        self._max_length = seq_length
        self._rng = rng
        self._single_segment_prob = single_segment_prob
        self._short_seq_prob = short_seq_prob
        self._ids = (cls_id, sep_id, pad_id)
        self._sentences: list[list[int]] = []
        self._length = 0
        self._target_length = seq_length

    def add_sentence(self, token_ids: list[int]) -> PackedExample | None:
        """Adds one sentence's ids; returns an example once the target length is reached."""
        self._sentences.append(list(token_ids))
        self._length += len(token_ids)
        if self._length >= self._target_length:
            return self._create_example()
        return None

    def end_document(self) -> PackedExample | None:
        """Ends the document: whatever has accumulated (if any tokens) becomes an example."""
        if self._length > 0:
            return self._create_example()
        self._sentences = []  # Drop empty sentences: examples never span documents.
        return None

    def _create_example(self) -> PackedExample:
        rng = self._rng
        target_length = self._target_length
        forced_single = bool(rng.random() < self._single_segment_prob)
        # -3 leaves room for [CLS] and the two [SEP]s.
        first_target = _UNLIMITED if forced_single else (target_length - 3) // 2

        first: list[int] = []
        second: list[int] = []
        for sentence in self._sentences:
            # A sentence goes to A if A is empty, if it keeps A under its target, or, half of the
            # time, if it is the sentence that crosses A's target while B is still empty.
            # `or` short-circuits, so the coin is drawn only when reached, as in the original.
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target and rng.random() < 0.5)
            ):
                first += sentence
            else:
                second += sentence

        # Trim while leaving room for [CLS]/[SEP]; B is dropped entirely when A fills the row.
        first = first[: self._max_length - 2]
        second = second[: max(0, self._max_length - len(first) - 3)]

        self._sentences = []
        self._length = 0
        if rng.random() < self._short_seq_prob:
            self._target_length = int(rng.integers(5, self._max_length, endpoint=True))
        else:
            self._target_length = self._max_length

        cls_id, sep_id, pad_id = self._ids
        row = make_row(first, second, self._max_length, cls_id, sep_id, pad_id)
        return PackedExample(row, target_length, forced_single)


def iter_packed(
    token_docs: Iterable[list[list[int]]],
    seq_length: int,
    rng: np.random.Generator,
    single_segment_prob: float,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    pad_id: int,
) -> Iterator[PackedExample]:
    """Like ``pack_documents`` but yields PackedExample (row plus how it was packed)."""
    builder = ExampleBuilder(
        seq_length, rng, single_segment_prob, short_seq_prob, cls_id, sep_id, pad_id
    )
    for doc in token_docs:
        for sentence in doc:
            example = builder.add_sentence(sentence)
            if example is not None:
                yield example
        example = builder.end_document()
        if example is not None:
            yield example


def pack_documents(
    token_docs: Iterable[list[list[int]]],
    seq_length: int,
    rng: np.random.Generator,
    single_segment_prob: float,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    pad_id: int,
) -> Iterator[np.ndarray]:
    """Packs tokenized documents into ELECTRA pre-training rows.

    Args:
      token_docs: documents, each a list of sentences, each a list of token ids (no specials).
      seq_length: row length (>= 5).
      rng: the only source of randomness; the same generator state gives the same rows.
      single_segment_prob: chance an example puts every sentence in segment A (ELECTRA: 0.1).
      short_seq_prob: chance the next example targets randint(5, seq_length) tokens (0.05).
      cls_id, sep_id, pad_id: the special ids.

    Yields:
      int32 [2, seq_length] rows: row[0] = ``[CLS] A [SEP] (B [SEP])`` then pad_id; row[1] the
      segment ids (0 for [CLS] A [SEP] and padding, 1 for B [SEP]).
    """
    for example in iter_packed(
        token_docs, seq_length, rng, single_segment_prob, short_seq_prob, cls_id, sep_id, pad_id
    ):
        yield example.row
