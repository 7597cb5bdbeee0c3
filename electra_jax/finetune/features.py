"""Examples -> fixed-length int32 arrays: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, padded.

The host tokenizes once, before training; the arrays are all the device ever reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from electra_jax.finetune.tasks import Example


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """BERT's _truncate_seq_pair on lengths: drop the last token of the longer text (B on a tie)
    until both fit in `budget`. Returns the kept lengths."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short = min(len_a, len_b)
    if 2 * short <= budget:  # only the longer text is cut
        return (budget - len_b, len_b) if len_a > len_b else (len_a, budget - len_a)
    # Both are cut to half the budget; the pop-from-the-longer loop leaves A the odd token.
    return (budget + 1) // 2, budget // 2


def encode_examples(
    tokenizer: Any, examples: Sequence[Example], seq_length: int, regression: bool
) -> dict[str, np.ndarray]:
    """Token ids, segment ids, input mask [N, seq_length] int32 and labels [N].

    labels are int32 class indices, or float32 scores when `regression`. Texts longer than the
    sequence are cut at the end (the longer text of a pair first), as the original does.
    """
    n = len(examples)
    ids = np.full((n, seq_length), tokenizer.pad_id, np.int32)
    segments = np.zeros((n, seq_length), np.int32)
    mask = np.zeros((n, seq_length), np.int32)
    tokens_a = tokenizer.encode_batch([e.text_a for e in examples]) if n else []
    pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
    tokens_b = tokenizer.encode_batch([examples[i].text_b for i in pairs]) if pairs else []
    tokens_b = dict(zip(pairs, tokens_b, strict=True))
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    for i in range(n):
        a, b = tokens_a[i], tokens_b.get(i)
        if b is None:
            a = a[: seq_length - 2]
            row, seg = [cls, *a, sep], [0] * (len(a) + 2)
        else:
            keep_a, keep_b = truncate_pair(len(a), len(b), seq_length - 3)
            a, b = a[:keep_a], b[:keep_b]
            row = [cls, *a, sep, *b, sep]
            seg = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        ids[i, : len(row)] = row
        segments[i, : len(row)] = seg
        mask[i, : len(row)] = 1
    label_dtype = np.float32 if regression else np.int32
    labels = np.asarray([e.label for e in examples], label_dtype).reshape(n)
    return {"input_ids": ids, "segment_ids": segments, "input_mask": mask, "labels": labels}
