"""Hugging Face export: transformers loads it and computes our numbers; import is exact.

The workdir is made directly (a small SentencePiece model, config.json, two checkpoints written
through checkpointing.save) rather than by training, which would take most of the time budget.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import checkpointing, export, loop, pretrained
from electra_jax.data.tokenizer import train_tokenizer
from electra_jax.model import Electra
from electra_jax.train_step import TrainState
from tests.conftest import ROOT, micro_config, subprocess_env

_SHARED: dict = {}

# Text with punctuation, digits, accents (composed and decomposed), CJK, emoji, odd spacing.
TEXTS = [
    "The chef cooked a meal.",
    "Numbers: 3.14159, 1e-9 and 0x1F; 42% of 2,048!",
    "Café naïve résumé Ångström e\u0301 ÀÉÎÕÜ ß ø",
    "  leading,\ttabs\nand   runs of spaces  ",
    "日本語 emoji 😀🎉 ｆｕｌｌ-width ① ligature ﬁ",
    "don't stop!!! (yes) {no} <tag> @#$^&*~`|\\",
    "",
]


def _sentences():
    import pydoc_data.topics

    lines = (
        line.strip() for text in pydoc_data.topics.topics.values() for line in text.split("\n")
    )
    return [line for line in lines if line]


def _random_params(spec, seed):
    """Parameters drawn around their initial values (zero biases would hide mapping bugs).

    Drawn with numpy: compiling the model's init would take seconds of the test budget.
    """
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        centre = 1.0 if path[-1].key == "scale" else 0.0
        return (centre + rng.normal(0, 0.05, leaf.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, pretrained.abstract_params(spec))


def make_workdir(tmp_path_factory) -> dict:
    """A micro workdir with checkpoints 3 and 6, made once per session; returns its facts."""
    if "workdir" in _SHARED:
        return _SHARED["workdir"]
    root = tmp_path_factory.mktemp("export")
    workdir = os.path.join(str(root), "run")
    cfg = micro_config()
    tok = train_tokenizer(
        _sentences(),
        os.path.join(workdir, "tokenizer"),
        cfg.data.vocab_size,
        cfg.data.character_coverage,
        cfg.seed,
        20_000,
    )
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f)  # as loop.train writes it
    spec, _, tx, _, _ = loop.build(cfg, tok.vocab_size)
    manager = checkpointing.make_manager(workdir, cfg.checkpoint)
    it = iter(grain.MapDataset.range(64).batch(4).to_iter_dataset())
    for step in (3, 6):
        params = jax.device_put(_random_params(spec, step))
        state = TrainState(jnp.int32(step), params, tx.init(params), jax.random.PRNGKey(step))
        checkpointing.save(manager, step, state, it)
    manager.wait_until_finished()
    manager.close()
    params = jax.tree_util.tree_map(np.asarray, state.params)
    _SHARED["workdir"] = {
        "root": str(root),
        "path": workdir,
        "spec": spec,
        "params": params,
        "tokenizer": tok,
    }
    return _SHARED["workdir"]


def ours_logits(spec, params, batch):
    """(generator logits at every position [B, L, V], discriminator logits [B, L]), compiled.

    One compiled call of Electra.__call__: running the two methods op by op takes seconds.
    """
    ids, seg, mask = (jnp.asarray(batch[k]) for k in ("input_ids", "segment_ids", "input_mask"))
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    fn = jax.jit(lambda p, *args: Electra(spec).apply({"params": p}, *args))
    gen, disc = fn(params, ids, seg, mask, positions)
    return np.asarray(gen), np.asarray(disc)


def make_export(tmp_path_factory) -> str:
    """The workdir's export, made once per session."""
    if "export" not in _SHARED:
        run = make_workdir(tmp_path_factory)
        out = os.path.join(run["root"], "hf")
        export.export(run["path"], out)
        _SHARED["export"] = out
    return _SHARED["export"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    return make_export(tmp_path_factory)


def test_export_layout_and_exact_import(run, exported):
    assert sorted(os.listdir(exported)) == ["discriminator", "export.json", "generator"]
    for network in ("discriminator", "generator"):
        files = set(os.listdir(os.path.join(exported, network)))
        assert {"config.json", "model.safetensors", "tokenizer.json", "spm.model"} <= files
    with open(os.path.join(exported, "export.json")) as f:
        manifest = json.load(f)
    assert "(checkpoint 6)" in manifest["source"]

    back = pretrained.load_pretrained("hf:" + exported)
    assert back.spec == run["spec"]
    assert back.tokenizer.fingerprint == run["tokenizer"].fingerprint
    flat = jax.tree_util.tree_leaves_with_path(run["params"])
    got = dict(jax.tree_util.tree_leaves_with_path(back.params))
    assert len(got) == len(flat)
    for path, value in flat:
        assert got[path].dtype == np.float32
        assert np.array_equal(got[path], value), jax.tree_util.keystr(path)
    # The export dir itself (no hf: prefix) is recognised as well.
    assert pretrained.load_pretrained(exported).source.startswith("hf:")


def test_transformers_computes_our_logits(run, exported):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec, params, tok = run["spec"], run["params"], run["tokenizer"]
    batch = pretrained.tokenize(tok, [(TEXTS[0], TEXTS[1]), TEXTS[2]], 64)
    assert batch["input_mask"][1].sum() < batch["input_mask"].shape[1]  # row 1 is padded
    assert batch["segment_ids"][0].max() == 1  # row 0 has two segments
    ours_gen, ours_disc = ours_logits(spec, params, batch)
    inputs = {
        "input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
        "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(batch["input_mask"], dtype=torch.long),
    }
    disc = transformers.ElectraForPreTraining.from_pretrained(
        os.path.join(exported, "discriminator")
    ).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(
        os.path.join(exported, "generator")
    ).eval()
    with torch.no_grad():
        theirs_disc = disc(**inputs).logits.numpy()
        theirs_gen = gen(**inputs).logits.numpy()
    assert gen.config.hidden_size == spec.generator.hidden_size
    np.testing.assert_allclose(theirs_disc, ours_disc, atol=1e-4, rtol=0)
    np.testing.assert_allclose(theirs_gen, ours_gen, atol=1e-4, rtol=0)


def test_autotokenizer_gives_our_ids(run, exported):
    transformers = pytest.importorskip("transformers")
    tok = run["tokenizer"]
    hf = transformers.AutoTokenizer.from_pretrained(os.path.join(exported, "discriminator"))
    for text in TEXTS:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
    pairs = [(TEXTS[0], TEXTS[2]), (TEXTS[1], TEXTS[4]), (TEXTS[3], TEXTS[5])]
    ours = pretrained.tokenize(tok, pairs, 512)
    theirs = hf([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="np")
    np.testing.assert_array_equal(theirs["input_ids"], ours["input_ids"])
    np.testing.assert_array_equal(theirs["token_type_ids"], ours["segment_ids"])
    np.testing.assert_array_equal(theirs["attention_mask"], ours["input_mask"])
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id) == (0, 1, 2, 3)
    assert hf.mask_token_id == 4


def test_export_refuses_bad_input_and_replaces_a_previous_export(run, exported, tmp_path):
    with pytest.raises(pretrained.PretrainedError, match="does not exist"):
        export.export(str(tmp_path / "missing"), str(tmp_path / "out"))
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    shutil.copy(os.path.join(run["path"], "config.json"), empty / "config.json")
    (empty / "tokenizer").mkdir()
    run["tokenizer"].save(str(empty / "tokenizer"))
    with pytest.raises(pretrained.PretrainedError, match="holds no checkpoint") as e:
        export.export(str(empty), str(tmp_path / "out"))
    assert str(empty / "checkpoints") in str(e.value) and "\n" not in str(e.value)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(pretrained.PretrainedError, match="not an electra_jax export"):
        export.export(run["path"], str(taken))
    assert os.listdir(taken) == ["notes.txt"]
    # A previous export is replaced, leaving no temporary directories behind.
    again = tmp_path / "again"
    export.export(run["path"], str(again))
    (again / "generator" / "stale.txt").write_text("old")
    export.export(run["path"], str(again))
    assert not (again / "generator" / "stale.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["again", "empty", "taken"]


def test_cli_bad_workdir_is_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "electra_jax.export", f"--workdir={tmp_path / 'nope'}"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"error: --workdir {tmp_path / 'nope'} does not exist; give a pre-training workdir"
    ], out.stderr


def test_export_refuses_a_run_with_gdes_or_separate_embeddings(run, tmp_path):
    for sharing in ("gdes", "none"):
        spec = dataclasses.replace(run["spec"], embedding_sharing=sharing)
        pre = pretrained.Pretrained(spec, run["params"], run["tokenizer"], "a run")
        with pytest.raises(pretrained.PretrainedError, match=f"embedding_sharing='{sharing}'"):
            export.write_export(pre, str(tmp_path / sharing))
        assert not (tmp_path / sharing).exists()  # nothing written
