"""electra_jax.load / load_pretrained: workdirs, exports, transformers checkpoints, bad paths."""

import json
import os
import re
import shutil
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import electra_jax
from electra_jax import pretrained
from electra_jax.data.wordpiece import WordPieceTokenizer
from electra_jax.hf import read as hf_read
from electra_jax.hf import tokenizer_files
from tests.conftest import ROOT, subprocess_env
from tests.test_export import TEXTS, make_export, make_workdir, ours_logits


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    return make_export(tmp_path_factory)


def test_load_workdir_and_export_agree(run, exported):
    from_run = electra_jax.load(run["path"])
    from_export = electra_jax.load(exported)
    assert "(checkpoint 6)" in from_run.source  # the newest checkpoint
    ids = from_run.tokenize([TEXTS[0], (TEXTS[1], TEXTS[2])])
    assert set(ids) == {"input_ids", "segment_ids", "input_mask"}
    assert all(v.dtype == np.int32 for v in ids.values())
    tok = run["tokenizer"]
    a, b = tok.encode(TEXTS[1]), tok.encode(TEXTS[2])
    assert ids["input_ids"][1].tolist() == [2, *a, 3, *b, 3]
    assert ids["segment_ids"][1].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    n0 = len(tok.encode(TEXTS[0])) + 2
    assert ids["input_mask"][0].tolist() == [1] * n0 + [0] * (ids["input_ids"].shape[1] - n0)

    logits = from_run.replaced_token_logits(ids)
    hidden = from_run.encode(ids)
    batch, length = ids["input_ids"].shape
    assert logits.shape == (batch, length) and logits.dtype == np.float32
    assert hidden.shape == (batch, length, run["spec"].discriminator.hidden_size)
    np.testing.assert_array_equal(from_export.replaced_token_logits(ids), logits)
    # The same rows padded further give the same numbers at the real tokens.
    wide = from_run.tokenize([TEXTS[0], (TEXTS[1], TEXTS[2])], max_length=100)
    assert wide["input_ids"].shape == (2, 100) and length < 100
    np.testing.assert_allclose(
        from_run.replaced_token_logits(wide)[:, :length] * ids["input_mask"],
        logits * ids["input_mask"],
        atol=1e-5,
    )
    # Truncation takes tokens from the longer segment first.
    short = from_run.tokenize([(TEXTS[1], TEXTS[0])], max_length=12)
    assert short["input_mask"].sum() == 12 and short["input_ids"][0, -1] == 3


