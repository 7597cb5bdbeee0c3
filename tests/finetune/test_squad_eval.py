"""SQuAD's scores (the official definitions, on hand-computed cases) and span decoding (n-best,
the maximum answer length, the max-context window, 2.0's no-answer threshold)."""

import numpy as np
import pytest

from electra_jax.finetune import squad_eval
from electra_jax.finetune.squad_data import Answer, Example, Features


def test_normalisation_and_exact_match():
    assert squad_eval.normalize_answer("The  Cat, sat!\n") == "cat sat"
    assert squad_eval.normalize_answer("an apple") == "apple"
    assert squad_eval.normalize_answer("Theatre") == "theatre"  # whole words only
    assert squad_eval.exact_match("the cat", "a cat") == 1.0  # the official script's case
    assert squad_eval.exact_match("Steve Smith's", "steve smiths") == 1.0
    assert squad_eval.exact_match("cat", "cats") == 0.0


def test_f1_counts_shared_words_with_multiplicity():
    assert squad_eval.f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)  # p 2/3, r 1
    assert squad_eval.f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)
    assert squad_eval.f1_score("cat", "dog") == 0.0
    # No words on one side: 1.1 gives 0; 2.0 gives 1 only when both are empty.
    assert squad_eval.f1_score("", "", "1.1") == 0.0
    assert squad_eval.f1_score("", "the", "2.0") == 1.0
    assert squad_eval.f1_score("", "cat", "2.0") == 0.0


def _example(qid, texts, context="ctx"):
    return Example(qid, "q?", context, tuple(Answer(t, 0) for t in texts), f"x: {qid}")


def test_evaluate_takes_the_best_gold_answer_and_the_mean():
    examples = [_example("a", ["Denver Broncos", "Broncos"]), _example("b", ["the cat sat"])]
    results = squad_eval.evaluate(examples, {"a": "broncos", "b": "cat sat down"}, "1.1")
    assert results == {
        "exact_match": pytest.approx(50.0),
        "f1": pytest.approx(90.0),  # (1 + 0.8) / 2
        "total": 2,
    }
    # A missing prediction scores 0.
    assert squad_eval.evaluate(examples, {"a": "Broncos"}, "1.1")["exact_match"] == 50.0


def test_evaluate_v2_scores_unanswerable_questions_by_an_empty_prediction():
    examples = [
        _example("has1", ["Oslo"]),
        _example("has2", ["the old cat"]),
        _example("none1", []),
        _example("none2", []),
        _example("none3", ["the"]),  # a gold answer that normalises to nothing is dropped
    ]
    preds = {"has1": "Oslo", "has2": "", "none1": "", "none2": "Oslo", "none3": ""}
    results = squad_eval.evaluate(examples, preds, "2.0")
    assert results == {
        "exact_match": pytest.approx(60.0),
        "f1": pytest.approx(60.0),
        "total": 5,
        "HasAns_exact": pytest.approx(50.0),
        "HasAns_f1": pytest.approx(50.0),
        "HasAns_total": 2,
        "NoAns_exact": pytest.approx(100 * 2 / 3),
        "NoAns_f1": pytest.approx(100 * 2 / 3),
        "NoAns_total": 3,
    }


# Context "w0 w1 ... w9": token t is the 2 characters at 3t.
CONTEXT = " ".join(f"w{t}" for t in range(10))
SPANS = np.asarray([(3 * t, 3 * t + 2) for t in range(10)], np.int32)


def _features(windows, owner=None):
    """One example; windows (context start, length), each after [CLS] q [SEP] (offset 3)."""
    n = len(windows)
    if owner is None:
        owner = np.zeros(10, np.int64)
    return Features(
        input_ids=np.zeros((n, 16), np.int32),
        segment_ids=np.zeros((n, 16), np.int32),
        input_mask=np.zeros((n, 16), np.int32),
        start_positions=np.zeros(n, np.int32),
        end_positions=np.zeros(n, np.int32),
        is_impossible=np.zeros(n, np.int32),
        example_index=np.zeros(n, np.int32),
        window_start=np.asarray([w[0] for w in windows], np.int32),
        window_offset=np.full(n, 3, np.int32),
        window_length=np.asarray([w[1] for w in windows], np.int32),
        token_spans=[SPANS],
        max_context_window=[np.asarray(owner)],
    )


