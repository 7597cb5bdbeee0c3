"""Fine-tuning end to end on small synthetic GLUE files: it learns, writes its results, repeats
itself under one seed, starts from a pre-trained model, and rejects bad input in one line."""

import functools
import json
import math
import random
import re
import runpy

import jax
import numpy as np
import pytest

from electra_jax.data.tokenizer import train_tokenizer
from electra_jax.errors import ConfigError, DataError, NonFiniteError
from electra_jax.finetune import fit, glue, glue_heads, initial, loop
from electra_jax.model.networks import Electra, ElectraSpec, EncoderSpec, init_params
from tests.conftest import ROOT

FILLER = [
    "the",
    "a",
    "of",
    "cat",
    "dog",
    "house",
    "tree",
    "river",
    "walks",
    "runs",
    "big",
    "small",
    "red",
    "blue",
    "old",
    "new",
]
POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]


def _sentence(rng, label):
    """Filler words and three words of one sentiment: separable by the mean of the tokens."""
    words = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))]
    words += [rng.choice(POSITIVE if label else NEGATIVE) for _ in range(3)]
    rng.shuffle(words)
    return " ".join(words)


def _sst2(directory, n_train, n_dev, seed=0):
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        labels = [rng.randint(0, 1) for _ in range(n)]
        rows = [f"{_sentence(rng, y)} \t{y}" for y in labels]
        (directory / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return directory


def _stsb(directory, n_train, n_dev, seed=0):
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    )
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = []
        for i in range(n):
            a, b = _sentence(rng, rng.randint(0, 1)), _sentence(rng, rng.randint(0, 1))
            rows.append(f"{i}\tg\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{rng.uniform(0, 5):.3f}")
        (directory / name).write_text(header + "\n" + "\n".join(rows) + "\n")
    return directory


def _config(data, **overrides):
    """configs/glue.py with a 2-layer, 32-wide model on 16-token sequences."""
    config = runpy.run_path(str(ROOT / "configs" / "glue.py"))["get_config"]()
    config.data_dir = str(data)
    config.vocab_size = 40  # what ~300 short synthetic sentences support
    config.seq_length = 16
    config.batch_size = 16
    config.eval_batch_size = 32
    config.learning_rate = 1e-3
    config.log_every_steps = 100
    config.model.hidden_size = 32
    config.model.num_layers = 2
    config.model.num_heads = 2
    config.model.intermediate_size = 64
    config.model.embedding_size = 32
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    return config


