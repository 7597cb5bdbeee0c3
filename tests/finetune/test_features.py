"""Encoding: [CLS] A [SEP] B [SEP] with BERT's pair truncation, padding and labels."""

import itertools

import numpy as np

from electra_jax.finetune.features import encode_examples, truncate_pair
from electra_jax.finetune.tasks import Example


def _pop_longer(a, b, budget):
    """BERT's _truncate_seq_pair, literally: pop from the longer (B on a tie) until it fits."""
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_truncate_pair_is_berts_loop():
    for a, b, budget in itertools.product(range(12), range(12), range(10)):
        assert truncate_pair(a, b, budget) == _pop_longer(a, b, budget), (a, b, budget)


class _CharTokenizer:
    """One id per character (ord - 90), so expected rows can be written out."""

    pad_id, cls_id, sep_id = 0, 2, 3

    def encode_batch(self, texts):
        return [[ord(c) - 90 for c in t] for t in texts]


def test_encode_layout():
    examples = [Example("abcdef", "gh", 1, "x"), Example("ab", None, 0, "y")]
    out = encode_examples(_CharTokenizer(), examples, seq_length=8, regression=False)
    # budget 5: 'abcdef' is cut to 3 ('gh' stays), then [CLS] a b c [SEP] g h [SEP]
    np.testing.assert_array_equal(out["input_ids"][0], [2, 7, 8, 9, 3, 13, 14, 3])
    np.testing.assert_array_equal(out["segment_ids"][0], [0, 0, 0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(out["input_ids"][1], [2, 7, 8, 3, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["input_mask"][1], [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["segment_ids"][1], 0)
    assert out["labels"].dtype == np.int32 and out["labels"].tolist() == [1, 0]
    scores = encode_examples(_CharTokenizer(), [Example("a", "b", 2.5, "z")], 8, regression=True)
    assert scores["labels"].dtype == np.float32 and scores["labels"].tolist() == [2.5]