def _google_style_pair(root, torch, transformers):
    """A random ELECTRA pair saved by transformers, with a BERT vocab.txt ([UNK] at 100).

    The generator is as wide as the discriminator, as in the released Small++ models, and the
    two share their embeddings, as a jointly trained pair does.
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", *[f"[unused{i}]" for i in range(99)], "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [*".,!?'-()0123456789", *letters, *[f"##{c}" for c in letters]]
    vocab += ["the", "chef", "cook", "##ed", "meal", "numbers", "of", "and", "cafe", "naive"]
    torch.manual_seed(0)
    config = dict(
        vocab_size=len(vocab),
        embedding_size=16,
        num_hidden_layers=2,
        max_position_embeddings=64,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
    )
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**config))
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**config))
    with torch.no_grad():
        for m in (disc, gen):
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    for name, m in (("discriminator", disc), ("generator", gen)):
        folder = os.path.join(root, name)
        m.save_pretrained(folder)
        with open(os.path.join(folder, "vocab.txt"), "w") as f:
            f.write("".join(f"{v}\n" for v in vocab))
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            f.write('{"do_lower_case": true}')
    return disc.eval(), gen.eval()


def test_import_of_a_transformers_pair_with_a_full_size_generator(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    disc, gen = _google_style_pair(str(tmp_path), torch, transformers)
    pre = pretrained.load_pretrained(f"hf:{tmp_path}")
    g = pre.spec.generator
    assert (g.hidden_size, g.num_heads, g.intermediate_size) == (32, 2, 64)
    tok = pre.tokenizer
    assert isinstance(tok, WordPieceTokenizer)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "discriminator"))
    pairs = [("The Chef cooked a meal!", "Numbers 42, naïve CAFÉ"), ("Ünknown ∑ text", "x")]
    ours = pretrained.tokenize(tok, pairs, 64)
    theirs = hf_tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="np")
    np.testing.assert_array_equal(theirs["input_ids"], ours["input_ids"])
    np.testing.assert_array_equal(theirs["token_type_ids"], ours["segment_ids"])
    assert tok.decode(tok.encode("The chef cooked")) == "the chef cooked"

    inputs = {
        "input_ids": torch.tensor(ours["input_ids"], dtype=torch.long),
        "token_type_ids": torch.tensor(ours["segment_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(ours["input_mask"], dtype=torch.long),
    }
    with torch.no_grad():
        want_disc = disc(**inputs).logits.numpy()
        want_gen = gen(**inputs).logits.numpy()
    got_gen, got_disc = ours_logits(pre.spec, pre.params, ours)
    np.testing.assert_allclose(got_disc, want_disc, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got_gen, want_gen, atol=1e-4, rtol=0)

    # One discriminator folder: the generator is initialised at 1/4 of its width.
    single = pretrained.load_pretrained(f"hf:{tmp_path / 'discriminator'}")
    assert single.spec.generator.hidden_size == 8 and "initialised" in single.source
    for key in ("embeddings", "discriminator", "discriminator_predictions_dense"):
        jax.tree_util.tree_map(np.testing.assert_array_equal, single.params[key], pre.params[key])
    # Initialised as model.Electra would: the projection Glorot-uniform, other kernels the
    # truncated normal of std initializer_range.
    project = single.params["generator"]["embeddings_project"]["kernel"]
    limit = np.sqrt(6 / sum(project.shape))
    assert 2 * single.spec.initializer_range < np.abs(project).max() <= limit
    layer = single.params["generator"]["layers"]["intermediate"]["kernel"]  # all layers, stacked
    assert np.abs(layer).max() <= 2 * single.spec.initializer_range


def test_a_chosen_checkpoint_step_loads(run, tmp_path):
    newest = pretrained.load_pretrained(run["path"])
    older = pretrained.load_pretrained(f"{run['path']}@3")
    assert "(checkpoint 3)" in older.source and "(checkpoint 6)" in newest.source
    assert pretrained.load_pretrained(f"{run['path']}@6").source == newest.source
    a = older.params["discriminator"]
    b = newest.params["discriminator"]
    assert not all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )
    with pytest.raises(pretrained.PretrainedError, match="no checkpoint of step 4; it has 3, 6"):
        pretrained.load_pretrained(f"{run['path']}@4")


def test_bad_paths_are_one_line_errors(run, exported, tmp_path):
    def error(path):
        with pytest.raises(pretrained.PretrainedError) as e:
            pretrained.load_pretrained(path)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "does not exist" in error(str(tmp_path / "missing"))
    assert "does not exist" in error(f"hf:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    assert "neither a workdir" in error(str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    weights = broken / "generator" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    message = error(str(broken))
    assert str(weights) in message and "cannot be read" in message
    (broken / "discriminator" / "config.json").write_text('{"model_type": "bert"}')
    assert "not an ELECTRA config" in error(str(broken))
    shutil.rmtree(broken / "discriminator")
    assert "neither a workdir" in error(str(broken))
    assert error(f"{exported}@3") == (
        f"{exported}@3: @STEP picks a checkpoint of a pre-training workdir, and {exported} is an "
        "export or hf: folder, which keeps none; give " + str(exported) + " without @3"
    )


HEAVY = {"jax", "flax", "orbax", "torch", "transformers"}


def test_import_electra_jax_does_not_import_jax():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, electra_jax; print(sorted({'jax', 'flax'} & set(sys.modules)))",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.fixture(scope="module")
def micro_model(run):
    """A Model of the micro workdir's parameters (nothing compiles until it is called)."""
    return pretrained.Model(
        pretrained.Pretrained(run["spec"], run["params"], run["tokenizer"], "a run")
    )


