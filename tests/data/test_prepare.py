"""Tests of electra_jax.data.prepare: tokenizer setup, cached shards, atomicity."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pydoc_data.topics import topics

import ml_collections
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from electra_jax.data import DataError
from electra_jax.data import prepare as prepare_lib
from electra_jax.data.tokenizer import Tokenizer

SEQ = 64


def make_corpus(directory, num_topics=30):
    """Writes ~150 KB of English (pydoc topics) into 3 text files; returns a text: source."""
    names = sorted(topics)[:num_topics]
    os.makedirs(directory, exist_ok=True)
    for i in range(3):
        with open(os.path.join(directory, f"part{i}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(topics[n] for n in names[i::3]))
    return f"text:{directory}/*.txt"


def make_cfg(source, **overrides):
    cfg = {
        "source": source,
        "seq_length": SEQ,
        "vocab_size": 300,
        "cache_dir": "",
        "tokenizer": "",
        "tokenizer_sample_sentences": 300_000,
        "character_coverage": 0.9995,
        "single_segment_prob": 0.1,
        "short_seq_prob": 0.05,
        "examples_per_shard": 400,
    }
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    tok_dir = tmp_path_factory.mktemp("run") / "tokenizer"
    return prepare_lib.ensure_tokenizer(make_cfg(corpus), str(tok_dir), seed=0)


@pytest.fixture(scope="module")
def prepared(corpus, tokenizer, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return prepare_lib.prepare(make_cfg(corpus), tokenizer, str(cache), seed=0)


def _read_rows(paths):
    rows = []
    for path in paths:
        reader = ArrayRecordReader(path)
        rows += [np.frombuffer(r, dtype="<i4").reshape(2, SEQ) for r in reader.read_all()]
        reader.close()
    return rows


def _shard_bytes(prep):
    out = []
    for path in prep.shard_paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


# ---- ensure_tokenizer ----------------------------------------------------------------------


def test_ensure_tokenizer_trains_into_dir(tokenizer):
    assert tokenizer.vocab_size == 300
    assert os.path.basename(tokenizer.model_path) == "spm.model"
    assert os.path.basename(os.path.dirname(tokenizer.model_path)) == "tokenizer"


def test_ensure_tokenizer_reuses_dir_without_training(corpus, tokenizer, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(prepare_lib.tokenizer_lib, "train_tokenizer", no_training)
    tok_dir = os.path.dirname(tokenizer.model_path)
    again = prepare_lib.ensure_tokenizer(make_cfg(corpus), tok_dir, seed=0)
    assert again.fingerprint == tokenizer.fingerprint


def test_ensure_tokenizer_copies_given_model(corpus, tokenizer, tmp_path):
    for given in (tokenizer.model_path, os.path.dirname(tokenizer.model_path)):
        run_dir = tmp_path / os.path.basename(given)
        cfg = make_cfg(corpus, tokenizer=given)
        tok = prepare_lib.ensure_tokenizer(cfg, str(run_dir / "tokenizer"), seed=0)
        assert tok.fingerprint == tokenizer.fingerprint
        assert tok.model_path == str(run_dir / "tokenizer" / "spm.model")
        assert sorted(os.listdir(run_dir / "tokenizer")) == ["spm.model", "spm.vocab"]
        assert sorted(os.listdir(run_dir)) == ["tokenizer"]  # No temp dir left behind.


def test_ensure_tokenizer_errors(corpus, tokenizer, tmp_path):
    missing = str(tmp_path / "nope.model")
    with pytest.raises(DataError, match="nope.model"):
        prepare_lib.ensure_tokenizer(make_cfg(corpus, tokenizer=missing), str(tmp_path / "t"), 0)
    with pytest.raises(DataError, match=r"data\.vocab_size=512.*300"):
        prepare_lib.ensure_tokenizer(
            make_cfg(corpus, vocab_size=512), os.path.dirname(tokenizer.model_path), 0
        )
    # A workdir whose tokenizer differs from the configured one.
    other = prepare_lib.ensure_tokenizer(
        make_cfg(corpus, vocab_size=301), str(tmp_path / "other"), seed=0
    )
    with pytest.raises(DataError, match="differs from data.tokenizer"):
        prepare_lib.ensure_tokenizer(
            make_cfg(corpus, tokenizer=other.model_path), os.path.dirname(tokenizer.model_path), 0
        )


# ---- prepare --------------------------------------------------------------------------------


def test_prepared_shards_and_manifest(prepared, tokenizer):
    m = prepared.manifest
    assert prepared.seq_length == SEQ
    assert prepared.num_examples == m["examples"] > 400  # More than one shard.
    assert len(prepared.shard_paths) == len(m["shards"]) == len(m["shard_examples"]) > 1
    assert m["shard_examples"][:-1] == [400] * (len(m["shards"]) - 1)
    assert set(os.listdir(prepared.directory)) == set(m["shards"]) | {"manifest.json"}
    assert os.path.basename(prepared.directory) == m["key"][:16]
    assert m["tokenizer_fingerprint"] == tokenizer.fingerprint
    rows = _read_rows(prepared.shard_paths)
    assert len(rows) == prepared.num_examples
    tokens = sum(int(np.count_nonzero(r[0])) for r in rows)
    assert m["tokens"] == tokens
    assert m["real_token_fraction"] == pytest.approx(tokens / (len(rows) * SEQ))
    single = sum(not r[1].any() for r in rows) / len(rows)
    assert m["single_segment_fraction"] == pytest.approx(single)
    assert 0.05 < m["forced_single_segment_fraction"] < 0.15
    assert 0.0 < m["short_fraction"] < 0.15
    assert all(r[0, 0] == tokenizer.cls_id for r in rows)
    # Rows hold the corpus in order: the first row starts with the first file's first words.
    first_text = tokenizer.decode(rows[0][0])
    with open(os.path.join(os.path.dirname(m["source"][5:]), "part0.txt")) as f:
        assert f.read().split()[0] in first_text


def test_same_seed_same_bytes_other_seed_other_bytes(corpus, tokenizer, prepared, tmp_path):
    again = prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path / "a"), seed=0)
    assert again.directory != prepared.directory
    assert _shard_bytes(again) == _shard_bytes(prepared)
    other = prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path / "b"), seed=1)
    assert os.path.basename(other.directory) != os.path.basename(prepared.directory)
    assert _shard_bytes(other) != _shard_bytes(prepared)


def test_reuse_does_not_retokenize(corpus, tokenizer, prepared, monkeypatch):
    mtimes = {p: os.stat(p).st_mtime_ns for p in prepared.shard_paths}

    def fail(*args, **kwargs):
        raise AssertionError("re-tokenized")

    monkeypatch.setattr(Tokenizer, "encode_batch", fail)
    cache = os.path.dirname(prepared.directory)
    again = prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, seed=0)
    assert again.directory == prepared.directory
    assert again.manifest == prepared.manifest
    assert {p: os.stat(p).st_mtime_ns for p in again.shard_paths} == mtimes
    # Any change to what the rows depend on is a new directory (and would tokenize).
    with pytest.raises(AssertionError, match="re-tokenized"):
        prepare_lib.prepare(make_cfg(corpus, seq_length=32), tokenizer, cache, seed=0)


def test_key_ignores_shard_size_but_not_packing(corpus, tokenizer):
    base = prepare_lib.content_key(make_cfg(corpus), tokenizer, 0)
    assert base == prepare_lib.content_key(make_cfg(corpus, examples_per_shard=7), tokenizer, 0)
    assert base != prepare_lib.content_key(make_cfg(corpus, short_seq_prob=0.1), tokenizer, 0)
    assert base != prepare_lib.content_key(make_cfg(corpus, single_segment_prob=0.2), tokenizer, 0)


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_are_ignored_or_cleaned(corpus, tokenizer, tmp_path):
    cfg = make_cfg(corpus)
    key16 = prepare_lib.content_key(cfg, tokenizer, 0)[:16]
    cache = tmp_path / "cache"
    # A killed run on this host (dead pid) and a run on another host, both with a manifest that
    # must not be taken for complete data.
    here = cache / f".{key16}.tmp-{socket.gethostname()}-{_dead_pid()}-abc"
    elsewhere = cache / f".{key16}.tmp-otherhost-1-xyz"
    alive = cache / f".{key16}.tmp-{socket.gethostname()}-{os.getppid()}-def"
    for d in (here, elsewhere, alive):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"examples": 1, "shards": []}))
    prep = prepare_lib.prepare(cfg, tokenizer, str(cache), seed=0)
    assert prep.directory == str(cache / key16)
    assert prep.num_examples > 400
    assert not here.exists()  # Ours and dead: cleaned.
    assert elsewhere.exists()  # Maybe alive on another host: left alone.
    assert alive.exists()  # A live prepare on this host: left alone.
    assert sorted(os.listdir(cache)) == sorted([key16, elsewhere.name, alive.name])


def test_failed_prepare_leaves_nothing(corpus, tokenizer, tmp_path, monkeypatch):
    real = prepare_lib.iter_packed

    def dies_midway(*args, **kwargs):
        for i, example in enumerate(real(*args, **kwargs)):
            if i == 450:  # After the first shard is complete.
                raise KeyboardInterrupt
            yield example

    monkeypatch.setattr(prepare_lib, "iter_packed", dies_midway)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(cache), seed=0)
    assert os.listdir(cache) == []
    monkeypatch.setattr(prepare_lib, "iter_packed", real)
    assert prepare_lib.prepare(make_cfg(corpus), tokenizer, str(cache), seed=0).num_examples > 400


def test_incomplete_target_dir_is_rebuilt(corpus, tokenizer, prepared, tmp_path):
    cfg = make_cfg(corpus)
    target = tmp_path / "cache" / prepare_lib.content_key(cfg, tokenizer, 0)[:16]
    target.mkdir(parents=True)
    (target / "shard-00000.array_record").write_bytes(b"half")  # No manifest: not complete.
    prep = prepare_lib.prepare(cfg, tokenizer, str(tmp_path / "cache"), seed=0)
    assert prep.directory == str(target)
    assert _shard_bytes(prep) == _shard_bytes(prepared)


def test_missing_shard_of_complete_dir_raises(corpus, tokenizer, tmp_path):
    prep = prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0)
    os.remove(prep.shard_paths[-1])
    with pytest.raises(DataError, match=f"delete {prep.directory}"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0)


def test_zero_examples_raises(tokenizer, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n   \n")
    source = f"text:{tmp_path}/*.txt"
    with pytest.raises(DataError, match=r"empty\.txt|\*\.txt"):
        prepare_lib.prepare(make_cfg(source), tokenizer, str(tmp_path / "cache"), seed=0)
    assert os.listdir(tmp_path / "cache") == []


def test_empty_cache_dir_raises(corpus, tokenizer):
    with pytest.raises(DataError, match="cache_dir"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, "", seed=0)


# ---- parallel tokenization, source statistics, minimum size ---------------------------------


def test_two_workers_write_the_same_shards(corpus, tokenizer, prepared, tmp_path, monkeypatch):
    # Small chunks, so that several are in flight on both workers at once.
    monkeypatch.setattr(prepare_lib, "_ENCODE_CHUNK_SENTENCES", 300)
    two = prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0, num_workers=2)
    assert os.path.basename(two.directory) == os.path.basename(prepared.directory)
    assert _shard_bytes(two) == _shard_bytes(prepared)
    assert two.manifest["tokens"] == prepared.manifest["tokens"]


def test_manifest_counts_replaced_bytes_and_skipped_files(corpus, tokenizer, tmp_path):
    src = os.path.dirname(corpus[len("text:") :])
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in sorted(os.listdir(src)):
        shutil.copy(os.path.join(src, name), docs / name)
    (docs / "latin1.txt").write_bytes("Ã  la carte, déjà vu, naïve.\n".encode("latin-1"))
    (docs / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" * 50)
    prep = prepare_lib.prepare(make_cfg(f"text:{docs}/*.txt"), tokenizer, str(tmp_path / "c"), 0)
    m = prep.manifest
    assert m["bytes_replaced"] == 4
    assert m["files_skipped"] == [f"{docs / 'image.txt'}: binary"]
    assert m["files_read"] == 4


def test_fewer_examples_than_a_batch_raises(corpus, tokenizer, prepared, tmp_path):
    n = prepared.num_examples
    with pytest.raises(DataError, match=rf"gave {n} examples.*train\.batch_size={n + 1}"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), 0, min_examples=n + 1)
    assert os.listdir(tmp_path) == []
    # A cached copy is checked as well.
    cache = os.path.dirname(prepared.directory)
    with pytest.raises(DataError, match="fewer than one batch"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, 0, min_examples=n + 1)
    assert prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, 0, min_examples=n).num_examples
