"""Fine-tuned heads in transformers' layout: ElectraForSequenceClassification and
ElectraForQuestionAnswering, mapped exactly or refused.

Classification. Our head is the original ELECTRA's: one linear layer on the final [CLS] state,
logits = W h + b (W: [C, H]). transformers' ElectraClassificationHead is another structure:
out_proj(gelu(dense(h))) with dense [H, H] (its own addition; the original has no such layer).
It still computes our logits exactly, because gelu(y) - gelu(-y) = y for every y
(gelu(y) = y Phi(y) and Phi(y) + Phi(-y) = 1): dense's first C rows are W, the next C rows -W,
the others and its bias zero, so that out_proj, with +1 and -1 at those columns and our bias,
gives W h + b. That needs 2C <= H (C is at most 3 for GLUE). The values pass through gelu at
their own scale, so float32 rounding stays that of computing W h directly (no large constant is
added), and bfloat16 inference loses no more than ours. For a regression task whose targets were
scaled (STS-B trains on score / 5), the scale is folded into W and b, so transformers' logit is
the score on the task's 0-5 scale.

Question answering. transformers' ElectraForQuestionAnswering has one Linear(H, 2) for the start
and end logits. It represents our independent head (`config.joint_prediction=false`, SQuAD 1.1)
exactly: our start and end layers are its two rows (our -1000 on positions that cannot be chosen
is a mask, which its pipeline applies itself). The original's joint end prediction (the end's
logit depends on the start through a hidden layer) and SQuAD 2.0's answerability classifier have
no place in it: those are refused with a line that says why, rather than exported with logits
that differ.
"""

from __future__ import annotations

import numpy as np

from electra_jax.errors import PretrainedError

SEQUENCE_CLASSIFICATION = "ElectraForSequenceClassification"
QUESTION_ANSWERING = "ElectraForQuestionAnswering"


def classifier_to_hf(head: dict, hidden_size: int, low: float = 0.0, width: float = 1.0) -> dict:
    """Our `classifier` params (kernel [H, C], bias [C]) -> transformers' `classifier.dense.*`
    and `classifier.out_proj.*` tensors computing (low + width x) our logits exactly (see the
    module docstring). PretrainedError when 2C > H."""
    kernel = np.asarray(head["kernel"], np.float64) * width  # [H, C]
    bias = low + width * np.asarray(head["bias"], np.float64)
    h, c = kernel.shape
    if h != hidden_size or 2 * c > h:
        raise PretrainedError(
            f"the classifier has {c} outputs on a hidden size of {h}; transformers' "
            f"ElectraClassificationHead represents it exactly only when 2 x {c} <= {h}"
        )
    dense = np.zeros((h, h), np.float32)
    dense[:c] = kernel.T
    dense[c : 2 * c] = -kernel.T
    out_proj = np.zeros((c, h), np.float32)
    out_proj[np.arange(c), np.arange(c)] = 1.0
    out_proj[np.arange(c), c + np.arange(c)] = -1.0
    return {
        "classifier.dense.weight": dense,
        "classifier.dense.bias": np.zeros((h,), np.float32),
        "classifier.out_proj.weight": out_proj,
        "classifier.out_proj.bias": bias.astype(np.float32),
    }


def qa_refusal(joint: bool, answerable: bool) -> str | None:
    """Why a SQuAD head cannot be exported (None when it can)."""
    if joint:
        return (
            "its end logits depend on the start (config.joint_prediction=true, the original "
            "ELECTRA's joint head, a hidden layer on the start's and end's states), which "
            "transformers' ElectraForQuestionAnswering (one Linear for start and end) cannot "
            "represent; fine-tune with --config.joint_prediction=false to export"
        )
    if answerable:
        return (
            "it has SQuAD 2.0's answerability classifier, which transformers' "
            "ElectraForQuestionAnswering cannot represent (its pipeline scores 'no answer' from "
            "the [CLS] start and end logits instead); SQuAD 1.1 models with "
            "--config.joint_prediction=false export"
        )
    return None


def qa_to_hf(params: dict) -> dict:
    """Our independent `start_logit` and `end_logit` layers (kernel [H, 1], bias [1]) ->
    transformers' qa_outputs (weight [2, H], bias [2])."""
    start, end = params["start_logit"], params["end_logit"]
    weight = np.concatenate([np.asarray(start["kernel"]).T, np.asarray(end["kernel"]).T])
    bias = np.concatenate([np.asarray(start["bias"]), np.asarray(end["bias"])])
    return {
        "qa_outputs.weight": np.ascontiguousarray(weight, np.float32),
        "qa_outputs.bias": np.ascontiguousarray(bias, np.float32),
    }
