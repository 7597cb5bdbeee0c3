"""SQuAD 1.1 and 2.0: the official JSON files -> questions -> windows of token ids.

A file is `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}` (`is_impossible` in 2.0 only).
Reading checks every field a run uses and that each answer is where it says it is:
`context[answer_start:answer_start + len(text)] == text`; anything else is a DataError naming the
file and the field (`dev-v1.1.json: data[3].paragraphs[0].qas[2].answers[1]: ...`), raised before
any tokenizing.

Windows are the original ELECTRA's (its finetune/qa/qa_tasks.py), question first:
`[CLS] question [SEP] context window [SEP]`. The question is cut to max_query_length tokens; the
context is split into windows of seq_length - len(question) - 3 tokens, each starting doc_stride
tokens after the last (the final one ends at the context's end). A question that leaves no room
for a single context token is a DataError: with the cut, that happens only when seq_length <
min(question tokens, max_query_length) + 4. A window that does not hold the whole answer (and
every window of an unanswerable question) is labelled with start = end = 0, the [CLS] token.

Every context token keeps its character span in the context (whitespace trimmed), so that a
predicted span of tokens s..e is the text context[begin(s):end(e)], exactly the characters the
tokens came from, whatever the tokenizer normalised (lower case, accents, NFKC).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from electra_jax.errors import DataError
from electra_jax.store import jsonio
from electra_jax.store.jsonio import json_kind, one_line

VERSIONS = ("1.1", "2.0")
URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"


def file_names(version: str) -> tuple[str, str]:
    """The official (train, dev) file names of a SQuAD version."""
    return f"train-v{version}.json", f"dev-v{version}.json"


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset of the text in the context


@dataclasses.dataclass(frozen=True)
class Example:
    """One question about one context."""

    qid: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # the gold answers; () when the question has none (2.0)
    source: str  # file and field, for messages

    @property
    def is_impossible(self) -> bool:
        return not self.answers


# ------------------------------------------------------------------------------------ reading


def _get(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key], which must be of `kind`; DataError naming the field otherwise."""
    if not isinstance(obj, dict):
        raise DataError(f"{where} is a JSON {json_kind(obj)}, not an object")
    if key not in obj:
        raise DataError(f"{where} has no '{key}'")
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        expected = {list: "list", str: "string", int: "whole number", bool: "boolean"}[kind]
        raise DataError(f"{where}.{key} is a JSON {json_kind(value)}, not a {expected}")
    if kind is str:
        # A "\ud800" escape is valid JSON but no text the tokenizer can encode: U+FFFD in its
        # place, one character for one, so that answer_start still points at the answer.
        value, _ = jsonio.without_lone_surrogates(value)
    return value


def read_squad(path: str, version: str) -> list[Example]:
    """The questions of one official SQuAD file, in file order.

    Raises:
      DataError: the file is missing or not JSON; a field is absent or of the wrong type; an
        answer is not at its answer_start in the context; an answerable question has no answer;
        a question id repeats; a 1.1 file has an unanswerable question; it has no question at
        all. The message names the file and the field and says what to do.
    """
    name = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = jsonio.loads(f.read())
    except FileNotFoundError:
        raise DataError(
            f"{path} is missing; download it from {URL}{name} into config.data_dir"
        ) from None
    except (OSError, ValueError) as e:
        reason = jsonio.text_problem(e) if isinstance(e, ValueError) else one_line(e, 200)
        raise DataError(
            f"{path} is not a readable JSON file ({reason}); download it again from {URL}{name}"
        ) from None
    try:
        examples = _examples(data, name, version)
    except DataError as e:
        raise DataError(f"{path}: {e}; correct the file or download it again") from None
    if not examples:
        # A dev set of none would be scored 0 and written as a result.
        raise DataError(f"{path} has no questions; download it again from {URL}{name}")
    return examples


