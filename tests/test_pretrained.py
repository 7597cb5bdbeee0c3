"""electra_jax.load / load_pretrained: workdirs, exports, transformers checkpoints, bad paths."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import electra_jax
from electra_jax import export, pretrained
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
    assert isinstance(tok, export.WordPieceTokenizer)
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


def test_a_chosen_checkpoint_step_loads(run, tmp_path):
    newest = pretrained.load_pretrained(run["path"])
    older = pretrained.load_pretrained(f"{run['path']}@3")
    assert "(checkpoint 3)" in older.source and "(checkpoint 6)" in newest.source
    assert pretrained.load_pretrained(f"{run['path']}@6").source == newest.source
    a = older.params["discriminator"]["layer_0"]
    b = newest.params["discriminator"]["layer_0"]
    assert not all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )
    with pytest.raises(pretrained.PretrainedError, match="no checkpoint of step 4; it has 3, 6"):
        pretrained.load_pretrained(f"{run['path']}@4")
    # A folder whose own name ends in '@<digits>' is that folder, not a step of another.
    assert pretrained.split_step(str(tmp_path)) == (str(tmp_path), None)
    odd = tmp_path / "run@7"
    odd.mkdir()
    assert pretrained.split_step(str(odd)) == (str(odd), None)
    assert pretrained.split_step("runs/x@12") == ("runs/x", 12)
    assert pretrained.split_step("hf:dir") == ("hf:dir", None)


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