def test_finetune_learns_writes_results_and_repeats(tmp_path):
    data = _sst2(tmp_path / "SST-2", n_train=300, n_dev=64)
    config = _config(data, max_train_examples=256)
    first = loop.finetune(config, str(tmp_path / "a"))
    # 256 kept examples x 3 epochs / 16 per batch; chance is 0.5.
    assert first["steps"] == 48 and first["num_train_examples"] == 256
    assert first["num_train_examples_read"] == 300
    assert first["metrics"]["dev"]["accuracy"] > 0.8, first
    written = json.loads((tmp_path / "a" / "eval_results.json").read_text())
    assert written["task"] == "SST-2" and written["metrics"] == first["metrics"]
    assert written["score_metric"] == "dev/accuracy" and written["steps"] == 48
    # The values used: an explicit learning rate, and the paper's layer decay for the size.
    assert (written["learning_rate"], written["learning_rate_source"]) == (1e-3, "config")
    assert written["layer_decay"] == 0.8
    assert written["layer_decay_source"] == "paper: ELECTRA-Small, the nearest size to hidden 32"
    rows = [
        json.loads(x) for x in (tmp_path / "a" / "dev_predictions.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 64 and rows[0]["source"] == "dev.tsv:2"
    correct = np.mean([r["label"] == r["prediction"] for r in rows])
    assert correct == pytest.approx(first["metrics"]["dev"]["accuracy"])
    # Same seed, same numbers: same predictions, same loss.
    again = loop.finetune(config, str(tmp_path / "b"))
    assert again["metrics"] == first["metrics"] and again["train_loss"] == first["train_loss"]
    assert (tmp_path / "b" / "dev_predictions.jsonl").read_text() == (
        tmp_path / "a" / "dev_predictions.jsonl"
    ).read_text()


def test_finetune_from_pretrained_regression(tmp_path, monkeypatch):
    data = _stsb(tmp_path / "STS-B", n_train=40, n_dev=20)
    lines = [
        s for row in (data / "train.tsv").read_text().splitlines()[1:] for s in row.split("\t")[7:9]
    ]
    tokenizer = train_tokenizer(lines, str(tmp_path / "tok"), 40, 1.0, 0, 1000)
    enc = EncoderSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    spec = ElectraSpec(
        vocab_size=40,
        embedding_size=16,
        max_position_embeddings=32,
        type_vocab_size=2,
        discriminator=enc,
        generator=EncoderSpec(8, 2, 1, 32),
    )
    # Random numbers in model.Electra's tree (shapes only: nothing to compile).
    shapes = jax.eval_shape(functools.partial(init_params, Electra(spec)), jax.random.PRNGKey(7))
    rng = np.random.default_rng(7)
    params = jax.tree_util.tree_map(
        lambda x: rng.normal(0, 0.02, x.shape).astype(np.float32), shapes
    )
    fake = type(
        "Pretrained", (), dict(spec=spec, params=params, tokenizer=tokenizer, source="fake")
    )
    monkeypatch.setattr(initial, "_load_pretrained", lambda path: fake)
    dropped_in = []
    original = glue_heads.with_pretrained
    monkeypatch.setattr(
        glue_heads, "with_pretrained", lambda p, q: dropped_in.append(q) or original(p, q)
    )
    pretrained = functools.partial(_config, data, task="STS-B", init_from="some/run")
    config = pretrained(num_epochs=1.0)
    out = loop.finetune(config, str(tmp_path / "w"))
    assert (
        out["init_source"] == "fake" and dropped_in[0]["discriminator"] is params["discriminator"]
    )
    assert out["num_train_examples"] == 80  # both orders of each pair
    assert out["steps"] == 5 and set(out["metrics"]["dev"]) == {"pearson", "spearman"}
    assert out["score_metric"] == "dev/spearman"
    row = json.loads((tmp_path / "w" / "dev_predictions.jsonl").read_text().splitlines()[0])
    assert isinstance(row["prediction"], float) and isinstance(row["label"], float)
    # A pre-trained model brings its tokenizer; a second one is a contradiction.
    with pytest.raises(ConfigError, match=r"config.tokenizer='x' is for random init only"):
        loop.finetune(
            _config(data, task="STS-B", init_from="some/run", tokenizer="x"), str(tmp_path / "w")
        )
    with pytest.raises(ConfigError, match=r"config.seq_length=64 exceeds the model's 32"):
        loop.finetune(
            _config(data, task="STS-B", init_from="some/run", seq_length=64), str(tmp_path / "w2")
        )


@pytest.mark.parametrize(
    "overrides,error,expected",
    [
        ({"task": "SST3"}, ConfigError, r"config.task='SST3' is not a GLUE task"),
        (
            {"learning_rate": -1e-4},
            ConfigError,
            r"config.learning_rate=-0.0001 must be >= 0: 0 is the paper's",
        ),
        ({"layer_decay": 1.5}, ConfigError, r"config.layer_decay=1.5 must be in \[0, 1\]"),
        # Finite but meaningless in float32 arithmetic.
        ({"learning_rate": 1e-12}, ConfigError, r"config.learning_rate=1e-12 must be 0 .* or at"),
        ({"adam_eps": 1e-40}, ConfigError, r"config.adam_eps=1e-40 must be in \[1e-30, 1\]"),
        ({"dropout_rate": 0.9999999999}, ConfigError, r"config.dropout_rate=0.9999999999 must"),
        ({"num_epochs": math.inf}, ConfigError, r"config.num_epochs=inf must be a finite number"),
        (
            {"warmup_fraction": math.nan},
            ConfigError,
            r"config.warmup_fraction=nan must be a finite number",
        ),
        ({"model.type_vocab_size": 1}, ConfigError, r"config.model.type_vocab_size=1 must be"),
        ({"layer_decay_exponents": "bert"}, ConfigError, r"config.layer_decay_exponents='bert'"),
        ({"data_dir": "/nonexistent/glue"}, DataError, r"'/nonexistent/glue' is not a directory"),
        ({"task": "RTE"}, DataError, r"train.tsv line 1: the header has no column 'sentence1'"),
        ({"vocab_size": 5000}, DataError, r"config.vocab_size=5000 is too large"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, overrides, error, expected):
    data = _sst2(tmp_path / "SST-2", n_train=20, n_dev=4)
    with pytest.raises(error, match=expected):
        loop.finetune(_config(data, **overrides), str(tmp_path / "w"))


def _numeric_fields(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _numeric_fields(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def test_every_numeric_field_is_checked_before_any_work():
    """NaN or Inf in any float field, a negative number in any whole-number field: one
    ConfigError naming the field, from check_config (before data, model or compilation)."""
    fields = dict(_numeric_fields(_config("unused").to_dict()))
    assert {"num_epochs", "learning_rate", "layer_decay", "model.initializer_range"} <= set(fields)
    for key, default in fields.items():
        for bad in (math.nan, math.inf, -math.inf) if isinstance(default, float) else (-1,):
            with pytest.raises(ConfigError, match=rf"^config\.{re.escape(key)}={bad!r} must be"):
                loop.check_config(_config("unused", **{key: bad}))


@pytest.mark.parametrize(
    "max_train_examples,log_every_steps,expected",
    [
        # Two updates: the second step's loss is NaN, read at its log line.
        (32, 1, r"the training loss or gradient norm is not finite at step 2 \(checking steps 2-2"),
        # One update: no loss shows its result; the model's dev outputs do.
        (16, 100, r"after the last step \(1\) the model's outputs are not finite for 8 of the 8"),
    ],
)
def test_a_diverged_run_stops_and_writes_no_results(
    tmp_path, max_train_examples, log_every_steps, expected
):
    data = _sst2(tmp_path / "SST-2", n_train=32, n_dev=8)
    config = _config(
        data,
        learning_rate=1e10,  # the first update throws the weights to ~1e10: NaN activations
        num_epochs=1.0,
        max_train_examples=max_train_examples,
        log_every_steps=log_every_steps,
    )
    with pytest.raises(NonFiniteError, match=expected) as raised:
        loop.finetune(config, str(tmp_path / "w"))
    assert "\n" not in str(raised.value) and "lower config.learning_rate" in str(raised.value)
    for name in (loop.RESULTS_FILE, loop.PREDICTIONS_FILE):
        assert not (tmp_path / "w" / name).exists()


@pytest.mark.parametrize("scaled", [True, False])
def test_stsb_trains_on_scores_over_5_and_reports_them_on_0_to_5(tmp_path, monkeypatch, scaled):
    """As the original: STS-B's targets are score / 5; predictions come back x 5."""
    data = _stsb(tmp_path / "STS-B", n_train=16, n_dev=8)
    scores = sorted(
        float(row.split("\t")[-1]) for row in (data / "train.tsv").read_text().splitlines()[1:]
    )
    trained_on, outputs = [], []

    def spy_train_step(state, batch, **kwargs):
        jax.debug.callback(lambda y: trained_on.extend(np.asarray(y).tolist()), batch["labels"])
        return loop_train_step(state, batch, **kwargs)

    def spy_predict_step(params, batch, **kwargs):
        out = glue_predict_step(params, batch, **kwargs)
        jax.debug.callback(lambda p: outputs.extend(np.asarray(p).tolist()), out["prediction"])
        return out

    loop_train_step, glue_predict_step = fit.train_step, glue.predict_step
    monkeypatch.setattr(fit, "train_step", spy_train_step)
    monkeypatch.setattr(glue, "predict_step", spy_predict_step)
    config = _config(data, task="STS-B", num_epochs=1.0, scale_regression_targets=scaled)
    out = loop.finetune(config, str(tmp_path / "w"))

    width = 5.0 if scaled else 1.0
    # 16 pairs both ways round, 2 steps of 16: each score once or twice, over `width`.
    assert set(np.round(trained_on, 5)) <= set(np.round(np.array(scores) / width, 5))
    assert len(trained_on) == 32 and max(trained_on) > 0.5 * max(scores) / width
    rows = [
        json.loads(x) for x in (tmp_path / "w" / "dev_predictions.jsonl").read_text().splitlines()
    ]
    reported = [r["prediction"] for r in rows]
    # One prediction batch: the 8 dev rows, then padding.
    np.testing.assert_allclose(reported, width * np.array(outputs[: len(rows)]), rtol=1e-6)
    assert out["scale_regression_targets"] is scaled


def test_a_pretraining_workdir_is_refused_and_left_as_it_was(tmp_path):
    from electra_jax.run import workdir

    data = _sst2(tmp_path / "SST-2", 20, 10)
    run = tmp_path / "pretraining-run"
    workdir.claim(str(run), workdir.PRETRAIN).release()
    (run / "config.json").write_text('{"model": {}, "generator": {}, "train": {}}')
    (run / "tokenizer").mkdir()
    (run / "tokenizer" / "spm.model").write_bytes(b"the run's tokenizer")
    with pytest.raises(ConfigError, match="is a pre-training workdir; a fine-tuning run would"):
        loop.finetune(_config(data), str(run))
    assert (run / "config.json").read_text() == '{"model": {}, "generator": {}, "train": {}}'
    assert (run / "tokenizer" / "spm.model").read_bytes() == b"the run's tokenizer"
    assert sorted(p.name for p in run.iterdir()) == [
        ".electra_jax",
        ".lock",
        "config.json",
        "tokenizer",
    ]
