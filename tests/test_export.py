"""Hugging Face export: transformers loads it and computes our numbers; import is exact.

The workdir is made directly (a small SentencePiece model, config.json, two checkpoints written
through checkpointing.save) rather than by training, which would take most of the time budget.
"""

import dataclasses
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import export, pretrained
from electra_jax.data.tokenizer import train_tokenizer
from electra_jax.hf import card, previous
from electra_jax.hf import write as hf_write
from electra_jax.model.networks import Electra
from electra_jax.pretraining import program
from electra_jax.pretraining.optimizer_step import TrainState
from electra_jax.store import checkpointing
from tests.conftest import ROOT, heavy_imports_at_exit, micro_config, subprocess_env

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


# What a pre-training export holds at its top.
EXPORT_TOP = ("README.md", "discriminator", "export.json", "generator")


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
    spec, _, tx, _, _ = program.build(cfg, tok.vocab_size)
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
    assert sorted(os.listdir(exported)) == [*EXPORT_TOP]
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
    np.testing.assert_allclose(theirs_disc, ours_disc, atol=1e-6, rtol=0)
    np.testing.assert_allclose(theirs_gen, ours_gen, atol=1e-6, rtol=0)


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
    # A previous export is replaced, leaving no temporary directories behind; a file the user
    # put beside the export's own files is theirs and stays.
    again = tmp_path / "again"
    export.export(run["path"], str(again))
    (again / "generator" / "notes.txt").write_text("mine")
    export.export(run["path"], str(again))
    assert (again / "generator" / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["again", "empty", "taken"]
    assert sorted(os.listdir(again)) == [*EXPORT_TOP]


@pytest.mark.parametrize("inside", ["checkpoints/99", "checkpoints", "data/x", "tokenizer/hf"])
def test_an_export_never_lands_inside_a_folder_a_run_manages(run, tmp_path, inside):
    """Into WORKDIR/checkpoints/99 an export would be taken by the next resume for a damaged
    checkpoint and set aside; the run's own folder WORKDIR/hf is where exports go."""
    workdir = tmp_path / "run"
    shutil.copytree(run["path"], workdir)
    before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
    with pytest.raises(pretrained.PretrainedError) as e:
        export.export(run["path"], str(workdir / inside))
    top = inside.split("/")[0]
    assert str(e.value) == (
        f"--out {workdir / inside} is inside {workdir / top}, which the run in {workdir} "
        "manages (it would take what is written there for its own, or set it aside): choose a "
        "--out outside it"
    )
    assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before


@pytest.mark.parametrize(
    "given, says", [("nope", "does not exist"), ("notes.txt", "is a file, not a workdir")]
)
def test_cli_bad_workdir_is_one_line_before_jax(tmp_path, given, says):
    (tmp_path / "notes.txt").write_text("notes")
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.export", f"--workdir={tmp_path / given}"
    )
    assert code_and_imports == "2 []", stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert lines == [
        f"error: --workdir {tmp_path / given} {says}; give a pre-training or fine-tuning workdir"
    ], stderr


@pytest.mark.parametrize("sharing", ["gdes", "none"])
def test_every_embedding_sharing_mode_exports_with_our_logits(run, tmp_path, sharing):
    """Under 'gdes' the discriminator's export holds the base tables plus its deltas (and its own
    LayerNorm), under 'none' its own block; the generator's holds the tables it computes with.
    transformers then computes both networks' logits as ours do."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = dataclasses.replace(run["spec"], embedding_sharing=sharing)
    params = jax.tree_util.tree_map(np.asarray, _random_params(spec, 11))
    extra = {"gdes": "embeddings_delta", "none": "generator_embeddings"}[sharing]
    assert extra in params  # the mode's own block, drawn away from the shared one
    out = tmp_path / sharing
    manifest = hf_write.write_export(
        pretrained.Pretrained(spec, params, run["tokenizer"], "a run"), str(out)
    )
    assert manifest["embedding_sharing"] == sharing
    batch = pretrained.tokenize(run["tokenizer"], [(TEXTS[0], TEXTS[1]), TEXTS[2]], 64)
    ours_gen, ours_disc = ours_logits(spec, params, batch)
    inputs = {
        "input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
        "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(batch["input_mask"], dtype=torch.long),
    }
    disc = transformers.ElectraForPreTraining.from_pretrained(out / "discriminator").eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(out / "generator").eval()
    with torch.no_grad():
        theirs_disc = disc(**inputs).logits.numpy()
        theirs_gen = gen(**inputs).logits.numpy()
    np.testing.assert_allclose(theirs_disc, ours_disc, atol=1e-6, rtol=0)
    np.testing.assert_allclose(theirs_gen, ours_gen, atol=1e-6, rtol=0)
    print(
        sharing,
        float(np.abs(theirs_disc - ours_disc).max()),
        float(np.abs(theirs_gen - ours_gen).max()),
    )
    # The exported tables really are the mode's: the two networks' word embeddings differ.
    d = disc.electra.embeddings.word_embeddings.weight.detach().numpy()
    g = gen.electra.embeddings.word_embeddings.weight.detach().numpy()
    assert not np.array_equal(d, g)


def _as_pretrained(run) -> pretrained.Pretrained:
    """The workdir's newest parameters as plain data, without a checkpoint restore."""
    return pretrained.Pretrained(run["spec"], run["params"], run["tokenizer"], "a run")


