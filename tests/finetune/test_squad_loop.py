"""SQuAD fine-tuning end to end on tiny files in the official format: the heads, the files a run
writes (1.1 in-process, 2.0 through the command line), the same numbers for the same seed, and
bad input as one line and exit code 2."""

import functools
import json
import re
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.finetune import loop, squad_data, squad_heads
from electra_jax.model.networks import ElectraSpec, EncoderSpec
from electra_jax.model.optim import layerwise_lr_multipliers
from tests.conftest import ROOT, run_command
from tests.finetune.test_squad_data import squad_json, write_squad

TINY = {
    "vocab_size": 60,
    "seq_length": 64,
    "doc_stride": 16,
    "max_query_length": 16,
    "batch_size": 16,
    "eval_batch_size": 16,
    "num_epochs": 1.0,
    "learning_rate": 1e-3,
    "head_size": 16,
    "n_best_size": 5,
    "model.hidden_size": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.intermediate_size": 64,
    "model.embedding_size": 32,
    "model.max_position_embeddings": 64,
}


def _config(data, version, **overrides):
    config = runpy.run_path(str(ROOT / "configs" / "squad.py"))["get_config"]()
    config.version = version
    config.data_dir = str(data)
    for key, value in {**TINY, **overrides}.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    return config


def _contexts(directory, version):
    dev = json.loads((directory / squad_data.file_names(version)[1]).read_text())
    return {qa["id"]: p["context"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]}


def test_span_model_masks_conditions_the_end_and_weights_the_loss():
    enc = EncoderSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    spec = ElectraSpec(40, 32, 16, 2, enc, EncoderSpec(8, 1, 1, 32))
    # [CLS] q q [SEP] c c c [SEP] pad
    ids = jnp.asarray([[2, 7, 8, 3, 9, 10, 11, 3, 0]])
    segments = jnp.asarray([[0, 0, 0, 0, 1, 1, 1, 1, 0]])
    mask = jnp.asarray([[1, 1, 1, 1, 1, 1, 1, 1, 0]])
    allowed = np.asarray([1, 0, 0, 0, 1, 1, 1, 0, 0], bool)  # [CLS] and the context
    for joint in (True, False):
        model = squad_heads.SpanModel(spec, joint=joint, answerable=True, head_size=8, top_k=4)
        params = jax.jit(functools.partial(squad_heads.init_params, model))(jax.random.PRNGKey(0))
        # One compiled program per call (op-by-op dispatch is slower than compiling).
        train = jax.jit(functools.partial(model.apply, {"params": params}))
        predict = jax.jit(functools.partial(model.apply, {"params": params}, method=model.predict))
        out4, out5 = (
            train(ids, segments, mask, jnp.asarray([4])),
            train(ids, segments, mask, jnp.asarray([5])),
        )
        assert np.all(np.asarray(out4["start_logits"])[0, ~allowed] < -900)
        assert np.all(np.asarray(out4["end_logits"])[0, ~allowed] < -900)
        assert np.all(np.abs(np.asarray(out4["start_logits"])[0, allowed]) < 100)
        # Joint: the end depends on the start it is given; independent: it does not.
        moved = not np.allclose(out4["end_logits"], out5["end_logits"])
        assert moved == joint
        predicted = predict(ids, segments, mask)
        assert set(np.asarray(predicted["start_index"])[0]) <= set(np.flatnonzero(allowed))
        assert predicted["end_index"].shape == (1, 4, 4) and bool(predicted["finite"][0])
        if not joint:  # raw logits, the same ends for every start
            top = np.sort(np.asarray(out4["start_logits"])[0])[::-1][:4]
            np.testing.assert_allclose(np.asarray(predicted["start_score"])[0], top, rtol=1e-6)
            assert np.all(predicted["end_index"][0] == predicted["end_index"][0, :1])
    # The heads learn at the full rate, the embeddings at decay^(N + 1).
    multipliers = layerwise_lr_multipliers(params, 2, 0.5)
    assert multipliers["start_logit"]["kernel"] == 1.0
    assert multipliers["answerable_logit"]["kernel"] == 1.0
    assert multipliers["embeddings"]["word_embeddings"]["embedding"] == 0.125

    # Loss: (CE(start) + CE(end)) / 2 + weight x BCE(answerable): with uniform logits over 4
    # positions each CE is log 4; a zero logit's BCE is log 2.
    outputs = {
        "start_logits": jnp.zeros((2, 4)),
        "end_logits": jnp.zeros((2, 4)),
        "answerable_logit": jnp.zeros((2,)),
    }
    batch = {k: jnp.asarray([0, 2]) for k in ("start_positions", "end_positions")}
    batch["is_impossible"] = jnp.asarray([1, 0])
    loss = squad_heads.span_loss(outputs, batch, 0.5)
    assert float(loss) == pytest.approx(np.log(4) + 0.5 * np.log(2), rel=1e-6)
    assert float(squad_heads.span_loss(outputs, batch, 0.0)) == pytest.approx(np.log(4), rel=1e-6)