def _examples(data: Any, name: str, version: str) -> list[Example]:
    examples, seen = [], set()
    articles = _get(data, "data", list, "the top level")
    for i, article in enumerate(articles):
        for j, paragraph in enumerate(_get(article, "paragraphs", list, f"data[{i}]")):
            where_p = f"data[{i}].paragraphs[{j}]"
            context = _get(paragraph, "context", str, where_p)
            for k, qa in enumerate(_get(paragraph, "qas", list, where_p)):
                where = f"{where_p}.qas[{k}]"
                qid = _get(qa, "id", str, where)
                if qid in seen:
                    raise DataError(
                        f"{where}.id {qid!r} is used twice; question ids must be unique"
                    )
                seen.add(qid)
                question = _get(qa, "question", str, where)
                impossible = (
                    _get(qa, "is_impossible", bool, where) if "is_impossible" in qa else False
                )
                if impossible and version == "1.1":
                    raise DataError(
                        f"{where} is unanswerable (is_impossible), which only SQuAD 2.0 has; "
                        "set config.version=2.0"
                    )
                answers = [] if impossible else _get(qa, "answers", list, where)
                if not impossible and not answers:
                    raise DataError(
                        f"{where}.answers is empty; an answerable question needs at least one"
                        + (" (or is_impossible: true)" if version == "2.0" else "")
                    )
                gold = []
                for a, answer in enumerate(answers):
                    where_a = f"{where}.answers[{a}]"
                    text = _get(answer, "text", str, where_a)
                    start = _get(answer, "answer_start", int, where_a)
                    if not text.strip():
                        raise DataError(
                            f"{where_a}.text is empty; an answer is some of the context"
                        )
                    found = context[start : start + len(text)] if start >= 0 else None
                    if found != text:
                        raise DataError(
                            f"{where_a}: the text {one_line(repr(text), 80)} is not at "
                            f"answer_start {start} of the context (which has "
                            f"{one_line(repr(found), 80)} there)"
                        )
                    gold.append(Answer(text, start))
                source = f"{name}: {where}"
                examples.append(Example(qid, question, context, tuple(gold), source))
    return examples


# ------------------------------------------------------------------------------------ tokens