def _snapshot(root) -> dict:
    """Every file (with its bytes) and folder under root, by relative path."""
    found = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for name in dirs:
            found[os.path.normpath(os.path.join(rel, name))] = "<dir>"
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.normpath(os.path.join(rel, name))] = f.read()
    return found


def _manifest(out) -> dict:
    with open(os.path.join(out, "export.json")) as f:
        return json.load(f)


def test_reexport_replaces_only_the_files_an_export_wrote(run, exported, tmp_path):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    manifest = _manifest(out)
    assert manifest["format"] == "electra_jax.export" and manifest["version"] == 3
    written = sorted(
        os.path.relpath(os.path.join(folder, name), out).replace(os.sep, "/")
        for folder, _, names in os.walk(out)
        for name in names
        if name != "export.json"
    )
    assert manifest["files"] == written and "discriminator/model.safetensors" in written
    # The user's files, at the top, in a folder of their own and beside the export's files.
    (out / "important.txt").write_text("keep me")
    (out / "sub").mkdir()
    (out / "sub" / "file").write_text("mine too")
    (out / "discriminator" / "notes.md").write_text("and this")
    readme = (out / "README.md").read_text()
    hf_write.write_export(_as_pretrained(run), str(out), readme=readme)
    assert (out / "important.txt").read_text() == "keep me"
    assert (out / "sub" / "file").read_text() == "mine too"
    assert (out / "discriminator" / "notes.md").read_text() == "and this"
    with open(out / "discriminator" / "config.json") as f:
        assert json.load(f)["model_type"] == "electra"
    assert _manifest(out)["files"] == written
    assert set(_manifest(out)["sha256"]) == set(written)
    assert set(written) <= previous.LAYOUT  # what a later export may replace
    assert sorted(os.listdir(out)) == [*EXPORT_TOP, "important.txt", "sub"]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_reexport_deletes_the_previous_exports_files_it_no_longer_writes(
    run, exported, tmp_path, version
):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    # As if the previous export had a WordPiece tokenizer: its vocab.txt is not written now.
    (out / "generator" / "vocab.txt").write_text("[PAD]\n")
    (out / "generator" / "user.txt").write_text("mine")
    (out / "extra").mkdir()
    (out / "extra" / "old.bin").write_text("old")
    manifest = _manifest(out)
    if version == 1:  # exports of version 1 list no files: their known layout is theirs
        del manifest["files"], manifest["sha256"]
    else:
        manifest["files"] += ["generator/vocab.txt", "extra/old.bin", "generator/user.txt"]
    if version == 2:  # no digests: the files at an export's paths are its own
        del manifest["sha256"]
    if version == 3:  # the digests of what it wrote; the user's file is listed, unvouched
        for rel in ("generator/vocab.txt", "extra/old.bin"):
            manifest["sha256"][rel] = hashlib.sha256((out / rel).read_bytes()).hexdigest()
        manifest["sha256"]["generator/user.txt"] = "0" * 64
    manifest["version"] = version
    (out / "export.json").write_text(json.dumps(manifest))
    hf_write.write_export(_as_pretrained(run), str(out))
    assert not (out / "generator" / "vocab.txt").exists()
    assert (out / "generator" / "user.txt").read_text() == "mine"
    # extra/old.bin is at no path an export writes: whatever a manifest lists, it stays.
    assert (out / "extra" / "old.bin").read_text() == "old"
    assert _manifest(out)["version"] == 3


