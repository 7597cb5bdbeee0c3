"""SQuAD's answers: decoding spans from the model's scores, and the official EM and F1.

Scores, as the official evaluation scripts define them (v1.1 and v2.0): both texts are
normalised (lower case; ASCII punctuation removed; the words a, an, the removed; whitespace
collapsed). Exact match is 1 when the normalised texts are equal; F1 is the harmonic mean of the
precision and recall of the normalised words (counted with multiplicity). A question scores the
best over its gold answers; the totals are 100 x the mean over the questions.

Version 2.0 differs in two rules: gold answers that normalise to nothing are dropped, and a
question with no (remaining) gold answer has the one gold answer "" (unanswerable); F1 between
two texts of which one has no words is 1 if both have none, else 0. So an unanswerable question
scores 1 exactly when the prediction is empty (or only articles and punctuation). Version 1.1
keeps every gold answer, and F1 is 0 whenever no word is shared.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

from electra_jax.finetune.squad_data import Example, Features

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces: the official normalisation."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str, version: str = "1.1") -> float:
    """Word-overlap F1 of the normalised texts (see the module docstring for 2.0's empty rule)."""
    gold_words, pred_words = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if version == "2.0" and not (gold_words and pred_words):
        return float(gold_words == pred_words)
    common = sum((collections.Counter(gold_words) & collections.Counter(pred_words)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_words), common / len(gold_words)
    return 2 * precision * recall / (precision + recall)


def gold_texts(example: Example, version: str) -> list[str]:
    """The answers a prediction is scored against: [''] for an unanswerable 2.0 question."""
    texts = [a.text for a in example.answers]
    if version == "2.0":
        texts = [t for t in texts if normalize_answer(t)] or [""]
    return texts


def evaluate(examples: Sequence[Example], predictions: Mapping[str, str], version: str) -> dict:
    """exact_match, f1 (percent) and total over the examples; for 2.0 also HasAns_exact,
    HasAns_f1, HasAns_total, NoAns_exact, NoAns_f1, NoAns_total. `predictions` maps every
    question id to its answer text ('' for no answer); a missing id scores 0."""
    exact, f1, has_answer = [], [], []
    for example in examples:
        prediction = predictions.get(example.qid)
        golds = gold_texts(example, version)
        if prediction is None:
            exact.append(0.0)
            f1.append(0.0)
        else:
            exact.append(max(exact_match(g, prediction) for g in golds))
            f1.append(max(f1_score(g, prediction, version) for g in golds))
        has_answer.append(golds != [""])
    exact, f1, has_answer = np.asarray(exact), np.asarray(f1), np.asarray(has_answer, bool)

    def summary(keep: np.ndarray) -> tuple[float, float, int]:
        n = int(keep.sum())
        if not n:
            return 0.0, 0.0, 0
        return 100.0 * float(exact[keep].mean()), 100.0 * float(f1[keep].mean()), n

    em, f, n = summary(np.ones_like(has_answer))
    results = {"exact_match": em, "f1": f, "total": n}
    if version == "2.0":
        for prefix, keep in (("HasAns", has_answer), ("NoAns", ~has_answer)):
            em, f, n = summary(keep)
            results.update({f"{prefix}_exact": em, f"{prefix}_f1": f, f"{prefix}_total": n})
    return results


# ------------------------------------------------------------------------------------ decoding


@dataclasses.dataclass(frozen=True)
class Candidate:
    text: str
    score: float  # start score + end score
    window: int  # the feature row it came from
    start: int  # row positions of its first and last token
    end: int
    char_start: int = 0  # the text is context[char_start:char_end]
    char_end: int = 0


def window_candidates(
    features: Features,
    row: int,
    context: str,
    start_index: np.ndarray,
    start_score: np.ndarray,
    end_index: np.ndarray,
    end_score: np.ndarray,
    max_answer_length: int,
) -> list[Candidate]:
    """The valid spans among one window's top starts [K] and, per start, top ends [K, K].

    Valid, as in the original: start and end are context tokens of this window (not [CLS],
    the question or padding), the window gives the start token its widest context, end >= start
    and at most max_answer_length tokens, and the text is not empty. The text is
    context[first char of the start token : last char of the end token].
    """
    offset, length = int(features.window_offset[row]), int(features.window_length[row])
    if not length:
        return []
    first = int(features.window_start[row]) - offset  # row position -> context token
    example = int(features.example_index[row])
    spans, owner = features.token_spans[example], features.max_context_window[example]
    starts = np.broadcast_to(start_index[:, None], end_index.shape)
    ok = (starts >= offset) & (starts < offset + length)
    ok &= (end_index >= offset) & (end_index < offset + length)
    ok &= (end_index >= starts) & (end_index - starts + 1 <= max_answer_length)
    ok &= owner[np.clip(starts + first, 0, len(owner) - 1)] == row
    out = []
    for i, j in zip(*np.nonzero(ok), strict=True):
        s, e = int(starts[i, j]), int(end_index[i, j])
        begin, stop = int(spans[s + first, 0]), int(spans[e + first, 1])
        text = context[begin:stop]
        if text:
            score = float(start_score[i]) + float(end_score[i, j])
            out.append(Candidate(text, score, row, s, e, begin, stop))
    return out


def n_best(candidates: Sequence[Candidate], n_best_size: int) -> list[Candidate]:
    """The n_best_size highest-scoring candidates with distinct texts, best first (a tie keeps
    the earlier window and position)."""
    ranked = sorted(candidates, key=lambda c: (-c.score, c.window, c.start, c.end))
    out, seen = [], set()
    for c in ranked:
        if c.text not in seen:
            seen.add(c.text)
            out.append(c)
            if len(out) == n_best_size:
                break
    return out


def example_answers(
    example: Example,
    rows: Sequence[int],
    features: Features,
    outputs: Mapping[str, np.ndarray],
    *,
    n_best_size: int,
    max_answer_length: int,
) -> tuple[list[Candidate], float]:
    """One question's n-best spans over its windows `rows` (best first), and its no-answer
    score: the lowest answerable logit over the windows (see predict_answers)."""
    found = []
    for row in rows:
        found += window_candidates(
            features,
            row,
            example.context,
            outputs["start_index"][row],
            outputs["start_score"][row],
            outputs["end_index"][row],
            outputs["end_score"][row],
            max_answer_length,
        )
    null = min(float(outputs["answerable_logit"][row]) for row in rows)
    return n_best(found, n_best_size), null


def predict_answers(
    examples: Sequence[Example],
    features: Features,
    outputs: Mapping[str, np.ndarray],
    *,
    version: str,
    n_best_size: int,
    max_answer_length: int,
    null_threshold: float,
) -> tuple[dict[str, str], dict[str, float]]:
    """Each question's answer text, and (2.0) its no-answer score; from the model's outputs.

    outputs: per window (row of `features`), `start_index` [N, K] and `start_score` [N, K],
    `end_index` [N, K, K] and `end_score` [N, K, K] (the top ends for each start), and
    `answerable_logit` [N]. The answer is the best of the n-best spans over the question's
    windows ('' when none is valid). In 2.0 the no-answer score is the lowest answerable logit
    over the windows (the classifier is trained to say "unanswerable"), and the answer is ''
    when that score exceeds null_threshold, as the original decides.
    """
    by_example = collections.defaultdict(list)
    for row, example in enumerate(features.example_index):
        by_example[int(example)].append(row)
    answers, null_scores = {}, {}
    for index, example in enumerate(examples):
        best, null = example_answers(
            example,
            by_example[index],
            features,
            outputs,
            n_best_size=n_best_size,
            max_answer_length=max_answer_length,
        )
        answers[example.qid] = best[0].text if best else ""
        if version == "2.0":
            null_scores[example.qid] = null
            if null > null_threshold:
                answers[example.qid] = ""
    return answers, null_scores
