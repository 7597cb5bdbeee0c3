"""Tests of electra_jax.data.packing: ELECTRA's [CLS] A [SEP] B [SEP] examples."""

import collections

import numpy as np
import pytest

from electra_jax.data.packing import SentenceEnds, iter_packed, make_row, pack_documents

CLS, SEP, PAD = 2, 3, 0


def _pack(docs, seq_length, single=0.0, short=0.0, seed=0, ends=None):
    rng = np.random.default_rng(seed)
    return list(pack_documents(docs, seq_length, rng, single, short, CLS, SEP, PAD, ends))


def _content(row):
    """The row's tokens without [CLS], [SEP] and padding, in row order."""
    return [t for t in row[0].tolist() if t not in (CLS, SEP, PAD)]


def _generated_corpus(seed, num_docs=120):
    """Documents of 100-200 sentences of 3-40 tokens (ids >= 5): long, like Wikipedia articles,
    so that the short rows at document ends are a small share."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        doc = [
            list(rng.integers(5, 1000, size=rng.integers(3, 41)))
            for _ in range(rng.integers(100, 201))
        ]
        docs.append(doc)
    return docs


def test_make_row_layout():
    row = make_row([10, 11], [12, 13, 14], 10, CLS, SEP, PAD)
    assert row.dtype == np.int32 and row.shape == (2, 10)
    assert row[0].tolist() == [2, 10, 11, 3, 12, 13, 14, 3, 0, 0]
    assert row[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    single = make_row([10, 11], [], 6, CLS, SEP, PAD)
    assert single.tolist() == [[2, 10, 11, 3, 0, 0], [0, 0, 0, 0, 0, 0]]
    with pytest.raises(ValueError):
        make_row([1] * 5, [1], 8, CLS, SEP, PAD)


def test_two_segment_split_and_carry():
    # Target 16, first-segment target (16 - 3) // 2 = 6. Sentence 1 (6 tokens) opens A; sentence
    # 2 would take A past 6 and A is not under target, so B; sentence 3 joins B. 16 tokens reach
    # the target; the row holds 16 - 3 = 13 of them (the original's row), and the 3 tokens the
    # original dropped open the next example.
    doc = [[10] * 6, [11] * 4, [12] * 6]
    row, rest = _pack([doc], 16)
    assert row[0].tolist() == [CLS] + [10] * 6 + [SEP] + [11] * 4 + [12] * 3 + [SEP]
    assert row[1].tolist() == [0] * 8 + [1] * 8
    assert rest[0].tolist() == [CLS] + [12] * 3 + [SEP] + [PAD] * 11
    assert not rest[1].any()


def test_sentence_crossing_first_target_flips_a_coin():
    # Target 32 -> A target (32 - 3) // 2 = 14: 5 + 5 < 14 keeps both in A; the 9-token sentence
    # crosses 14 while B is empty and A is under target, so a coin sends it to A or B; the
    # 20-token one then goes to B. Sentences are never split between segments.
    doc = [[10] * 5, [11] * 5, [12] * 9, [13] * 20]
    first_of_b = set()
    for seed in range(20):
        row, rest = _pack([doc], 32, seed=seed)
        ids = row[0].tolist()
        assert ids[:11] == [CLS] + [10] * 5 + [11] * 5
        assert np.count_nonzero(ids) == 32 and _content(rest) == [13] * 10
        b_start = ids.index(SEP) + 1
        first_of_b.add(ids[b_start])
        assert ids[b_start - 2] in (11, 12)  # A ends on a sentence boundary.
    assert first_of_b == {12, 13}


def test_reaching_first_target_exactly_is_not_under_it():
    # Target 16 -> A target 6. 3 + 3 == 6 is not *under* the target, so the second sentence
    # goes to A only on the coin; B then starts with it about half of the time.
    doc = [[10] * 3, [11] * 3, [12] * 10]
    first_of_b = set()
    for seed in range(20):
        row, _ = _pack([doc], 16, seed=seed)
        ids = row[0].tolist()
        first_of_b.add(ids[ids.index(SEP) + 1])
    assert first_of_b == {11, 12}


def test_single_segment_puts_everything_in_a():
    doc = [[10] * 6, [11] * 4, [12] * 20]
    rows = _pack([doc], 16, single=1.0)
    assert rows[0][0].tolist() == [CLS] + [10] * 6 + [11] * 4 + [12] * 4 + [SEP]
    # The rest of the last sentence fills single-segment rows of 16 - 2 tokens.
    assert [_content(r) for r in rows[1:]] == [[12] * 14, [12] * 2]
    assert not any(r[1].any() for r in rows)


def test_document_end_flushes_and_examples_never_span_documents():
    rows = _pack([[[10, 11, 12]], [[20], [21, 22]], []], 8)
    assert len(rows) == 2
    assert rows[0][0].tolist() == [CLS, 10, 11, 12, SEP, 0, 0, 0]
    real = [t for t in rows[1][0].tolist() if t not in (CLS, SEP, PAD)]
    assert real == [20, 21, 22]


def test_packing_is_deterministic():
    docs = _generated_corpus(1, num_docs=10)
    a = _pack(docs, 64, 0.1, 0.05, seed=7)
    b = _pack(docs, 64, 0.1, 0.05, seed=7)
    c = _pack(docs, 64, 0.1, 0.05, seed=8)
    assert len(a) == len(b) > 100 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(a) != len(c) or not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.fixture(scope="module")
def packed_corpus():
    docs = _generated_corpus(0)
    rng = np.random.default_rng(0)
    return list(iter_packed(docs, 128, rng, 0.1, 0.05, CLS, SEP, PAD))


def test_rows_are_well_formed(packed_corpus):
    assert len(packed_corpus) > 2000
    for example in packed_corpus:
        ids, seg = example.row
        assert example.row.dtype == np.int32 and example.row.shape == (2, 128)
        n = int(np.count_nonzero(ids != PAD))
        assert 3 <= n <= 128
        assert not ids[n:].any() and not seg[n:].any()  # Padding only after the real tokens.
        assert ids[0] == CLS and ids[n - 1] == SEP
        seps = np.flatnonzero(ids[:n] == SEP)
        a_end = seps[0]
        has_b = seg[:n].any()
        assert len(seps) == (2 if has_b else 1)
        # Segment ids: 0 through the first [SEP], 1 from there to the last [SEP].
        assert not seg[: a_end + 1].any()
        assert seg[a_end + 1 : n].all()


def test_segment_and_short_shares(packed_corpus):
    n = len(packed_corpus)
    forced = sum(e.forced_single_segment for e in packed_corpus) / n
    single = sum(not e.row[1].any() for e in packed_corpus) / n
    short = sum(e.target_length < 128 for e in packed_corpus) / n
    # ELECTRA's 10% single-segment and 5% short-target examples (binomial std ~0.6% / 0.4%).
    assert abs(forced - 0.10) < 0.02, forced
    # Rows without B: the forced ones plus a few natural ones (the short rest of a document whose
    # sentences all fit under A's target, one sentence longer than the target).
    assert forced <= single < forced + 0.04, single
    assert 0.08 < single < 0.15, single
    assert abs(short - 0.05) < 0.015, short
    # Full-target examples fill most of the row.
    full = [e for e in packed_corpus if e.target_length == 128]
    fill = np.mean([np.count_nonzero(e.row[0]) / 128 for e in full])
    assert fill > 0.8, fill


def test_short_targets_are_in_range(packed_corpus):
    targets = [e.target_length for e in packed_corpus if e.target_length < 128]
    assert targets and min(targets) >= 5 and max(targets) <= 128
    # Short examples are shorter on average than full ones.
    short_len = np.mean(
        [np.count_nonzero(e.row[0]) for e in packed_corpus if e.target_length < 128]
    )
    assert short_len < 100


def test_tiny_seq_length_rejected():
    with pytest.raises(ValueError, match="seq_length"):
        _pack([[[10]]], 4)


# ---- nothing is dropped: carried rests, long lines, sentence ends --------------------------

# A toy vocabulary in SentencePiece's style: the specials, '.', '?"' (a sentence end with a closing
# quote), 'x' (glued to the word before it), then whole words '▁w8' ... '▁w4999'.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", '?"', "x"] + [
    f"\u2581w{i}" for i in range(8, 5000)
]
DOT, QUOTE_END, GLUED = 5, 6, 7
ENDS = SentenceEnds(VOCAB)


def _words(start, n):
    """n distinct word ids from start on (never a sentence end)."""
    return list(range(start, start + n))


def test_sentence_ends_from_pieces():
    final, glued = ENDS.tables
    assert [i for i in range(len(VOCAB)) if final[i]] == [DOT, QUOTE_END]
    assert [i for i in range(len(VOCAB)) if glued[i]] == [0, 1, 2, 3, 4, DOT, QUOTE_END, GLUED]
    line = [10, 11, DOT, 12, 13, QUOTE_END, 14, DOT, GLUED, 15, DOT]
    # "w14.x" (like "U.S" or "3.5") is no sentence end; the line's end needs no cut.
    assert ENDS.split(line) == [[10, 11, DOT], [12, 13, QUOTE_END], [14, DOT, GLUED, 15, DOT]]
    assert ENDS.split([10, 11]) == [[10, 11]]
    # WordPiece: '##' pieces continue a word, every other piece starts one.
    wordpiece = SentenceEnds(["[PAD]", "the", ".", "##s", "!", "etc"])
    assert wordpiece.split([1, 2, 3, 2, 1, 4, 5, 1]) == [[1, 2, 3, 2], [1, 4], [5, 1]]


def test_line_longer_than_a_row_is_carried_into_the_next_rows():
    seq = 32
    for n in (1, 3, 10):
        # n x (seq - 2) tokens without a sentence end: n full single-segment rows, in order.
        line = _words(10, n * (seq - 2))
        rows = _pack([[line]], seq, ends=ENDS)
        assert len(rows) == n
        assert [t for r in rows for t in _content(r)] == line
        assert all(np.count_nonzero(r[0]) == seq and not r[1].any() for r in rows)
    # 8 x seq tokens with the usual coins: ceil(256 / 30) = 9 rows, every token once, in order.
    line = _words(10, 8 * seq)
    for seed in range(5):
        rows = _pack([[line], [[900, 901]]], seq, single=0.1, short=0.05, seed=seed)
        assert len(rows) == 10  # The second document's row too: documents are not mixed.
        assert [t for r in rows[:9] for t in _content(r)] == line
        assert _content(rows[9]) == [900, 901]


def test_long_line_splits_into_its_sentences():
    rng = np.random.default_rng(0)
    line, start = [], 10
    while len(line) < 2000:
        n = int(rng.integers(3, 8))
        line += [*_words(start, n), DOT]
        start += n
    seq = 128  # Room 125, window 125 // 16 = 7 tokens: longer than any sentence here.
    rows = _pack([[line]], seq, short=0.0, ends=ENDS)
    kept = [t for r in rows for t in _content(r)]
    assert sorted(kept) == sorted(line)  # Every token once.
    for row in rows[:-1]:
        content = _content(row)
        # Each row ends at a sentence end, at most 7 tokens before its room's end.
        assert content[-1] == DOT and 125 - 7 <= len(content) <= 125
        # Segments split at sentence ends too: A ends with '.'.
        a_end = row[0].tolist().index(SEP)
        assert row[0, a_end - 1] == DOT and row[1].any()
    # Without sentence ends the line is one sentence: single-segment rows cut at capacity.
    plain = _pack([[line]], seq, short=0.0)
    assert [t for r in plain for t in _content(r)] == line
    assert all(len(_content(r)) == seq - 2 and not r[1].any() for r in plain[:-1])


def test_cut_prefers_a_sentence_end_in_the_window():
    # seq 64: room 61, window 61 // 16 = 3 tokens, so a cut may move back to 58.
    first = _words(100, 40)
    second = [*_words(200, 18), DOT, *_words(300, 7)]  # Ends a sentence after 40 + 19 = 59.
    row, rest = _pack([[first, second]], 64, ends=ENDS)
    assert _content(row) == first + second[:19]
    assert _content(rest) == second[19:]
    # Without sentence ends: cut at the room's end, 21 tokens into the second line.
    row, rest = _pack([[first, second]], 64)
    assert _content(row) == first + second[:21] and _content(rest) == second[21:]
    # A line that starts within the window goes whole to the next row ...
    row, rest = _pack([[_words(100, 58), _words(200, 10)]], 64)
    assert _content(row) == _words(100, 58) and _content(rest) == _words(200, 10)
    # ... one that starts before it is cut at the room's end.
    row, rest = _pack([[_words(100, 57), _words(200, 10)]], 64)
    assert _content(row) == _words(100, 57) + _words(200, 4)
    assert _content(rest) == _words(204, 6)


def test_every_token_is_kept(packed_corpus):
    docs = _generated_corpus(0)
    read = collections.Counter(t for doc in docs for sentence in doc for t in sentence)
    kept = collections.Counter(t for e in packed_corpus for t in _content(e.row))
    assert sum(kept.values()) == sum(read.values()) and kept == read
    # With sentence ends ('.' is id 5, drawn about once in a thousand tokens) as well.
    rows = _pack(docs[:20], 64, 0.1, 0.05, seed=1, ends=ENDS)
    kept = collections.Counter(t for r in rows for t in _content(r))
    assert kept == collections.Counter(t for doc in docs[:20] for s in doc for t in s)


def test_packing_with_sentence_ends_is_deterministic():
    # Three generated documents as one line of sentences ending with '.'.
    line = [t for doc in _generated_corpus(2, num_docs=3) for s in doc for t in (*s, DOT)]
    a = _pack([[line]], 64, 0.1, 0.05, seed=7, ends=ENDS)
    b = _pack([[line]], 64, 0.1, 0.05, seed=7, ends=ENDS)
    assert len(a) == len(b) > 100 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(len(_content(r)) for r in a) == len(line)