@pytest.mark.parametrize("version", [2, 3])
def test_a_manifest_never_makes_export_delete_or_replace_a_users_file(
    run, exported, tmp_path, version
):
    # A folder that hands export a list of files (export.json copied beside a user's work, or
    # written by a careless script) gets nothing of theirs deleted or replaced: only the paths
    # an export writes and, from version 3, only the bytes its digests vouch for.
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "important.txt").write_text("keep me")
    (out / "notes").mkdir()
    (out / "notes" / "a.md").write_text("mine")
    manifest = _manifest(out)
    manifest["files"] += ["important.txt", "notes/a.md"]
    manifest.setdefault("sha256", {}).update(
        {
            "important.txt": hashlib.sha256(b"keep me").hexdigest(),  # a matching digest too
            "notes/a.md": hashlib.sha256(b"mine").hexdigest(),
        }
    )
    if version == 2:
        manifest.pop("sha256")
    manifest["version"] = version
    (out / "export.json").write_text(json.dumps(manifest))
    hf_write.write_export(_as_pretrained(run), str(out))
    assert (out / "important.txt").read_text() == "keep me"
    assert (out / "notes" / "a.md").read_text() == "mine"
    # An export's own path whose file was changed since it wrote it: refused, nothing changed.
    (out / "discriminator" / "config.json").write_text('{"edited": "by hand"}')
    before = _snapshot(tmp_path)
    with pytest.raises(pretrained.PretrainedError, match=r"config.json is there but is not the"):
        hf_write.write_export(_as_pretrained(run), str(out))
    assert _snapshot(tmp_path) == before


def _in_the_way(out):
    os.remove(out / "discriminator" / "config.json")
    (out / "discriminator" / "config.json").mkdir()


@pytest.mark.parametrize(
    "manifest, match",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not written by electra_jax \\(a JSON list\\)"),
        ('"electra_jax.export"', "not written by electra_jax \\(a JSON string\\)"),
        (
            '{"format": "someone.else"}',
            "not written by electra_jax \\(a JSON format 'someone.else'\\)",
        ),
        ('{"files": []}', "not written by electra_jax \\(a JSON format None\\)"),
        ('{"format": "electra_jax.export", "files": ["../outside.txt"]}', "not a path inside"),
        ('{"format": "electra_jax.export", "files": ["/etc/passwd"]}', "not a path inside"),
        ('{"format": "electra_jax.export", "files": ["generator/../../x"]}', "not a path inside"),
        ('{"format": "electra_jax.export", "files": "important.txt"}', "not a list of paths"),
        ('{"format": "electra_jax.export", "files": [3]}', "not a path inside"),
        (_in_the_way, "discriminator/config.json cannot be written"),
    ],
)
def test_export_refuses_a_foreign_export_json_and_touches_nothing(
    run, exported, tmp_path, manifest, match
):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "important.txt").write_text("keep me")
    (tmp_path / "outside.txt").write_text("outside")
    if callable(manifest):
        manifest(out)
    else:
        (out / "export.json").write_text(manifest)
    before = _snapshot(tmp_path)
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        hf_write.write_export(_as_pretrained(run), str(out))
    assert "\n" not in str(e.value) and "nothing was changed" in str(e.value)
    assert _snapshot(tmp_path) == before


def test_an_interrupted_export_is_recognised_and_finished(run, exported, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    shutil.copytree(exported, out)
    (out / "important.txt").write_text("keep me")
    stale = out / "discriminator" / "vocab.txt"  # listed: the previous export's
    stale.write_text("old")
    manifest = _manifest(out)
    manifest["files"].append("discriminator/vocab.txt")
    manifest["sha256"]["discriminator/vocab.txt"] = hashlib.sha256(b"old").hexdigest()
    (out / "export.json").write_text(json.dumps(manifest))
    replace, calls = os.replace, []

    def crash_on_the_fourth(src, dst):
        # The fourth file moved into OUT (files written whole inside the hidden working folder,
        # as jsonio writes them, are not counted).
        if previous.TMP_PREFIX not in os.fspath(dst):
            calls.append(dst)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_the_fourth)
    with pytest.raises(pretrained.PretrainedError, match="No space left on device"):
        hf_write.write_export(_as_pretrained(run), str(out))
    monkeypatch.undo()
    # Half replaced: no export.json, but the hidden list of both exports' files.
    assert not (out / "export.json").exists()
    assert (out / ".export.json.partial").exists()
    assert "discriminator/vocab.txt" in previous.check_out(str(out))
    # A crash while writing also leaves the hidden working folder; the next export removes it.
    (out / ".electra_jax-export-crashed").mkdir()
    hf_write.write_export(_as_pretrained(run), str(out))
    assert sorted(os.listdir(out)) == ["discriminator", "export.json", "generator", "important.txt"]
    assert not stale.exists()
    assert (out / "important.txt").read_text() == "keep me"
    assert pretrained.load_pretrained(str(out)).spec == run["spec"]