def _batch(**changes):
    batch = {
        "input_ids": np.array([[2, 10, 11, 3], [2, 12, 3, 0]]),
        "segment_ids": np.array([[0, 0, 0, 0], [0, 0, 1, 0]]),
        "input_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }
    for key, (where, value) in changes.items():
        batch[key] = batch[key].copy()
        batch[key][where] = value
    return batch


# The micro model has vocab_size 300 and type_vocab_size 2.
@pytest.mark.parametrize(
    "ids, match",
    [
        (
            _batch(input_ids=((0, 1), 300)),
            r"input_ids holds 300 at \[0, 1\]; token ids must be in "
            r"\[0, 300\) \(the model's vocab_size\)",
        ),
        (
            _batch(input_ids=((1, 2), -1)),
            r"input_ids holds -1 at \[1, 2\]; token ids must be in "
            r"\[0, 300\)",
        ),
        (np.array([[2, 10**6, 3]]), r"input_ids holds 1000000 at \[0, 1\]; token ids must be"),
        (
            _batch(segment_ids=((1, 2), 2)),
            r"segment_ids holds 2 at \[1, 2\]; segment ids must be "
            r"in \[0, 2\) \(the model's type_vocab_size\)",
        ),
        (_batch(segment_ids=((0, 0), -3)), r"segment_ids holds -3 at \[0, 0\]"),
        (
            _batch(input_mask=((0, 3), 2)),
            r"input_mask holds 2 at \[0, 3\]; it must be 1 for "
            "tokens and 0 for padding",
        ),
        (_batch(input_mask=((1, 3), -1)), r"input_mask holds -1 at \[1, 3\]"),
        (
            {**_batch(), "segment_ids": np.zeros((2, 3), int)},
            r"segment_ids has shape \(2, 3\) "
            r"but input_ids has \(2, 4\)",
        ),
        ({**_batch(), "input_mask": np.ones((1, 4), int)}, r"input_mask has shape \(1, 4\)"),
        (
            {**_batch(), "input_ids": np.full((2, 4), 2.5)},
            "input_ids must hold integers, got dtype float64",
        ),
        ([[2, 10, 3], [2, 3]], "input_ids is not a rectangular array"),
        (
            {"segment_ids": np.zeros((1, 3), int)},
            r"the batch has no input_ids \(its keys: "
            r"\['segment_ids'\]\)",
        ),
    ],
)
@pytest.mark.parametrize("method", ["replaced_token_logits", "encode"])
def test_model_refuses_inputs_outside_its_tables(micro_model, method, ids, match):
    with pytest.raises(ValueError, match=match) as e:
        getattr(micro_model, method)(ids)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "texts, max_length, error, says",
    [
        ([], None, ValueError, "texts is empty; give at least one string or (a, b) pair"),
        (None, None, TypeError, "texts must be a string or a list of strings"),
        (b"bytes", None, TypeError, "texts must be a string or a list of strings"),
        (["a", None], None, TypeError, "texts[1] must be a string or an (a, b) pair"),
        ([("a", "b", "c")], None, TypeError, "texts[0] must be a string or an (a, b) pair"),
        ("x \ud800 y", None, ValueError, r"texts holds a lone surrogate '\ud800' at character 2"),
        ("a", 0, ValueError, "max_length=0 must be in [2, 512]"),
        ("a", 513, ValueError, "max_length=513 must be in [2, 512]"),
        ("a", 1.5, TypeError, "max_length must be a whole number, got float"),
        ("a", True, TypeError, "max_length must be a whole number, got bool"),
        ([("a", "b")], 2, ValueError, "max_length=2 must be at least 3"),
    ],
)
def test_tokenize_answers_bad_arguments_as_python_does(micro_model, texts, max_length, error, says):
    assert micro_model.spec.max_position_embeddings == 512  # the bounds named below
    with pytest.raises(error, match=re.escape(says)):
        micro_model.tokenize(texts, max_length=max_length)


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


def _edit_config(**changes):
    def edit(folder):
        path = folder / "discriminator" / "config.json"
        with open(path) as f:
            config = json.load(f)
        for key, value in changes.items():
            if value is _DROP:
                del config[key]
            else:
                config[key] = value
        _write_json(path, config)

    return edit


_DROP = object()


def _index(weight_map=None, index=None):
    """discriminator/model.safetensors moved one folder up and named by a sharded index."""

    def edit(folder):
        disc = folder / "discriminator"
        os.replace(disc / "model.safetensors", folder / "model.safetensors")
        data = index if index is not None else {"metadata": {}, "weight_map": weight_map}
        _write_json(disc / "model.safetensors.index.json", data)

    return edit


def _damaged_weights(content):
    def edit(folder):
        (folder / "discriminator" / "model.safetensors").write_bytes(content)

    return edit


