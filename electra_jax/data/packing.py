"""ELECTRA's example packing: tokenized sentences of a document -> fixed-length rows.

Follows the ExampleBuilder of google-research/electra ``build_pretraining_dataset.py``: sentences
(lines of the source) accumulate until they reach a target length (or the document ends), then
split into segments A and B at a sentence boundary, giving ``[CLS] A [SEP] B [SEP]``. A fraction of
examples is single-segment (like classification inputs) and a fraction is packed against a random
short target (so the model also sees short inputs, as in fine-tuning). There is no next-sentence
objective, so B simply continues A.

One departure: no text is dropped. The original trims each example to the row and drops the rest
of the sentence that crossed the target, and so keeps only one row's worth of a line longer than a
row. Measured, that drops 11% of the tokens of text with one sentence of 3-40 tokens per line at
seq_length 128 (20% at 64) and, tokenized with a 2000-piece SentencePiece model, most of the text
whose lines are paragraphs: 61% of WikiText-2 at 128, 59% of the NLTK inaugural addresses at 64,
87% of a 5 MB file without newlines at 64. Here instead:

* Sentences that do not fit an example's room (seq_length - 3 tokens; seq_length - 2 when all of
  it goes to segment A) are cut, and the rest is carried into the next examples of the document.
  The cut is the last sentence end among the room's final 1/16 if there is one (the row is padded
  after it), else the room's end: a sentence end is a boundary between lines or a sentence-final
  token inside one (``SentenceEnds``).
* A line longer than a row is first split into its sentences, which then pack like lines, so its
  examples have two segments like the others.
* An example whose sentences fit its room is laid out exactly as in the original, with the same
  random draws (single-segment coin, the per-sentence coins reached, short-target coin).

Every token of every document is therefore in exactly one row (the manifest's ``tokens_read`` and
``tokens_kept`` agree). The cost is a little padding: at seq_length 128 rows hold 95.4% real tokens
instead of 96.6% on the one-sentence-per-line text above, 98.0% instead of 99.7% on WikiText-2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

# What add_sentence returns when no example is complete.
_NONE: tuple = ()
# A first-segment target no example can reach: every sentence then goes to segment A.
_UNLIMITED = 100_000
# An example that cannot hold all its sentences ends at the last sentence end among its room's
# final room // _WINDOW_DIVISOR tokens, if there is one (the rest of the row is padding), else at
# the room's end. 16: at most 7 padded tokens at seq_length 128, 0.4-0.8% of the rows' tokens on
# WikiText-2 and one-sentence-per-line text (1.4-2.7% for 8), and no fragment of a sentence that
# short is split off to end a row.
_WINDOW_DIVISOR = 16


@dataclasses.dataclass(frozen=True)
class PackedExample:
    """One packed row and how it was made (for the manifest's statistics).

    row: int32 [2, seq_length]: row[0] input ids, row[1] segment ids.
    target_length: the length the sentences were accumulated against (< seq_length when short).
    forced_single_segment: the single-segment coin came up (all sentences went to segment A).
    content_tokens: tokens of A and B (the row's real tokens less [CLS] and the [SEP]s).
    has_second_segment: the row has a segment B (and so a second [SEP]).
    """

    row: np.ndarray
    target_length: int
    forced_single_segment: bool
    content_tokens: int
    has_second_segment: bool


def make_row(
    first: list[int], second: list[int], seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> np.ndarray:
    """Lays out ``[CLS] first [SEP] (second [SEP])`` padded to seq_length.

    Args:
      first, second: token ids of the segments (second may be empty: no second [SEP] then);
        they must fit (ValueError otherwise: nothing is trimmed).

    Returns:
      int32 [2, seq_length]: input ids, then segment ids (0 for [CLS] A [SEP], 1 for B [SEP],
      0 on padding).
    """
    ids = [cls_id, *first, sep_id]
    n_first = len(ids)
    if second:
        ids += second
        ids.append(sep_id)
    n = len(ids)
    if n > seq_length:
        raise ValueError(f"segments of {n} tokens do not fit seq_length={seq_length}")
    row = np.zeros((2, seq_length), dtype=np.int32)
    row[0, :n] = ids
    if pad_id:
        row[0, n:] = pad_id
    row[1, n_first:n] = 1
    return row


class SentenceEnds:
    """Which token ids end a sentence, read off the tokenizer's pieces.

    A sentence ends after a token whose piece ends with '.', '!' or '?' (closing quotes and
    brackets after it allowed: '."', '?)') when the next token starts a word, or when the line
    ends. A next token that continues the word (a SentencePiece piece without the leading '▁', a
    WordPiece '##' piece) is no sentence start: "U.S.", "3.5" or "e.g." are not cut inside.
    """

    _FINAL = frozenset(".!?")
    _CLOSERS = "\"')]}»”’"

    def __init__(self, pieces: Sequence[str]):
        """pieces: the vocabulary, piece i being the text of id i."""
        word_marks = any(p.startswith("\u2581") for p in pieces)
        final = bytearray(len(pieces))
        glued = bytearray(len(pieces))
        for i, piece in enumerate(pieces):
            text = piece.removeprefix("\u2581").removeprefix("##").rstrip(self._CLOSERS)
            final[i] = bool(text) and text[-1] in self._FINAL
            glued[i] = piece.startswith("##") or (word_marks and not piece.startswith("\u2581"))
        self._final_bytes = bytes(final)
        self._glued_bytes = bytes(glued)
        # The ids that end a sentence when the next token starts a word.
        self.final_ids = frozenset(i for i, is_final in enumerate(final) if is_final)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> SentenceEnds:
        """From anything with ``vocab_size`` and ``id_to_piece`` (SentencePiece or WordPiece)."""
        return cls([tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])

    @property
    def tables(self) -> tuple[bytes, bytes]:
        """(final, glued): byte i is 1 when id i ends a sentence / continues the previous word; a
        sentence ends between ids[j - 1] and ids[j] when final[ids[j - 1]] and not glued[ids[j]].
        """
        return self._final_bytes, self._glued_bytes

    def split(self, ids: list[int]) -> list[list[int]]:
        """ids cut after every sentence end: the sentences of a line, in order."""
        # C-speed scans (a set intersection, list.index) beat converting the line to an array.
        glued = self._glued_bytes
        last = len(ids) - 1
        cuts = []
        for token in self.final_ids.intersection(ids):
            j = -1
            try:
                while True:
                    j = ids.index(token, j + 1)
                    if j < last and not glued[ids[j + 1]]:
                        cuts.append(j + 1)
            except ValueError:
                pass
        if not cuts:
            return [ids]
        cuts.sort()
        bounds = [0, *cuts, len(ids)]
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class ExampleBuilder:
    """Accumulates the sentences of documents and emits packed examples.

    Call ``add_sentence`` for each tokenized sentence and ``end_document`` after each document;
    both return the examples completed (usually none or one). All randomness comes from ``rng``,
    drawn per example in the same order as the original (single-segment coin, the per-sentence
    coins that are reached, short-target coin), so a seed fixes the output.
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
        sentence_ends: SentenceEnds | None = None,
    ):
        if seq_length < 5:
            # randint(5, max_length) for short targets needs max_length >= 5.
            raise ValueError(f"seq_length must be >= 5, got {seq_length}")
        self._max_length = seq_length
        self._rng = rng
        self._single_segment_prob = single_segment_prob
        self._short_seq_prob = short_seq_prob
        self._ids = (cls_id, sep_id, pad_id)
        self._ends = sentence_ends
        self._sentences: list[list[int]] = []
        self._length = 0
        self._target_length = seq_length

    def add_sentence(self, token_ids: list[int]) -> Sequence[PackedExample]:
        """Adds one sentence's ids; returns the examples it completes (usually none or one)."""
        if type(token_ids) is not list:
            token_ids = list(token_ids)  # Sentences are sliced and concatenated as lists.
        if len(token_ids) > self._max_length - 2 and self._ends is not None:
            # Longer than any example: the sentences of the line are packed as sentences.
            done = []
            for piece in self._ends.split(token_ids):
                self._sentences.append(piece)
                self._length += len(piece)
                if self._length >= self._target_length:
                    done += self._complete()
            return done
        self._sentences.append(token_ids)
        self._length += len(token_ids)
        if self._length < self._target_length:
            return _NONE
        return self._complete()

    def _complete(self) -> list[PackedExample]:
        done = [self._create_example()]
        while self._length >= self._target_length:  # A long rest carried over.
            done.append(self._create_example())
        return done

    def end_document(self) -> list[PackedExample]:
        """Ends the document: whatever has accumulated (if any tokens) becomes examples."""
        done = []
        while self._length > 0:
            done.append(self._create_example())
        self._sentences = []  # Drop empty sentences: examples never span documents.
        return done

    def _cut(self, capacity: int) -> tuple[list[list[int]], list[list[int]]]:
        """Splits the accumulated sentences (more than capacity tokens) into the capacity tokens
        or fewer that this example keeps and the rest, carried into the next examples.

        The cut is the last sentence end at most capacity // _WINDOW_DIVISOR tokens before
        capacity (a boundary between sentences, or a sentence end inside the sentence that
        crosses capacity), else capacity itself.
        """
        sentences = self._sentences
        # Sentence i crosses capacity; offset: the tokens before it.
        i = offset = 0
        while offset + len(sentences[i]) <= capacity:
            offset += len(sentences[i])
            i += 1
        sentence = sentences[i]
        lowest = capacity - capacity // _WINDOW_DIVISOR
        keep = capacity - offset  # Tokens of sentence i kept (< len(sentence)).
        inside = 0
        lo = max(1, lowest - offset)
        # The latest sentence end inside sentence i within the window (the set test first: most
        # windows hold no sentence-final token).
        if self._ends is not None and not self._ends.final_ids.isdisjoint(sentence[lo - 1 : keep]):
            final, glued = self._ends.tables
            for j in range(keep, lo - 1, -1):
                if final[sentence[j - 1]] and not glued[sentence[j]]:
                    inside = j
                    break
        if inside:
            keep = inside
        elif i and offset >= lowest:
            keep = 0  # Sentence i starts within the window: it goes whole to the next example.
        kept = sentences[:i]
        if keep:
            kept.append(sentence[:keep])
        return kept, [sentence[keep:], *sentences[i + 1 :]]

    def _create_example(self) -> PackedExample:
        rng = self._rng
        target_length = self._target_length
        max_length = self._max_length
        forced_single = bool(rng.random() < self._single_segment_prob)
        # -3 leaves room for [CLS] and the two [SEP]s.
        first_target = _UNLIMITED if forced_single else (target_length - 3) // 2

        sentences = self._sentences
        carried: list[list[int]] = []
        # Room for the content: [CLS] A [SEP] when everything goes to A (single-segment, or a
        # first sentence too long to leave B any room), else [CLS] A [SEP] B [SEP].
        if forced_single or len(sentences[0]) > max_length - 3:
            capacity = max_length - 2
        else:
            capacity = max_length - 3
        carried_length = 0
        if self._length > capacity:
            sentences, carried = self._cut(capacity)
            carried_length = sum(map(len, carried))

        first: list[int] = []
        second: list[int] = []
        for sentence in sentences:
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

        self._sentences = carried
        self._length = carried_length
        if rng.random() < self._short_seq_prob:
            self._target_length = int(rng.integers(5, max_length, endpoint=True))
        else:
            self._target_length = max_length

        cls_id, sep_id, pad_id = self._ids
        # The cut above makes A and B fit: make_row raises rather than drop anything.
        row = make_row(first, second, max_length, cls_id, sep_id, pad_id)
        return PackedExample(
            row, target_length, forced_single, len(first) + len(second), bool(second)
        )


def iter_packed(
    token_docs: Iterable[list[list[int]]],
    seq_length: int,
    rng: np.random.Generator,
    single_segment_prob: float,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    sentence_ends: SentenceEnds | None = None,
) -> Iterator[PackedExample]:
    """Like ``pack_documents`` but yields PackedExample (row plus how it was packed)."""
    builder = ExampleBuilder(
        seq_length, rng, single_segment_prob, short_seq_prob, cls_id, sep_id, pad_id, sentence_ends
    )
    add_sentence = builder.add_sentence
    for doc in token_docs:
        for sentence in doc:
            yield from add_sentence(sentence)
        yield from builder.end_document()


def pack_documents(
    token_docs: Iterable[list[list[int]]],
    seq_length: int,
    rng: np.random.Generator,
    single_segment_prob: float,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    sentence_ends: SentenceEnds | None = None,
) -> Iterator[np.ndarray]:
    """Packs tokenized documents into ELECTRA pre-training rows.

    Args:
      token_docs: documents, each a list of sentences, each a list of token ids (no specials).
      seq_length: row length (>= 5).
      rng: the only source of randomness; the same generator state gives the same rows.
      single_segment_prob: chance an example puts every sentence in segment A (ELECTRA: 0.1).
      short_seq_prob: chance the next example targets randint(5, seq_length) tokens (0.05).
      cls_id, sep_id, pad_id: the special ids.
      sentence_ends: the tokenizer's sentence-final tokens (``SentenceEnds.from_tokenizer``):
        lines longer than a row are split into their sentences, and cuts prefer sentence ends.
        None: no token counts as a sentence end (cuts fall at line boundaries or capacity).

    Yields:
      int32 [2, seq_length] rows: row[0] = ``[CLS] A [SEP] (B [SEP])`` then pad_id; row[1] the
      segment ids (0 for [CLS] A [SEP] and padding, 1 for B [SEP]).
    """
    for example in iter_packed(
        token_docs,
        seq_length,
        rng,
        single_segment_prob,
        short_seq_prob,
        cls_id,
        sep_id,
        pad_id,
        sentence_ends,
    ):
        yield example.row