def test_an_empty_out_or_one_holding_only_an_interrupted_export_is_written(run, tmp_path):
    empty = tmp_path / "empty"
    (empty / ".electra_jax-export-crashed" / "discriminator").mkdir(parents=True)
    hf_write.write_export(_as_pretrained(run), str(empty))
    assert sorted(os.listdir(empty)) == ["discriminator", "export.json", "generator"]
    nested = tmp_path / "a" / "b"
    hf_write.write_export(_as_pretrained(run), str(nested))
    assert sorted(os.listdir(nested)) == ["discriminator", "export.json", "generator"]


def test_cli_refuses_a_foreign_export_json_before_jax(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "export.json").write_text('{"format": "someone.else"}')
    (out / "important.txt").write_text("keep me")
    code_and_imports, stderr = heavy_imports_at_exit(
        "electra_jax.export", "--workdir=runs/x", f"--out={out}"
    )
    assert code_and_imports == "2 []", stderr[-2000:]  # hf/previous.py: no jax, no flax
    assert stderr.strip().splitlines() == [
        f"error: --out {out}: its export.json was not written by electra_jax (a JSON format "
        "'someone.else'); choose another --out (nothing was changed)"
    ], stderr
    assert sorted(os.listdir(out)) == ["export.json", "important.txt"]


@pytest.mark.parametrize("previous", [True, False])
def test_a_full_disk_while_exporting_is_one_line_and_the_previous_export_stays(
    run, exported, tmp_path, previous
):
    """A file size limit stands in for a full disk: the weights (safetensors, which reports it
    as its own error type) cannot be written. One line says what stayed as it was."""
    import hashlib

    from tests.conftest import run_command

    out = tmp_path / "hf"
    if previous:
        shutil.copytree(exported, out)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}

    # config.json and the tokenizer files fit under the limit; the weights do not.
    result = run_command(
        "electra_jax.export", f"--workdir={run['path']}", f"--out={out}", file_size_limit=60_000
    )
    kept = "the previous export there is intact" if previous else "nothing was written there"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: cannot write the export to {out} (File too large); {kept}: raise the file size "
        "limit (ulimit -f) or use a filesystem without one, then export again"
    ]
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}
    assert after == before and (out.exists() == previous)


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _front_matter(readme: str) -> dict:
    yaml = pytest.importorskip("yaml")
    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n")[1])