def _nan_in(tensor):
    def edit(folder):
        from safetensors.numpy import load_file, save_file

        path = folder / "discriminator" / "model.safetensors"
        tensors = load_file(str(path))
        tensors[tensor] = tensors[tensor].copy()
        tensors[tensor].flat[5] = np.nan
        save_file(tensors, str(path), metadata={"format": "pt"})

    return edit


def _generator_with_another_tokenizer(folder):
    """The generator's folder holding a BERT vocab.txt beside the discriminator's spm.model."""
    os.remove(folder / "generator" / "spm.model")
    (folder / "generator" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            _generator_with_another_tokenizer,
            r"generator holds another tokenizer \(WordPiece vocab.txt, 6 pieces, sha256 \w+\) "
            r"than .*discriminator \(SentencePiece, 300 pieces",
        ),
        (
            _edit_config(vocab_size=1e12),
            "vocab_size is 1000000000000.0; it must be a whole number from 1 to 2097152",
        ),
        (_edit_config(vocab_size=10**12), "vocab_size is 1000000000000; it must be"),
        (_edit_config(vocab_size="300"), "vocab_size is '300'; it must be"),
        (_edit_config(vocab_size=-5), "vocab_size is -5; it must be"),
        (_edit_config(hidden_size=64.5), "hidden_size is 64.5; it must be"),
        (_edit_config(num_attention_heads=0), "num_attention_heads is 0; it must be"),
        (
            _edit_config(num_attention_heads=3),
            "hidden_size 64 is not a multiple of num_attention_heads 3",
        ),
        (_edit_config(num_hidden_layers=10**9), "num_hidden_layers is 1000000000; it must be"),
        (_edit_config(intermediate_size=None), "intermediate_size is None; it must be"),
        (_edit_config(max_position_embeddings=True), "max_position_embeddings is True"),
        (_edit_config(type_vocab_size=_DROP), "lacks the ElectraConfig field 'type_vocab_size'"),
        (_edit_config(hidden_dropout_prob="x"), "hidden_dropout_prob is 'x'; it must be a number"),
        (_edit_config(layer_norm_eps=-1), "layer_norm_eps is -1; it must be a number"),
        (
            lambda f: _write_json(f / "discriminator" / "config.json", [1, 2]),
            r"discriminator/config.json holds a JSON list, not an object",
        ),
        (
            _index(weight_map={"w": "../model.safetensors"}),
            r"weight_map\['w'\] is "
            r"'../model.safetensors', not the name of a file beside the index",
        ),
        (_index(weight_map={"w": "../../etc/passwd"}), "'../../etc/passwd', not the name of"),
        (_index(weight_map={"w": "/etc/passwd"}), "'/etc/passwd', not the name of"),
        (_index(weight_map={"w": "sub/model.safetensors"}), "'sub/model.safetensors', not the"),
        (_index(weight_map={"w": 3}), "is 3, not the name of a file"),
        (_index(weight_map=["model.safetensors"]), "weight_map is a JSON list, not an object"),
        (_index(weight_map={}), "weight_map is empty"),
        (_index(index=["model.safetensors"]), "index.json holds a JSON list, not an object"),
        (_damaged_weights(b"\xff" * 8 + b"junk"), "model.safetensors cannot be read"),
        (_damaged_weights(b"{}"), "model.safetensors cannot be read"),
        (
            _nan_in("electra.encoder.layer.1.output.dense.bias"),
            "discriminator/model.safetensors: tensor electra.encoder.layer.1.output.dense.bias "
            r"holds 1 non-finite values \(NaN or Inf\) of 64; these weights are damaged",
        ),
    ],
)
def test_malformed_transformers_files_are_one_line_errors(exported, tmp_path, edit, match):
    folder = tmp_path / "model"
    shutil.copytree(exported, folder)
    edit(folder)
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        pretrained.load_pretrained(f"hf:{folder}")
    assert "\n" not in str(e.value)


def _wordpiece_folder(folder, tokenizer_config):
    folder.mkdir()
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\n")
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(tokenizer_config)
    return folder