def _outputs(starts, ends, answerable=0.0):
    """One window's outputs: starts {position: score}; ends {(start, end): score}."""
    k = len(starts)
    start_index = np.asarray([list(starts)], np.int32)
    start_score = np.asarray([list(starts.values())], np.float32)
    end_index = np.zeros((1, k, k), np.int32)
    end_score = np.full((1, k, k), -1e9, np.float32)
    for i, s in enumerate(starts):
        row = [(e, v) for (s2, e), v in ends.items() if s2 == s]
        for j, (e, v) in enumerate(row):
            end_index[0, i, j], end_score[0, i, j] = e, v
    return {
        "start_index": start_index,
        "start_score": start_score,
        "end_index": end_index,
        "end_score": end_score,
        "answerable_logit": np.asarray([answerable], np.float32),
    }


def _answer(features, outputs, version="1.1", max_answer_length=3, threshold=0.0):
    example = Example("q", "q?", CONTEXT, (Answer("w0", 0),), "x")
    answers, null = squad_eval.predict_answers(
        [example],
        features,
        outputs,
        version=version,
        n_best_size=5,
        max_answer_length=max_answer_length,
        null_threshold=threshold,
    )
    return answers["q"], null


def test_the_best_valid_span_wins():
    features = _features([(0, 10)])  # row positions 3..12 are tokens 0..9
    outputs = _outputs(
        {0: 9.0, 1: 8.0, 5: 2.0, 4: 1.0},  # 0 is [CLS], 1 the question: never answers
        {(0, 0): 9.0, (1, 4): 9.0, (5, 4): 8.0, (5, 9): 7.0, (5, 7): 1.0, (4, 6): 0.5},
    )
    # (5, 4) ends before it starts; (5, 9) is 5 tokens (> 3); so (5, 7) = 3.0 beats (4, 6) = 1.5
    assert _answer(features, outputs) == ("w2 w3 w4", {})
    assert _answer(features, outputs, max_answer_length=5) == ("w2 w3 w4 w5 w6", {})
    # Nothing valid: no answer.
    assert _answer(features, _outputs({0: 1.0}, {(0, 0): 1.0})) == ("", {})


def test_n_best_ranks_by_score_and_drops_repeated_texts():
    c = squad_eval.Candidate
    ranked = squad_eval.n_best(
        [c("a", 1.0, 0, 3, 3), c("b", 3.0, 1, 4, 4), c("b", 2.5, 0, 5, 5), c("d", 2.0, 0, 6, 6)],
        n_best_size=2,
    )
    assert [(x.text, x.score) for x in ranked] == [("b", 3.0), ("d", 2.0)]


def test_a_start_counts_only_in_its_max_context_window():
    # Two windows over tokens 0-5 and 4-9; tokens 0-4 have their widest context in window 0,
    # tokens 5-9 in window 1. Row position 8 of window 0 and 4 of window 1 are both token 5.
    features = _features([(0, 6), (4, 6)], np.asarray([0] * 5 + [1] * 5))
    first = _outputs({8: 50.0}, {(8, 8): 5.0})
    second = _outputs({4: 1.0}, {(4, 4): 1.0})
    keys = ("start_index", "start_score", "end_index", "end_score")
    assert squad_eval.window_candidates(features, 0, CONTEXT, *(first[k][0] for k in keys), 3) == []
    (only,) = squad_eval.window_candidates(features, 1, CONTEXT, *(second[k][0] for k in keys), 3)
    assert (only.text, only.score, only.window) == ("w5", 2.0, 1)
    outputs = {k: np.concatenate([first[k], second[k]]) for k in first}
    assert _answer(features, outputs)[0] == "w5"


def test_v2_answers_nothing_when_the_lowest_no_answer_logit_exceeds_the_threshold():
    features = _features([(0, 6), (4, 6)], np.asarray([0] * 5 + [1] * 5))
    first = _outputs({3: 2.0}, {(3, 4): 2.0}, answerable=1.5)
    second = _outputs({5: 1.0}, {(5, 5): 1.0}, answerable=-0.5)
    outputs = {k: np.concatenate([first[k], second[k]]) for k in first}
    # The no-answer score is the lowest over the windows: -0.5.
    assert _answer(features, outputs, "2.0", threshold=-1.0) == ("", {"q": -0.5})
    assert _answer(features, outputs, "2.0", threshold=-0.5) == ("w0 w1", {"q": -0.5})