def test_the_pretraining_export_has_a_model_card_from_the_workdirs_records(run, tmp_path):
    from electra_jax.objectives.core import num_mask_slots
    from electra_jax.pretraining import metrics

    workdir = tmp_path / "run"
    shutil.copytree(run["path"], workdir)
    # The checkpoint exported is step 6: rows and commands after it are another model's.
    _write_rows(
        workdir / "metrics.jsonl",
        [
            {"step": 3, "loss": 9.0, "eval/disc_auc": 0.61, "eval/disc_accuracy": 0.8},
            {"step": 6, "loss": 7.25, "disc_accuracy": 0.875, "gen_accuracy": 0.125},
            {"step": 9, "loss": 5.0, "eval/disc_auc": 0.97},
        ],
    )
    _write_rows(
        workdir / "commands.jsonl",
        [
            {"step": 0, "command": "python -m electra_jax.train --workdir=run --first"},
            {"step": 3, "command": "python -m electra_jax.train --workdir=run --second"},
            {"step": 9, "command": "python -m electra_jax.train --workdir=run --later"},
        ],
    )
    # The run's corpus and compilation cache as places of this machine.
    settings = json.loads((workdir / "config.json").read_text())
    source = f"text:{tmp_path}/corpus/**/*.txt"
    settings["data"]["source"], settings["compile"]["cache_dir"] = source, str(tmp_path / "c")
    settings.pop("export", None)  # a run older than export.license: no license stated
    (workdir / "config.json").write_text(json.dumps(settings))
    out = tmp_path / "hf"
    manifest = export.export(str(workdir), str(out), card_details=True)
    readme = (out / "README.md").read_text()
    assert "README.md" in manifest["files"]
    front = _front_matter(readme)
    assert front["library_name"] == "transformers" and "electra_jax" in front["tags"]
    assert "license" not in front  # never guessed
    assert "- license: none stated (export.license not set in the run's config)" in readme
    config = micro_config()
    flops = metrics.count_flops(
        run["spec"],
        config.train.batch_size,
        config.data.seq_length,
        num_mask_slots(config.data.seq_length, config.objective.mask_prob),
        config.objective.name,
    )["total"]
    for line in (
        "# run",
        f"- corpus (`data.source`): `{source}`",
        f"- steps: 6 of the {config.train.num_steps:,} planned",
        f"- training compute: {6 * flops:.3e} FLOPs",
        "- last logged (step 6): loss 7.25, disc_accuracy 0.875, gen_accuracy 0.125",
        "- held-out at step 3: disc_auc 0.61, disc_accuracy 0.8",
        "- command: `python -m electra_jax.train --workdir=run --first`",
        "- resumed 1 time(s), last at step 3: `python -m electra_jax.train --workdir=run --second`",
        'ElectraForPreTraining.from_pretrained("run", subfolder="discriminator")',
    ):
        assert line in readme, line
    assert "--later" not in readme and "0.97" not in readme
    # config.json as this version reads it: a key added since the run was stored (here
    # export.license) at the value the run had.
    assert json.loads(readme.split("```json\n")[1].split("```")[0]) == pretrained.read_run_config(
        str(workdir)
    )
    # By default (the card may go to a public repository): no path of this machine, no command
    # line; the corpus by its kind and last part, the rest of the card as it was. The license
    # the run states, in the metadata the Hub reads and in the text.
    settings["export"] = {"license": "apache-2.0"}
    (workdir / "config.json").write_text(json.dumps(settings))
    export.export(str(workdir), str(out))
    public = (out / "README.md").read_text()
    assert _front_matter(public)["license"] == "apache-2.0" and "- license: apache-2.0" in public
    assert str(tmp_path) not in public and "--first" not in public and "--workdir" not in public
    assert "- command lines: (not shown: export with --card_details)" in public
    assert "- corpus (`data.source`): `text:.../*.txt`" in public
    assert "- source: `run (checkpoint 6)`" in public
    for line in readme.splitlines():
        if line.startswith(("- held-out", "- steps", "- training compute", "- last logged")):
            assert line in public, line
    # A later held-out reading of that step (python -m electra_jax.evaluate) is the one shown.
    _write_rows(workdir / "eval.jsonl", [{"step": 6, "eval/disc_auc": 0.7}])
    (workdir / "commands.jsonl").unlink()
    export.export(str(workdir), str(out), card_details=True)
    readme = (out / "README.md").read_text()
    assert "- held-out at step 6: disc_auc 0.7" in readme
    assert "- command: not recorded" in readme


@pytest.mark.parametrize(
    "source, shown",
    [
        ("builtin", "builtin"),
        ("tfds:wikipedia/20230601.en:train", "tfds:wikipedia/20230601.en:train"),
        ("text:/home/me/wiki/**/*.txt", "text:.../*.txt"),
        ("parquet:gs://bucket/c4/*.parquet:content", "parquet:.../*.parquet:content"),
        ("jsonl:corpus.jsonl", "jsonl:corpus.jsonl"),
        ("text:hf://datasets/org/name/*.txt", "text:hf://datasets/org/name/*.txt"),
        (
            "wiki=text:/home/me/wiki/*.txt:0.7; builtin:0.3",
            "wiki=text:.../*.txt:0.7;builtin=builtin:0.3",
        ),
    ],
)
def test_a_card_names_the_corpus_without_its_folders(source, shown):
    assert card.public_corpus(source) == shown


