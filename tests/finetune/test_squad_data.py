"""SQuAD files -> questions -> windows: the checks on the files, the windows' layout and labels,
and character offsets that give back every gold answer exactly, for both tokenizers."""

import json
import random

import numpy as np
import pytest

from electra_jax.data.tokenizer import train_tokenizer
from electra_jax.data.wordpiece import WordPieceTokenizer
from electra_jax.errors import DataError
from electra_jax.finetune import squad_data

NAMES = ["anna", "boris", "carla", "dmitri", "elena", "felix", "greta", "hugo"]
CITIES = ["Paris", "Oslo", "Lima", "Quito", "Cairo", "Delhi", "Tokyo", "Rome"]
THINGS = ["cat", "piano", "bicycle", "garden", "café", "boat"]


def squad_json(n_paragraphs, version="1.1", seed=0):
    """An official-format SQuAD file: short stories with 'Who lives in X?' questions (and, in
    2.0, an unanswerable one per paragraph), answers at their true character offsets."""
    rng = random.Random(seed)
    articles = []
    for p in range(n_paragraphs):
        people = rng.sample(NAMES, 3)
        cities = rng.sample(CITIES, 3)
        sentences = [f"{n.capitalize()} lives in {c}." for n, c in zip(people, cities, strict=True)]
        sentences.insert(1, f"The {rng.choice(THINGS)} is old (1895-1943).")
        context = " ".join(sentences)
        qas = []
        for q, (name, city) in enumerate(zip(people, cities, strict=True)):
            text = name.capitalize()
            qa = {
                "id": f"q{p}-{q}",
                "question": f"Who lives in {city}?",
                "answers": [{"text": text, "answer_start": context.index(text)}],
            }
            if version == "2.0":
                qa["is_impossible"] = False
            qas.append(qa)
        if version == "2.0":
            missing = next(c for c in CITIES if c not in cities)
            qas.append(
                {
                    "id": f"q{p}-none",
                    "question": f"Who lives in {missing}?",
                    "answers": [],
                    "plausible_answers": [{"text": "Paris", "answer_start": 0}],
                    "is_impossible": True,
                }
            )
        articles.append({"title": f"t{p}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": version, "data": articles}


def write_squad(directory, version, n_train, n_dev):
    directory.mkdir(parents=True, exist_ok=True)
    train, dev = squad_data.file_names(version)
    (directory / train).write_text(json.dumps(squad_json(n_train, version, seed=0)))
    (directory / dev).write_text(json.dumps(squad_json(n_dev, version, seed=1)))
    return directory


def sentencepiece(tmp_path, examples, vocab_size=60):
    texts = sorted({e.context for e in examples}) + [e.question for e in examples]
    return train_tokenizer(texts, str(tmp_path / "spm"), vocab_size, 1.0, 0, len(texts) + 1)


def wordpiece():
    words = ["who", "lives", "in", "the", "is", "old", "(", ")", "-", ".", "?", "1895", "1943"]
    # Lower-cased and accent-stripped, as BERT's uncased vocabularies are.
    words += NAMES + [c.lower() for c in CITIES] + [t.replace("é", "e") for t in THINGS]
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s"])


def test_read_squad_gives_questions_answers_and_sources(tmp_path):
    directory = write_squad(tmp_path, "2.0", 2, 1)
    examples = squad_data.read_squad(str(directory / "train-v2.0.json"), "2.0")
    assert len(examples) == 8 and [e.is_impossible for e in examples[:4]] == [False] * 3 + [True]
    first = examples[0]
    assert first.qid == "q0-0" and first.question.startswith("Who lives in ")
    (answer,) = first.answers
    assert first.context[answer.start : answer.start + len(answer.text)] == answer.text
    assert first.source == "train-v2.0.json: data[0].paragraphs[0].qas[0]"
    # The unanswerable question's plausible answer is not a gold answer.
    assert examples[3].answers == ()


def _bad_file(tmp_path, mutate):
    data = squad_json(2, "1.1")
    mutate(data)
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (
            lambda d: d["data"][1]["paragraphs"][0]["qas"][2]["answers"][0].update(answer_start=1),
            "data[1].paragraphs[0].qas[2].answers[0]: the text ",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("question"),
            "data[0].paragraphs[0].qas[0] has no 'question'",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0].update(context=7),
            "data[0].paragraphs[0].context is a JSON number, not a string",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(id="q0-0"),
            "qas[1].id 'q0-0' is used twice",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(answers=[]),
            "qas[0].answers is empty",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=True),
            "which only SQuAD 2.0 has; set config.version=2.0",
        ),
    ],
)
def test_bad_files_are_one_data_error_naming_the_field(tmp_path, mutate, expected):
    path = _bad_file(tmp_path, mutate)
    with pytest.raises(DataError) as e:
        squad_data.read_squad(path, "1.1")
    message = str(e.value)
    assert message.startswith(path + ": ") and expected in message and "\n" not in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(DataError, match=r"dev-v2.0.json is missing; download it from https://"):
        squad_data.read_squad(str(tmp_path / "dev-v2.0.json"), "2.0")
    (tmp_path / "dev-v2.0.json").write_text('{"data": [')
    with pytest.raises(DataError, match=r"is not a readable JSON file \(Expecting value"):
        squad_data.read_squad(str(tmp_path / "dev-v2.0.json"), "2.0")