def encode_with_offsets(
    tokenizer: Any, texts: Sequence[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text: token ids [T] int32 and each token's character span [T, 2] int32 in the text.

    Spans exclude whitespace at either end (SentencePiece's '▁' pieces start at the space), so
    a whitespace-only token has an empty span. The ids are those of tokenizer.encode.
    """
    if hasattr(tokenizer, "encode_batch_with_offsets"):  # WordPiece
        encoded = tokenizer.encode_batch_with_offsets(texts)
    else:  # data.tokenizer.Tokenizer: SentencePiece reports character offsets itself
        # sentencepiece: only on the path that uses it (an optional extra, or slow to import).
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
        mapped = processor.encode(list(texts), return_type="offset_mapping") if texts else []
        encoded = [(m["ids"], m["offsets"]) for m in mapped]
    out = []
    for text, (ids, offsets) in zip(texts, encoded, strict=True):
        spans = np.asarray(offsets, np.int32).reshape(-1, 2)
        for t, (begin, end) in enumerate(spans):
            while begin < end and text[begin].isspace():
                begin += 1
            while end > begin and text[end - 1].isspace():
                end -= 1
            spans[t] = begin, end
        out.append((np.asarray(ids, np.int32), spans))
    return out


def answer_tokens(spans: np.ndarray, answer: Answer) -> tuple[int, int]:
    """(first, last) index of the tokens that cover the answer's characters; spans [T, 2].

    The tokens are those with a non-empty span overlapping the answer: their text,
    context[spans[first, 0]:spans[last, 1]], is the answer itself when token boundaries fall on
    the answer's ends, else the whole tokens around it ('Japan' in 'Japanese' is 'Japanese').
    """
    end = answer.start + len(answer.text)
    hit = np.flatnonzero(
        (spans[:, 0] < spans[:, 1]) & (spans[:, 0] < end) & (spans[:, 1] > answer.start)
    )
    if not hit.size:
        raise ValueError(f"no token covers characters {answer.start}-{end}")
    return int(hit[0]), int(hit[-1])


# ------------------------------------------------------------------------------------ windows


@dataclasses.dataclass
class Features:
    """The windows of a list of examples, one row each (N windows, L = seq_length).

    Row position p of window f is context token p - window_offset[f] + window_start[f] when
    window_offset[f] <= p < window_offset[f] + window_length[f].
    """

    input_ids: np.ndarray  # [N, L] int32: [CLS] question [SEP] window [SEP], then padding
    segment_ids: np.ndarray  # [N, L] int32: 0 for [CLS] question [SEP], 1 for window [SEP]
    input_mask: np.ndarray  # [N, L] int32: 1 on real tokens
    start_positions: np.ndarray  # [N] int32: the answer's first token; 0 ([CLS]) for none
    end_positions: np.ndarray  # [N] int32: its last token; 0 for none
    is_impossible: np.ndarray  # [N] int32: 1 when the question has no answer (2.0)
    example_index: np.ndarray  # [N] int32: which example the window belongs to
    window_start: np.ndarray  # [N] int32: the window's first context token
    window_offset: np.ndarray  # [N] int32: its row position (after [CLS] question [SEP])
    window_length: np.ndarray  # [N] int32: its number of context tokens
    # Per example: [T, 2] character spans of its context's T tokens, and [T] the window (a row
    # index) where each token has the most context.
    token_spans: list[np.ndarray]
    max_context_window: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.input_ids)

    def model_inputs(self) -> dict[str, np.ndarray]:
        """What the compiled train step reads: [N, L] ids, segments, mask; [N] labels."""
        keys = ("input_ids", "segment_ids", "input_mask", "start_positions", "end_positions")
        return {k: getattr(self, k) for k in (*keys, "is_impossible")}


def window_starts(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the context windows: each starts `stride` tokens (at most its own
    length) after the last, and the last ends at the context's end. At least one window."""
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, window)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


def max_context(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """[num_tokens] int: for each token, the window (index into spans) where it has the most
    context: min(tokens left, tokens right) + 0.01 x the window's length, as the original's
    _check_is_max_context; the first window wins a tie."""
    best = np.full(num_tokens, -np.inf)
    owner = np.zeros(num_tokens, np.int64)
    for w, (start, length) in enumerate(spans):
        pos = np.arange(start, start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = score > best[pos]
        best[pos[better]] = score[better]
        owner[pos[better]] = w
    return owner


def make_features(
    tokenizer: Any,
    examples: Sequence[Example],
    seq_length: int,
    doc_stride: int,
    max_query_length: int,
) -> Features:
    """All windows of all examples, in example order. The label of a window is the first gold
    answer (as the original trains), or [CLS] when the window lacks it or there is none.

    Raises:
      DataError: a question leaves no room for context (see the module docstring); an answer
        covers no token (it is only characters the tokenizer drops).
    """
    contexts = sorted({e.context for e in examples})
    context_tokens = dict(zip(contexts, encode_with_offsets(tokenizer, contexts), strict=True))
    questions = tokenizer.encode_batch([e.question for e in examples]) if examples else []
    cls, sep, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
    rows, labels, windows_of, spans_of, owners = [], [], [], [], []
    for index, (example, question) in enumerate(zip(examples, questions, strict=True)):
        query = list(question[:max_query_length])
        room = seq_length - len(query) - 3
        if room < 1:
            raise DataError(
                f"{example.source}: the question has {len(query)} tokens (after the cut to "
                f"config.max_query_length={max_query_length}), which leaves no room for context "
                f"in config.seq_length={seq_length}; raise seq_length or lower max_query_length"
            )
        ids, spans = context_tokens[example.context]
        gold = None
        if example.answers:
            try:
                gold = answer_tokens(spans, example.answers[0])
            except ValueError as e:
                raise DataError(f"{example.source}.answers[0]: {e}; correct the answer") from None
        windows = window_starts(len(ids), room, doc_stride)
        offset = len(query) + 2  # [CLS] question [SEP]
        spans_of.append(spans)
        owners.append(max_context(windows, len(ids)) + len(rows))  # as row indices
        for start, length in windows:
            rows.append([cls, *query, sep, *ids[start : start + length].tolist(), sep])
            inside = gold is not None and start <= gold[0] and gold[1] < start + length
            first, last = (gold[0] - start + offset, gold[1] - start + offset) if inside else (0, 0)
            labels.append((first, last, int(example.is_impossible), index))
            windows_of.append((start, offset, length))
    n = len(rows)
    input_ids = np.full((n, seq_length), pad, np.int32)
    input_mask = np.zeros((n, seq_length), np.int32)
    segment_ids = np.zeros((n, seq_length), np.int32)
    for i, (row, (_, offset, _)) in enumerate(zip(rows, windows_of, strict=True)):
        input_ids[i, : len(row)] = row
        input_mask[i, : len(row)] = 1
        segment_ids[i, offset : len(row)] = 1
    labels = np.asarray(labels, np.int32).reshape(n, 4)
    windows = np.asarray(windows_of, np.int32).reshape(n, 3)
    return Features(
        input_ids=input_ids,
        segment_ids=segment_ids,
        input_mask=input_mask,
        start_positions=labels[:, 0],
        end_positions=labels[:, 1],
        is_impossible=labels[:, 2],
        example_index=labels[:, 3],
        window_start=windows[:, 0],
        window_offset=windows[:, 1],
        window_length=windows[:, 2],
        token_spans=spans_of,
        max_context_window=owners,
    )