@pytest.mark.parametrize(
    "tokenizer_config, match",
    [
        ('["do_lower_case"]', "tokenizer_config.json holds a JSON list, not an object"),
        ('"uncased"', "tokenizer_config.json holds a JSON string, not an object"),
        ("{oops", "tokenizer_config.json cannot be read"),
        ('{"do_lower_case": "yes"}', "do_lower_case is 'yes'; it must be one of true or false"),
        ('{"strip_accents": 1}', "strip_accents is 1; it must be one of null or true or false"),
        ('{"tokenize_chinese_chars": []}', "tokenize_chinese_chars is \\[\\]"),
    ],
)
def test_malformed_tokenizer_files_are_one_line_errors(tmp_path, tokenizer_config, match):
    folder = _wordpiece_folder(tmp_path / "tok", tokenizer_config)
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        tokenizer_files.read_hf_tokenizer(str(folder))
    assert "\n" not in str(e.value)


def test_a_wordpiece_folder_with_valid_options_loads(tmp_path):
    folder = _wordpiece_folder(tmp_path / "tok", '{"do_lower_case": false, "strip_accents": null}')
    tok = tokenizer_files.read_hf_tokenizer(str(folder))
    assert tok.vocab_size == 7 and tok.bert_options["do_lower_case"] is False
    bare = _wordpiece_folder(tmp_path / "bare", None)
    assert tokenizer_files.read_hf_tokenizer(str(bare)).vocab_size


@pytest.mark.parametrize(
    "state, match",
    [
        ({"w": 1, "b": 2}, "entry 'w' holds a int, not a tensor"),
        ({"w": np.zeros(2), "nested": {"b": np.zeros(2)}}, "entry 'nested' holds a dict"),
        ({3: np.zeros(2)}, "has a key 3 that is not a tensor name"),
        ([np.zeros(2)], "holds a list, not a state dict"),
        ({}, "holds no tensors"),
    ],
)
def test_a_pickled_state_dict_must_map_names_to_tensors(state, match):
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        hf_read.check_state_dict(state, "m/pytorch_model.bin", np.ndarray)
    assert str(e.value).startswith("m/pytorch_model.bin") and "\n" not in str(e.value)
    hf_read.check_state_dict({"w": np.zeros(2)}, "m/pytorch_model.bin", np.ndarray)


@pytest.mark.parametrize(
    "content, match",
    [
        (
            "fraction",
            "holds objects other than tensors, which are not loaded; convert it to "
            r"model.safetensors where the source is trusted \(transformers' "
            r"save_pretrained\(dir, safe_serialization=True\)\)",
        ),
        ("nested", "entry 'w' holds a dict, not a tensor"),
        ("garbage", "is damaged or holds objects other than tensors"),
        ("truncated", r"is damaged or not a PyTorch checkpoint \(torch.load raised"),
    ],
)
def test_a_pytorch_model_bin_that_is_not_plain_tensors_is_one_line(
    exported, tmp_path, content, match
):
    torch = pytest.importorskip("torch", reason="reading pytorch_model.bin needs torch")
    import fractions

    folder = tmp_path / "model"
    shutil.copytree(os.path.join(exported, "discriminator"), folder)
    os.remove(folder / "model.safetensors")
    path = folder / "pytorch_model.bin"
    if content == "fraction":
        torch.save({"w": torch.zeros(2), "f": fractions.Fraction(1, 3)}, path)
    elif content == "nested":
        torch.save({"w": {"b": 1}}, path)
    elif content == "garbage":
        path.write_bytes(b"not a pickle at all")
    else:
        torch.save({"w": torch.zeros(100)}, path)
        path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        pretrained.load_pretrained(f"hf:{folder}")
    message = str(e.value)
    assert "\n" not in message and "weights_only" not in message and len(message) < 400


def _run_config(edit):
    def apply(workdir):
        path = workdir / "config.json"
        with open(path) as f:
            config = json.load(f)
        edit(config)
        _write_json(path, config)

    return apply