class _FakeHub:
    """HfApi's calls that reach the network, recorded; the folder as the upload found it."""

    def __init__(self, monkeypatch, fail=None):
        from huggingface_hub import HfApi

        self.calls, self.uploaded, self.fail = [], {}, fail
        monkeypatch.setattr(HfApi, "create_repo", self.create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", self.upload_folder)

    # Bound to this recorder, set on the class: HfApi's own `self` is not passed.
    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        if self.fail:
            raise self.fail

    def upload_folder(self, **kwargs):
        import fnmatch

        self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        root = kwargs["folder_path"]
        for folder, _, names in os.walk(root):
            for name in names:
                rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if any(fnmatch.fnmatch(rel, p) for p in kwargs["allow_patterns"]):
                    with open(os.path.join(folder, name), "rb") as f:
                        self.uploaded[rel] = f.read()
        return None


def test_push_to_hub_uploads_the_export_and_nothing_else(run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    hub = _FakeHub(monkeypatch)
    out = tmp_path / "hf"
    export.export(run["path"], str(out))
    (out / "notes.txt").write_text("mine, not for the Hub")
    manifest = export.export(run["path"], str(out), push_to_hub="someone/electra-micro")
    assert [c[:2] for c in hub.calls] == [
        ("create_repo", "someone/electra-micro"),
        ("upload_folder", "someone/electra-micro"),
    ]
    assert hub.calls[0][2]["private"] is False and hub.calls[0][2]["exist_ok"] is True
    assert hub.calls[1][2]["folder_path"] == str(out)
    # What went up is the export as its export.json lists it, byte for byte; not notes.txt.
    assert sorted(hub.uploaded) == sorted([*manifest["files"], "export.json"])
    for rel, data in hub.uploaded.items():
        assert data == (out / rel).read_bytes()
    readme = hub.uploaded["README.md"].decode()
    assert "# someone/electra-micro" in readme
    assert 'from_pretrained("someone/electra-micro", subfolder="discriminator")' in readme
    assert manifest["hub_url"] == "https://huggingface.co/someone/electra-micro"


def test_push_to_hub_refuses_a_bad_name_or_no_login_before_the_export(run, tmp_path, monkeypatch):
    hub = _FakeHub(monkeypatch)
    out = tmp_path / "hf"
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    with pytest.raises(pretrained.PretrainedError, match="--push_to_hub=a/b/c: Repo id must be"):
        export.export(run["path"], str(out), push_to_hub="a/b/c")
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no stored token either
    with pytest.raises(pretrained.PretrainedError, match="needs a Hugging Face token: log in"):
        export.export(run["path"], str(out), push_to_hub="someone/electra-micro")
    assert not out.exists() and hub.calls == []


def test_a_failed_upload_keeps_the_export_and_says_so(run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    _FakeHub(monkeypatch, fail=OSError("Name or service not known"))
    out = tmp_path / "hf"
    with pytest.raises(pretrained.PretrainedError) as e:
        export.export(run["path"], str(out), push_to_hub="someone/electra-micro")
    assert str(e.value).startswith(f"the export is in {out}, but uploading it to someone/")
    assert "(Name or service not known)" in str(e.value) and "\n" not in str(e.value)
    assert sorted(os.listdir(out)) == [*EXPORT_TOP]
    # The line ends with the one command that uploads the folder as it is: what push sends
    # (the files export.json lists, and export.json), to the same repository.
    command = shlex.split(str(e.value).split("upload the folder as it is: ", 1)[1])
    assert command[:6] == [
        "hf",
        "upload",
        "someone/electra-micro",
        str(out),
        ".",
        "--repo-type=model",
    ]
    patterns = [a.split("=", 1)[1] for a in command[6:]]
    with open(out / "export.json") as f:
        listed = {*json.load(f)["files"], "export.json"}
    on_disk = {
        os.path.relpath(os.path.join(d, n), out) for d, _, names in os.walk(out) for n in names
    }
    matched = {f for f in on_disk if any(fnmatch.fnmatch(f, p) for p in patterns)}
    assert matched == listed


def test_cli_push_to_hub_with_a_bad_name_is_one_line(run, tmp_path):
    env = dict(subprocess_env(), HF_TOKEN="hf_not_a_real_token", HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "electra_jax.export",
            f"--workdir={run['path']}",
            f"--out={tmp_path / 'hf'}",
            "--push_to_hub=not a repo",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: --push_to_hub=not a repo: Repo id must use")
    assert out.stderr.count("\n") == 1 and not (tmp_path / "hf").exists()
