"""Tests of electra_jax.data.heldout: the held-out rows, the training rows, frequent pieces."""

import numpy as np
import pytest

from electra_jax.data import heldout
from electra_jax.errors import DataError


@pytest.mark.parametrize(
    "n,k", [(100, 1), (100, 16), (100, 17), (1000, 256), (37590, 256), (64, 32)]
)
def test_heldout_rows_are_k_distinct_rows_in_blocks_spread_over_the_corpus(n, k):
    rows = heldout.heldout_rows(n, k)
    assert rows.dtype == np.int64 and len(rows) == k
    assert np.all(np.diff(rows) > 0) and rows[0] >= 0 and rows[-1] < n
    blocks = -(-k // heldout.BLOCK)
    # Consecutive within a block, and one block in each of `blocks` equal stretches.
    breaks = np.flatnonzero(np.diff(rows) > 1)
    assert len(breaks) <= blocks - 1
    stretch = n / blocks
    for b in range(blocks):
        block = rows[b * heldout.BLOCK : (b + 1) * heldout.BLOCK]
        assert np.all(np.diff(block) == 1)
        assert b * stretch <= block[0] and block[-1] < (b + 1) * stretch


def test_heldout_rows_depend_on_the_counts_only():
    assert np.array_equal(heldout.heldout_rows(5000, 256), heldout.heldout_rows(5000, 256))
    assert len(heldout.heldout_rows(5000, 0)) == 0
    with pytest.raises(DataError, match="at most half"):
        heldout.heldout_rows(100, 51)


@pytest.mark.parametrize("n,k", [(100, 0), (100, 17), (1000, 256), (64, 32)])
def test_training_rows_are_the_complement_in_order(n, k):
    held = heldout.heldout_rows(n, k)
    train = heldout.TrainRows(n, held)
    assert len(train) == n - k
    mapped = [train.row(j) for j in range(len(train))]
    assert mapped == sorted(set(range(n)) - set(held.tolist()))
    with pytest.raises(IndexError):
        train.row(len(train))


def test_check_size_names_the_setting():
    heldout.check_size(1000, 256, 32, "builtin")
    with pytest.raises(DataError, match="more than half"):
        heldout.check_size(400, 256, 32, "builtin")
    with pytest.raises(DataError, match="fewer than one batch"):
        heldout.check_size(100, 40, 64, "builtin")
    with pytest.raises(DataError, match=">= 0"):
        heldout.check_size(100, -1, 8, "builtin")


def test_spread_rows():
    assert heldout.spread_rows(5, 10).tolist() == [0, 1, 2, 3, 4]
    picks = heldout.spread_rows(1000, 10)
    assert picks.tolist() == [50, 150, 250, 350, 450, 550, 650, 750, 850, 950]


def test_frequent_pieces_make_half_of_the_text_tokens():
    # Piece 5 is 40% of the text, 6 is 20%, 7 is 15%, and 25 others 1% each; specials ignored.
    ids = [5] * 40 + [6] * 20 + [7] * 15 + list(range(8, 33)) + [0] * 50 + [2] * 30 + [3] * 30
    frequent = heldout.frequent_pieces(np.array(ids), 40, special_ids=(0, 2, 3, 4))
    assert np.flatnonzero(frequent).tolist() == [5, 6]  # 40% < 50% <= 60%
    most = heldout.frequent_pieces(np.array(ids), 40, special_ids=(0, 2, 3, 4), share=0.75)
    assert np.flatnonzero(most).tolist() == [5, 6, 7]
    assert not heldout.frequent_pieces(np.zeros(10, int), 40, special_ids=(0,)).any()


def test_the_unigram_distribution_is_the_text_pieces_shares():
    ids = [5] * 40 + [6] * 20 + [7] * 15 + list(range(8, 33)) + [0] * 50 + [2] * 30 + [3] * 30
    cdf = heldout.unigram_cdf(np.array(ids), 40, special_ids=(0, 2, 3, 4))
    assert cdf.dtype == np.float32 and cdf.shape == (40,)
    share = np.diff(np.concatenate([[0.0], cdf]))
    np.testing.assert_allclose(share[[5, 6, 7, 8]], [0.40, 0.20, 0.15, 0.01], atol=1e-6)
    assert share[[0, 2, 3, 4]].tolist() == [0, 0, 0, 0] and share[33:].sum() == 0
    assert cdf[-1] == pytest.approx(1.0) and (share >= 0).all()
    # Nothing counted: uniform over the pieces that are not special.
    empty = np.diff(heldout.unigram_cdf(np.zeros(10, int), 8, special_ids=(0, 1)), prepend=0.0)
    np.testing.assert_allclose(empty, [0, 0] + [1 / 6] * 6, atol=1e-6)