def _set(section, key, value):
    return _run_config(lambda c: c[section].__setitem__(key, value))


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda w: _write_json(w / "config.json", [1, 2]),
            "config.json holds a JSON list, not an object",
        ),
        (lambda w: (w / "config.json").write_text("{oops"), "config.json cannot be read"),
        (_run_config(lambda c: c.pop("generator")), "config.json has no generator section"),
        (_run_config(lambda c: c.pop("model")), "config.json has no model section"),
        (_run_config(lambda c: c.__setitem__("model", [])), "the model section is a JSON list"),
        (
            _run_config(lambda c: c.__setitem__("objective", "mlm")),
            "the objective section is a JSON string",
        ),
        (_set("model", "num_heads", 0), "model.num_heads is 0; it must be a whole number"),
        (_set("model", "num_heads", 3), "hidden size 64 is not a multiple of its 3 heads"),
        (_set("model", "hidden_size", 10**9), "model.hidden_size is 1000000000; it must be"),
        (_set("model", "num_layers", "2"), "model.num_layers is '2'; it must be"),
        (_set("model", "dropout_rate", "high"), "model.dropout_rate is 'high', not a usable"),
        (
            _set("generator", "hidden_fraction", 1e9),
            "the generator's hidden_size is 64000000000; it must be",
        ),
        (
            lambda w: (w / "tokenizer" / "spm.model").write_bytes(b"garbage"),
            "not a SentencePiece model",
        ),
        (lambda w: os.remove(w / "tokenizer" / "spm.model"), "spm.model cannot be read"),
    ],
)
def test_damaged_workdirs_are_one_line_errors(run, tmp_path, edit, match):
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)  # empty: every error comes before a restore
    shutil.copy(os.path.join(run["path"], "config.json"), workdir / "config.json")
    shutil.copytree(os.path.join(run["path"], "tokenizer"), workdir / "tokenizer")
    edit(workdir)
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        pretrained.load_pretrained(str(workdir))
    assert "\n" not in str(e.value)


def test_a_workdir_loads_only_with_the_tokenizer_its_run_recorded(run, tmp_path):
    """The data record train writes beside the checkpoints names the run's tokenizer: a folder
    whose tokenizer/ was replaced (by hand, in a copy) is refused, not loaded with the wrong
    pieces; the run's own loads as before."""
    from electra_jax.data.tokenizer import load_saved

    workdir = tmp_path / "run"
    shutil.copytree(run["path"], workdir)
    fingerprint = load_saved(str(workdir / "tokenizer")).fingerprint
    record = {"format": 1, "fields": {"tokenizer_fingerprint": fingerprint}, "files": None}
    _write_json(workdir / "data_record.json", record)
    assert pretrained.load_pretrained(str(workdir)).tokenizer.fingerprint == fingerprint
    record["fields"]["tokenizer_fingerprint"] = "0" * 64  # the run trained with another one
    _write_json(workdir / "data_record.json", record)
    with pytest.raises(pretrained.PretrainedError) as e:
        pretrained.load_pretrained(str(workdir))
    assert str(e.value) == (
        f"{workdir / 'tokenizer'} is not the tokenizer the run trained with "
        f"({workdir / 'data_record.json'} records sha256 000000000000, the folder holds "
        f"{fingerprint[:12]}): put the run's tokenizer back from a copy"
    )


def test_a_checkpoint_with_non_finite_weights_is_named_not_loaded_or_skipped(run, tmp_path):
    """A diverged checkpoint is readable: it is refused by name, and never passed over for an
    older one (another step is another model)."""
    from electra_jax.pretraining.optimizer_step import TrainState
    from electra_jax.store import checkpointing
    from tests.micro import micro_config

    workdir = tmp_path / "run"
    shutil.copytree(run["path"], workdir)
    params = jax.tree_util.tree_map(np.array, run["params"])
    table = params["embeddings"]["word_embeddings"]["embedding"]
    table[7, :2] = [np.inf, np.nan]
    tx = optax.sgd(0.1)
    manager = checkpointing.make_manager(str(workdir), micro_config().checkpoint)
    it = iter(grain.MapDataset.range(8).batch(4).to_iter_dataset())
    state = TrainState(jnp.int32(9), params, tx.init(params), jax.random.PRNGKey(9))
    checkpointing.save(manager, 9, state, it)
    manager.wait_until_finished()
    manager.close()
    with pytest.raises(pretrained.PretrainedError) as e:
        electra_jax.load(str(workdir))
    assert str(e.value) == (
        f"{workdir}/checkpoints/9: tensor embeddings/word_embeddings/embedding "
        f"holds 2 non-finite values (NaN or Inf) of {table.size}; "
        "these weights are damaged or from a diverged run: load an earlier checkpoint, or "
        "write or fetch the file again"
    )
    assert pretrained.load_pretrained(f"{workdir}@6").step == 6  # the earlier one, when asked
