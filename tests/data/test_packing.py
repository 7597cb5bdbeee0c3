"""Tests of electra_jax.data.packing: ELECTRA's [CLS] A [SEP] B [SEP] examples."""

import numpy as np
import pytest

from electra_jax.data.packing import iter_packed, make_row, pack_documents

CLS, SEP, PAD = 2, 3, 0


def _pack(docs, seq_length, single=0.0, short=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return list(pack_documents(docs, seq_length, rng, single, short, CLS, SEP, PAD))


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


def test_two_segment_split_and_trim():
    # Target 16, first-segment target (16 - 3) // 2 = 6. Sentence 1 (6 tokens) opens A; sentence
    # 2 would take A past 6 and A is not under target, so B; sentence 3 joins B. 16 tokens reach
    # the target; B is trimmed to 16 - 6 - 3 = 7 tokens.
    doc = [[10] * 6, [11] * 4, [12] * 6]
    (row,) = _pack([doc], 16)
    assert row[0].tolist() == [CLS] + [10] * 6 + [SEP] + [11] * 4 + [12] * 3 + [SEP]
    assert row[1].tolist() == [0] * 8 + [1] * 8


def test_sentence_crossing_first_target_flips_a_coin():
    # Target 32 -> A target (32 - 3) // 2 = 14: 5 + 5 < 14 keeps both in A; the 9-token sentence
    # crosses 14 while B is empty and A is under target, so a coin sends it to A or B; the
    # 20-token one then goes to B. Sentences are never split between segments.
    doc = [[10] * 5, [11] * 5, [12] * 9, [13] * 20]
    first_of_b = set()
    for seed in range(20):
        (row,) = _pack([doc], 32, seed=seed)
        ids = row[0].tolist()
        assert ids[:11] == [CLS] + [10] * 5 + [11] * 5
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
        (row,) = _pack([doc], 16, seed=seed)
        ids = row[0].tolist()
        first_of_b.add(ids[ids.index(SEP) + 1])
    assert first_of_b == {11, 12}


def test_single_segment_puts_everything_in_a():
    doc = [[10] * 6, [11] * 4, [12] * 20]
    (row,) = _pack([doc], 16, single=1.0)
    assert row[0].tolist() == [CLS] + [10] * 6 + [11] * 4 + [12] * 4 + [SEP]
    assert not row[1].any()


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