def test_windows_follow_the_original_stride():
    assert squad_data.window_starts(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert squad_data.window_starts(10, 4, 8) == [(0, 4), (4, 4), (8, 2)]  # stride <= length
    assert squad_data.window_starts(3, 4, 2) == [(0, 3)]
    assert squad_data.window_starts(0, 4, 2) == [(0, 0)]
    # Token 3 sits in windows 0 (3 left, 0 right) and 1 (1 left, 2 right): 1 wins.
    owner = squad_data.max_context([(0, 4), (2, 4), (4, 4), (6, 4)], 10)
    assert owner.tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_every_gold_answer_maps_back_to_exactly_its_text(tmp_path, kind):
    examples = squad_data._examples(squad_json(12, "2.0"), "x.json", "2.0")
    # Upper case and 'café' (normalised by both tokenizers) must not shift the offsets.
    tokenizer = sentencepiece(tmp_path, examples) if kind == "sentencepiece" else wordpiece()
    contexts = sorted({e.context for e in examples})
    encoded = squad_data.encode_with_offsets(tokenizer, contexts)
    for context, (ids, spans) in zip(contexts, encoded, strict=True):
        assert ids.tolist() == tokenizer.encode(context)
        # Spans are trimmed: no whitespace at either end.
        assert all(context[b:e] == context[b:e].strip() for b, e in spans)
    checked = 0
    for example in examples:
        ids, spans = encoded[contexts.index(example.context)]
        for answer in example.answers:
            first, last = squad_data.answer_tokens(spans, answer)
            assert example.context[spans[first, 0] : spans[last, 1]] == answer.text
            checked += 1
    assert checked == 36


def test_offsets_survive_normalisation(tmp_path):
    text = "  FIne  CAFÉ (1895-1943).\tDone"
    tokenizer = wordpiece()
    ((ids, spans),) = squad_data.encode_with_offsets(tokenizer, [text])
    pieces = [text[b:e] for b, e in spans]
    assert pieces[2:] == ["(", "1895", "-", "1943", ")", ".", "Done"]  # 'Done' is one [UNK]
    spm = sentencepiece(tmp_path, squad_data._examples(squad_json(12), "x", "1.1"))
    ((ids, spans),) = squad_data.encode_with_offsets(spm, [text])
    assert ids.tolist() == spm.encode(text)
    covered = "".join(text[b:e] for b, e in spans)
    assert covered == "".join(text.split())  # every visible character, once, in order


def test_features_layout_and_labels(tmp_path):
    examples = squad_data._examples(squad_json(3, "2.0"), "x.json", "2.0")
    tokenizer = wordpiece()
    # A small window forces several windows per context, two tokens apart.
    features = squad_data.make_features(
        tokenizer, examples, seq_length=16, doc_stride=2, max_query_length=3
    )
    assert features.input_ids.shape[1] == 16 and len(features) > len(examples)
    for row in range(len(features)):
        example = examples[features.example_index[row]]
        ids, mask = features.input_ids[row], features.input_mask[row]
        n = int(mask.sum())
        offset, length = features.window_offset[row], features.window_length[row]
        question = tokenizer.encode(example.question)[:3]
        assert ids[0] == tokenizer.cls_id and ids[1:offset].tolist() == [
            *question,
            tokenizer.sep_id,
        ]
        assert ids[n - 1] == tokenizer.sep_id and n == offset + length + 1
        assert features.segment_ids[row].tolist() == [0] * offset + [1] * (length + 1) + [0] * (
            16 - n
        )
        start, end = features.start_positions[row], features.end_positions[row]
        if start:  # the window holds the answer: its tokens spell it
            spans = features.token_spans[features.example_index[row]]
            first = features.window_start[row] - offset
            text = example.context[spans[start + first, 0] : spans[end + first, 1]]
            assert text == example.answers[0].text
        else:
            assert end == 0
        assert features.is_impossible[row] == int(example.is_impossible)
    labelled = {int(features.example_index[r]) for r in np.flatnonzero(features.start_positions)}
    assert labelled == {i for i, e in enumerate(examples) if not e.is_impossible}


def test_a_question_that_leaves_no_room_is_a_data_error(tmp_path):
    examples = squad_data._examples(squad_json(1), "train-v1.1.json", "1.1")
    with pytest.raises(DataError, match=r"train-v1.1.json: data\[0\].paragraphs\[0\].qas\[0\]: "):
        squad_data.make_features(
            wordpiece(), examples, seq_length=8, doc_stride=2, max_query_length=64
        )
    # Cut to 4 tokens, the same question leaves one token of room.
    features = squad_data.make_features(
        wordpiece(), examples, seq_length=8, doc_stride=2, max_query_length=4
    )
    assert features.window_length.min() == 1


@pytest.mark.parametrize("data", [[], [{"title": "t", "paragraphs": []}]])
def test_a_file_without_questions_is_refused_naming_it(tmp_path, data):
    """A dev file of no questions would be scored 0 and written as a result."""
    from tests.conftest import error_line, run_command

    (tmp_path / "train-v1.1.json").write_text(json.dumps(squad_json(4, "1.1", seed=0)))
    (tmp_path / "dev-v1.1.json").write_text(json.dumps({"data": data, "version": "1.1"}))
    out = run_command(
        "electra_jax.finetune",
        "--config=configs/squad.py",
        f"--config.data_dir={tmp_path}",
        f"--workdir={tmp_path / 'run'}",
    )
    assert error_line(out) == (
        f"error: {tmp_path / 'dev-v1.1.json'} has no questions; download it again from "
        f"{squad_data.URL}dev-v1.1.json"
    )
    assert not (tmp_path / "run" / "eval_results.json").exists()


def test_a_lone_surrogate_in_a_question_or_context_is_replaced_one_for_one(tmp_path):
    """Valid JSON, no text: it crashed fine-tuning inside SentencePiece. U+FFFD takes its place,
    one character for one, so that every answer_start still points at its answer."""
    data = squad_json(1, "1.1")
    paragraph = data["data"][0]["paragraphs"][0]
    paragraph["context"] = "\ud800 " + paragraph["context"]
    for qa in paragraph["qas"]:
        qa["question"] = qa["question"] + " \udc80"
        for answer in qa["answers"]:
            answer["answer_start"] += 2
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(data))  # as \ud800 escapes
    examples = squad_data.read_squad(str(path), "1.1")
    assert examples[0].context.startswith("\ufffd ") and examples[0].question.endswith(" \ufffd")
    for e in examples:
        (e.context + e.question).encode("utf-8")
        (answer,) = e.answers
        assert e.context[answer.start : answer.start + len(answer.text)] == answer.text
    tokenizer = sentencepiece(tmp_path, examples, vocab_size=40)
    assert tokenizer.encode(examples[0].question)  # the crash was here