def test_squad11_writes_predictions_and_results_and_repeats(tmp_path):
    data = write_squad(tmp_path / "data", "1.1", n_train=12, n_dev=3)
    config = _config(data, "1.1")
    first = loop.finetune(config, str(tmp_path / "a"))
    assert first["num_train_examples"] == 36 and first["num_dev_examples"] == 9
    assert first["steps"] == max(1, first["num_train_windows"] // 16)
    assert first["learning_rate"] == 1e-3 and first["layer_decay"] == 0.8  # the paper's
    assert first["layer_decay_source"].startswith("paper: ELECTRA-Small")
    written = json.loads((tmp_path / "a" / "eval_results.json").read_text())
    assert {"exact_match", "f1", "total"} <= set(written) and written["total"] == 9
    assert "HasAns_exact" not in written and 0 <= written["exact_match"] <= written["f1"] <= 100
    predictions = json.loads((tmp_path / "a" / "dev_predictions.json").read_text())
    contexts = _contexts(data, "1.1")
    assert set(predictions) == set(contexts)
    assert all(p and p in contexts[q] and p == p.strip() for q, p in predictions.items())
    # The same config and seed: the same numbers and answers.
    again = loop.finetune(config, str(tmp_path / "b"))
    for key in ("exact_match", "f1", "train_loss"):
        assert again[key] == first[key]
    assert (tmp_path / "b" / "dev_predictions.json").read_text() == json.dumps(
        predictions, indent=2, sort_keys=True
    ) + "\n"


def _cli(workdir, *flags):
    return run_command(
        "electra_jax.finetune", "--config=configs/squad.py", *flags, f"--workdir={workdir}"
    )


def _flags(**overrides):
    return [f"--config.{k}={v}" for k, v in {**TINY, **overrides}.items()]


def test_squad20_through_the_command_line(tmp_path):
    data = write_squad(tmp_path / "data", "2.0", n_train=12, n_dev=3)
    workdir = tmp_path / "w"
    # A threshold above any logit this run makes: the answerable questions get spans.
    out = _cli(workdir, *_flags(version="2.0", data_dir=data, null_threshold=100.0))
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((workdir / "eval_results.json").read_text())
    for key in ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert 0 <= results[key] <= 100, key
    assert (results["total"], results["HasAns_total"], results["NoAns_total"]) == (12, 9, 3)
    predictions = json.loads((workdir / "dev_predictions.json").read_text())
    contexts = _contexts(data, "2.0")
    assert set(predictions) == set(contexts)
    assert all(p and p in contexts[q] for q, p in predictions.items())
    null_odds = json.loads((workdir / "dev_null_odds.json").read_text())
    assert set(null_odds) == set(contexts)
    # Unanswerable questions score by an empty answer: here none is empty, so NoAns is 0.
    assert results["NoAns_exact"] == 0.0


def _one_error_line(out) -> str:
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith("error: ")
    return lines[0]


def _mismatched_answer(directory):
    data = squad_json(2, "1.1")
    data["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    (directory / "dev-v1.1.json").write_text(json.dumps(data))


def _long_question(directory):
    data = squad_json(12, "1.1", seed=0)  # enough text for the tokenizer's 60 pieces
    data["data"][0]["paragraphs"][0]["qas"][1]["question"] = "who lives " * 40 + "in Oslo?"
    (directory / "train-v1.1.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "break_it,flags,expected",
    [
        (
            lambda d: (d / "train-v1.1.json").write_text('{"data": [{"paragraphs": ['),
            {},
            r"train-v1.1.json is not a readable JSON file \(.*\); download it again from https://",
        ),
        (
            lambda d: (d / "dev-v1.1.json").unlink(),
            {},
            r"dev-v1.1.json is missing; download it from https://rajpurkar.github.io/",
        ),
        (
            _mismatched_answer,
            {},
            r"dev-v1.1.json: data\[1\].paragraphs\[0\].qas\[0\].answers\[0\]: the text '\w+' is "
            r"not at answer_start \d+ of the context",
        ),
        (
            _long_question,
            {"max_query_length": 64},
            r"train-v1.1.json: data\[0\].paragraphs\[0\].qas\[1\]: the question has 6\d tokens",
        ),
        (lambda d: None, {"version": "3.0"}, r"config.version='3.0' is not a SQuAD"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, break_it, flags, expected):
    data = write_squad(tmp_path / "data", "1.1", n_train=2, n_dev=1)
    break_it(data)
    out = _cli(tmp_path / "w", *_flags(data_dir=data, **flags))
    line = _one_error_line(out)
    assert re.search(expected, line), line
    assert not (tmp_path / "w" / "eval_results.json").exists()
