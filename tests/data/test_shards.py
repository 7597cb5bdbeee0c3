"""Tests of electra_jax.data.shards: tokenizer setup, cached shards, atomicity."""

import errno
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

from electra_jax.data import mixture, sources
from electra_jax.data import shards as prepare_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.tokenizer import Tokenizer
from electra_jax.errors import DataError
from tests.conftest import ROOT, SHARED, run_command

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


def test_two_workers_write_the_same_shards(
    corpus, tokenizer, prepared, tmp_path, monkeypatch, capsys
):
    # Small chunks, so that several are in flight on both workers at once.
    monkeypatch.setattr(prepare_lib, "_ENCODE_CHUNK_SENTENCES", 300)
    # The count train chooses (num_workers=None), on a host of 2 cores and a corpus worth one
    # worker per byte: both cores.
    monkeypatch.setattr(prepare_lib, "_BYTES_PER_WORKER", 1)
    monkeypatch.setattr(prepare_lib.os, "cpu_count", lambda: 2)
    two = prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0, num_workers=None)
    assert "on 2 worker processes" in capsys.readouterr().err
    assert os.path.basename(two.directory) == os.path.basename(prepared.directory)
    assert _shard_bytes(two) == _shard_bytes(prepared)
    assert two.manifest["tokens"] == prepared.manifest["tokens"]


def test_auto_num_workers_follows_input_size_and_cores(corpus, monkeypatch):
    size = sources.input_bytes(corpus)
    assert size == sum(
        os.path.getsize(p) for p in sources._matched_files(corpus, corpus[len("text:") :])
    )
    assert prepare_lib.auto_num_workers(corpus, cpus=8) == 1  # ~150 KB: one process
    monkeypatch.setattr(prepare_lib, "_BYTES_PER_WORKER", size // 3)
    assert prepare_lib.auto_num_workers(corpus, cpus=8) == 3
    assert prepare_lib.auto_num_workers(corpus, cpus=2) == 2  # no more than the cores
    assert prepare_lib.auto_num_workers("builtin", cpus=8) == 1
    assert prepare_lib.auto_num_workers("tfds:wikipedia", cpus=8) == 8  # size unknown: large
    with pytest.raises(DataError, match="matches no files"):
        prepare_lib.auto_num_workers(f"{corpus}.none", cpus=8)


def test_progress_lines_go_to_stderr(corpus, tmp_path, monkeypatch, capsys):
    from electra_jax.data import progress

    monkeypatch.setattr(progress, "INTERVAL_SECONDS", 0.0)  # every chance to print, taken
    tok = prepare_lib.ensure_tokenizer(make_cfg(corpus), str(tmp_path / "tokenizer"), seed=0)
    prepare_lib.prepare(make_cfg(corpus), tok, str(tmp_path / "cache"), seed=0)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    sampling = [ln for ln in lines if ln.startswith("tokenizer: sampling sentences: ")]
    assert sampling and "of 3 files" in sampling[-1] and "% of 1" in sampling[-1]
    assert any(ln.startswith("tokenizer: training SentencePiece (300 pieces) on ") for ln in lines)
    assert any(ln.startswith("tokenizer: trained in ") for ln in lines)
    packing = [ln for ln in lines if ln.startswith("packing: ")]
    assert len(packing) > 2, err[-2000:]
    for line in packing[:-1]:
        assert "tokens/s), " in line and " examples written, " in line and ", eta " in line
    assert (
        packing[-1].startswith("packing: done in ")
        and "on one process: 3 of 3 files" in packing[-1]
    )
    # A second prepare finds the data made: nothing to say.
    prepare_lib.prepare(make_cfg(corpus), tok, str(tmp_path / "cache"), seed=0)
    assert capsys.readouterr().err == ""


def test_progress_lines_are_throttled():
    from electra_jax.data import progress

    now = [0.0]
    report = progress.Progress("phase", interval=5.0, clock=lambda: now[0])
    printed = []
    for t in range(0, 31):
        now[0] = float(t)
        printed += [t] if report.maybe(lambda: "x") else []
    assert printed == [5, 10, 15, 20, 25, 30]
    assert progress.share_and_eta(0, 100, 3.0) == ""
    assert progress.share_and_eta(250, 1000, 10.0) == ", 25% of 1.0 KB read, eta 30s"
    # Half done by another measure (a cap on what is read): the ETA follows the larger share.
    assert progress.share_and_eta(250, 1000, 10.0, at_least=0.5) == ", 25% of 1.0 KB read, eta 10s"
    assert progress.share_and_eta(5, None, 3.0) == ""
    assert [progress.duration(s) for s in (4.4, 65, 7260)] == ["4s", "1m05s", "2h01m"]


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


# ---- damaged prepared data, damaged tokenizer, full or read-only disks -----------------------


def _cached_copy(prepared, cache):
    """A copy of a prepared directory under the cache dir ``cache``; returns its path."""
    directory = os.path.join(cache, os.path.basename(prepared.directory))
    shutil.copytree(prepared.directory, directory)
    return directory


def _edit_manifest(directory, change):
    path = os.path.join(directory, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    with open(path, "wb") as f:
        f.write(change(manifest))


def _with(**fields):
    return lambda m: json.dumps({**m, **fields}).encode()


def _without(field):
    return lambda m: json.dumps({k: v for k, v in m.items() if k != field}).encode()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: b'{"shards": [', "is damaged: not JSON"),
        (lambda m: b"\xff\xfe\x00", "is damaged: not JSON"),
        (lambda m: b"", "is damaged: not JSON"),
        (lambda m: b"[1, 2]", "is damaged: not a JSON object"),
        (_without("shards"), "'shards' is not a list"),
        (_with(shards="shard-00000.array_record"), "'shards' is not a list"),
        (_with(shards=["../outside.array_record"]), "not a file name inside"),
        (_with(shards=["/etc/passwd"]), "not a file name inside"),
        (_with(shards=["../../../etc/passwd"]), "not a file name inside"),
        (_with(shards=["sub/shard-00000.array_record"]), "not a file name inside"),
        (_with(shards=[".."]), "not a file name inside"),
        (_with(shards=[7]), "not a file name inside"),
        (_without("examples"), "'examples' is not a positive integer"),
        (_with(examples="1004"), "'examples' is not a positive integer"),
        (_with(examples=True), "'examples' is not a positive integer"),
        (_with(seq_length=0), "'seq_length' is not a positive integer"),
        (_without("shard_examples"), "'shard_examples' is not a list"),
        (_with(shard_examples=[400]), "'shard_examples' is not a list"),
        (lambda m: _with(examples=m["examples"] + 1)(m), "'shard_examples' add up to"),
    ],
)
def test_damaged_manifest_names_it_and_the_directory_to_delete(
    corpus, tokenizer, prepared, tmp_path, change, problem
):
    cache = str(tmp_path / "cache")
    directory = _cached_copy(prepared, cache)
    # A valid shard beside the prepared directory: a manifest must not reach it with "../".
    shutil.copy(prepared.shard_paths[0], os.path.join(cache, "outside.array_record"))
    _edit_manifest(directory, change)
    with pytest.raises(DataError) as info:
        prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, seed=0)
    message = str(info.value)
    assert problem in message
    assert os.path.join(directory, "manifest.json") in message
    assert message.endswith(f"delete {directory} so that the next run prepares it again")
    assert "\n" not in message


@pytest.mark.parametrize(
    "damage",
    [
        lambda data, other: b"",
        lambda data, other: data[: len(data) // 2],
        lambda data, other: data[:-1],
        lambda data, other: bytes(len(data)),
        lambda data, other: other,  # Another shard's bytes: a whole file, other records.
    ],
    ids=["empty", "half", "last byte cut", "zeros", "another shard"],
)
def test_damaged_shard_fails_at_load_not_mid_training(
    corpus, tokenizer, prepared, tmp_path, damage
):
    directory = _cached_copy(prepared, str(tmp_path))
    shard = os.path.join(directory, os.path.basename(prepared.shard_paths[0]))
    with open(shard, "rb") as f:
        data = f.read()
    with open(prepared.shard_paths[-1], "rb") as f:
        last = f.read()  # Fewer records than the first.
    with open(shard, "wb") as f:
        f.write(damage(data, last))
    with pytest.raises(DataError) as info:
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0)
    message = str(info.value)
    assert f"prepared shard {shard} " in message and "\n" not in message
    assert message.endswith(f"delete {directory} so that the next run prepares it again")


def test_manifest_of_other_data_is_refused(corpus, tokenizer, prepared, tmp_path):
    directory = _cached_copy(prepared, str(tmp_path))
    _edit_manifest(directory, _with(key="0" * 64))
    with pytest.raises(DataError, match=f"its key or seq_length .*delete {directory}"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path), seed=0)


class _FullDiskWriter:
    """ArrayRecordWriter stand-in that fails like a full (or read-only) disk after n records."""

    def __init__(self, real, error, after):
        self._real, self._error, self._after = real, error, after

    def __call__(self, path, options):
        self._path = path
        self._writer = self._real(path, options)
        return self

    def write(self, record):
        self._after -= 1
        if self._after < 0:
            raise self._error(self._path)
        self._writer.write(record)

    def close(self):
        self._writer.close()


def _os_error(code):
    return lambda path: OSError(code, os.strerror(code), path)


def _array_record_error(code):
    # What ArrayRecord's writer raises: a RuntimeError holding the system's message.
    return lambda path: RuntimeError(f"write() failed: {os.strerror(code)}; writing {path}")


@pytest.mark.parametrize(
    ("error", "advice"),
    [
        (_os_error(errno.ENOSPC), "No space left on device); free space on the disk of"),
        (_array_record_error(errno.ENOSPC), "No space left on device); free space on the disk"),
        (_os_error(errno.EDQUOT), "quota exceeded); free space on the disk of"),
        (_os_error(errno.EACCES), "Permission denied); make"),
        (_array_record_error(errno.EACCES), "Permission denied); make"),
        (_os_error(errno.EROFS), "Read-only file system); make"),
    ],
)
def test_full_or_read_only_disk_raises_one_line_and_keeps_old_data(
    corpus, tokenizer, prepared, tmp_path, monkeypatch, error, advice
):
    cache = str(tmp_path / "cache")
    kept = _cached_copy(prepared, cache)  # Data prepared earlier (seed 0).
    before = {name: os.stat(os.path.join(kept, name)).st_mtime_ns for name in os.listdir(kept)}
    # Fails after the first shard is complete.
    writer = _FullDiskWriter(prepare_lib.ArrayRecordWriter, error, after=450)
    monkeypatch.setattr(prepare_lib, "ArrayRecordWriter", writer)
    with pytest.raises(DataError) as info:
        prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, seed=1)
    message = str(info.value)
    assert message.startswith(f"cannot write prepared data into {cache} (")
    assert advice in message and "data.cache_dir" in message and "\n" not in message
    assert os.listdir(cache) == [os.path.basename(kept)]  # The temp dir is gone.
    after = {name: os.stat(os.path.join(kept, name)).st_mtime_ns for name in os.listdir(kept)}
    assert after == before
    assert prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, seed=0).directory == kept


def test_full_disk_writing_the_manifest_raises_one_line(corpus, tokenizer, tmp_path, monkeypatch):
    real_open = open

    def failing_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("manifest.json") and "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(prepare_lib, "open", failing_open, raising=False)
    with pytest.raises(DataError, match=r"No space left on device\); free space"):
        prepare_lib.prepare(make_cfg(corpus, examples_per_shard=10**6), tokenizer, str(tmp_path), 0)
    assert os.listdir(tmp_path) == []


def _a_file(tmp):
    (tmp / "file").write_text("x")
    return tmp / "file"


def _under_a_file(tmp):
    return _a_file(tmp) / "cache"


@pytest.mark.parametrize(
    ("make", "problem"),
    [(_a_file, "is a file, not a directory"), (_under_a_file, "cannot be created (Not a")],
    ids=["a file", "under a file"],
)
def test_cache_dir_that_cannot_be_a_directory_raises_one_line(
    corpus, tokenizer, tmp_path, make, problem
):
    cache_dir = str(make(tmp_path))
    with pytest.raises(DataError) as info:
        prepare_lib.prepare(make_cfg(corpus), tokenizer, cache_dir, seed=0)
    message = str(info.value)
    assert message.startswith(f"data.cache_dir {cache_dir} {problem}")
    assert "set data.cache_dir" in message and "\n" not in message


def test_cache_dir_without_permission_raises_one_line(corpus, tokenizer, tmp_path, monkeypatch):
    # chmod cannot deny root, so the denial is simulated at the makedirs call.
    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(prepare_lib.os, "makedirs", denied)
    with pytest.raises(DataError, match=r"cannot be created \(Permission denied\); set data"):
        prepare_lib.prepare(make_cfg(corpus), tokenizer, str(tmp_path / "cache"), seed=0)


def test_read_only_cache_with_prepared_data_is_used(corpus, tokenizer, prepared, monkeypatch):
    # Complete data in a cache this process cannot write: used as it is, nothing written.
    def no_writes(*args, **kwargs):
        raise AssertionError("wrote into the cache")

    monkeypatch.setattr(prepare_lib.tempfile, "mkdtemp", no_writes)
    cache = os.path.dirname(prepared.directory)
    again = prepare_lib.prepare(make_cfg(corpus), tokenizer, cache, 0)
    assert again.directory == prepared.directory


@pytest.mark.parametrize("configured", [False, True], ids=["resumed", "data.tokenizer set"])
def test_damaged_workdir_tokenizer_is_not_blamed_on_data_tokenizer(
    corpus, tokenizer, tmp_path, configured
):
    tok_dir = tmp_path / "run" / "tokenizer"
    shutil.copytree(os.path.dirname(tokenizer.model_path), tok_dir)
    with open(tok_dir / "spm.model", "r+b") as f:
        f.truncate(os.path.getsize(tok_dir / "spm.model") // 2)
    cfg = make_cfg(corpus, tokenizer=tokenizer.model_path if configured else "")
    with pytest.raises(DataError) as info:
        prepare_lib.ensure_tokenizer(cfg, str(tok_dir), seed=0)
    message = str(info.value)
    assert message.startswith(f"the run's tokenizer {tok_dir / 'spm.model'} is damaged")
    assert "checkpoints depend on it: restore it from a copy" in message
    assert f"delete {tok_dir} so that the next run trains a new one" in message
    assert "data.tokenizer" not in message and "\n" not in message


def test_bad_data_tokenizer_still_names_data_tokenizer(corpus, tmp_path):
    bad = tmp_path / "given.model"
    bad.write_bytes(b"garbage" * 100)
    with pytest.raises(
        DataError, match=rf"tokenizer {bad} is not a SentencePiece .*data\.tokenizer"
    ):
        prepare_lib.ensure_tokenizer(make_cfg(corpus, tokenizer=str(bad)), str(tmp_path / "t"), 0)


# ---- tokens read and kept -------------------------------------------------------------------


def _count_read(source, tokenizer):
    """(tokens, longest sentence) the tokenizer gives the source, counted apart from prepare."""
    lengths = [
        len(ids) for doc in sources.iter_documents(source) for ids in tokenizer.encode_batch(doc)
    ]
    return sum(lengths), max(lengths)


def _count_kept(rows, tokenizer):
    ids = np.stack([r[0] for r in rows])
    specials = [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id]
    return int(np.count_nonzero(~np.isin(ids, specials)))


def test_manifest_counts_tokens_read_and_kept(corpus, tokenizer, prepared):
    read, longest = _count_read(corpus, tokenizer)
    assert longest > SEQ  # Lines longer than a row: their rest is carried, not dropped.
    m = prepared.manifest
    assert m["tokens_read"] == read
    assert m["tokens_kept"] == _count_kept(_read_rows(prepared.shard_paths), tokenizer) == read
    assert m["format"] == "electra_jax-prepared-v2"


def test_prepare_cli_prints_tokens_read_and_kept(corpus, tokenizer, tmp_path):
    out = run_command(
        "electra_jax.prepare",
        f"--config={ROOT / 'configs' / 'tiny.py'}",
        f"--workdir={tmp_path}",
        f"--config.data.source={corpus}",
        f"--config.data.tokenizer={tokenizer.model_path}",
        "--config.data.vocab_size=300",
        f"--config.data.seq_length={SEQ}",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    read, _ = _count_read(corpus, tokenizer)
    assert summary["tokens_read"] == summary["tokens_kept"] == read


INAUGURAL = SHARED / "data" / "corpus" / "nltk-inaugural"


@pytest.mark.skipif(not INAUGURAL.is_dir(), reason=f"{INAUGURAL} absent (the shared corpus)")
def test_inaugural_corpus_keeps_its_tokens(tmp_path):
    # A paragraph per line, most longer than a row of 64: the original packing kept about 40%.
    source = f"text:{INAUGURAL}/*.txt"
    cfg = make_cfg(source, vocab_size=2000)
    tok = prepare_lib.ensure_tokenizer(cfg, str(tmp_path / "tokenizer"), seed=0)
    prep = prepare_lib.prepare(cfg, tok, str(tmp_path / "cache"), seed=0)
    m = prep.manifest
    assert m["tokens_read"] == _count_read(source, tok)[0]
    assert m["tokens_kept"] == _count_kept(_read_rows(prep.shard_paths), tok)
    assert m["tokens_kept"] >= 0.8 * m["tokens_read"], m


def test_parquet_and_jsonl_corpora_prepare_as_text_does(tokenizer, tmp_path):
    from tests.data.test_sources import _write_jsonl, _write_parquet

    pytest.importorskip("pyarrow.parquet", reason="parquet sources need pyarrow ([parquet])")
    rows = [topics[n] for n in sorted(topics)[:12]]
    _write_parquet(tmp_path / "c.parquet", rows)
    _write_jsonl(tmp_path / "c.jsonl", rows)
    parquet, jsonl = f"parquet:{tmp_path}/*.parquet", f"jsonl:{tmp_path}/*.jsonl"
    a = prepare_lib.prepare(make_cfg(parquet), tokenizer, str(tmp_path / "a"), seed=0)
    b = prepare_lib.prepare(make_cfg(jsonl), tokenizer, str(tmp_path / "b"), seed=0)
    assert a.num_examples == b.num_examples > 0
    assert _shard_bytes(a) == _shard_bytes(b)  # the same rows, the same examples
    for prep, source in ((a, parquet), (b, jsonl)):
        assert prep.manifest["source"] == source and prep.manifest["files_read"] == 1
        assert prep.manifest["source_fingerprint"] == sources.source_fingerprint(source)
    again = prepare_lib.prepare(make_cfg(parquet), tokenizer, str(tmp_path / "a"), seed=0)
    assert again.directory == a.directory  # the same content key: reused
    _write_parquet(tmp_path / "c.parquet", rows[:6])
    other = prepare_lib.prepare(make_cfg(parquet), tokenizer, str(tmp_path / "a"), seed=0)
    assert other.directory != a.directory and other.num_examples < a.num_examples


def test_recorded_rows_are_found_without_the_corpus_and_only_when_proven(
    corpus, tokenizer, tmp_path
):
    """prepare.recorded: the prepared folder of a record's key fields (a run's data record),
    found with the corpus gone, and only when the record proves it to be those rows."""
    from electra_jax.data import sources

    folder = tmp_path / "corpus"
    shutil.copytree(corpus.removeprefix("text:").removesuffix("/*.txt"), folder)
    cfg = make_cfg(f"text:{folder}/*.txt")
    cache = str(tmp_path / "cache")
    made = prepare_lib.prepare(cfg, tokenizer, cache, seed=0)
    fields = prepare_lib.key_fields(cfg, tokenizer, 0)  # what the record holds
    os.rename(folder, tmp_path / "moved")
    with pytest.raises(sources.SourceAbsent, match="matches no files"):
        prepare_lib.key_fields(cfg, tokenizer, 0)
    found = prepare_lib.recorded(cfg, tokenizer, cache, 0, fields)
    assert found.directory == made.directory and found.shard_paths == made.shard_paths
    assert found.num_examples == made.num_examples
    # Not proven: other settings than the record's, a record of other rows, a folder of others.
    with pytest.raises(DataError, match="^the record's seed differs from this run's$"):
        prepare_lib.recorded(cfg, tokenizer, cache, 1, fields)
    other = {**fields, "source_fingerprint": "0" * 64}
    with pytest.raises(DataError, match="holds no complete prepared data"):
        prepare_lib.recorded(cfg, tokenizer, cache, 0, other)
    _edit_manifest(made.directory, _with(short_seq_prob=0.5))
    with pytest.raises(DataError, match="manifest.json records other rows than the record"):
        prepare_lib.recorded(cfg, tokenizer, cache, 0, fields)
    _edit_manifest(made.directory, _with(short_seq_prob=cfg.short_seq_prob, examples=1))
    with pytest.raises(DataError) as e:  # damaged: named, without "delete" (the corpus is gone)
        prepare_lib.recorded(cfg, tokenizer, cache, 0, fields)
    assert "is damaged" in str(e.value) and "delete" not in str(e.value)


# ---- data.mixture ---------------------------------------------------------------------------


def _two_sources(tmp_path):
    """Two text files of 2,000 one-line sentences each, told apart by their first word."""
    for word in ("alpha", "beta"):
        lines = [
            f"{word} sentence number {i}." + ("\n" if i % 10 == 9 else "") for i in range(2000)
        ]
        (tmp_path / f"{word}.txt").write_text("\n".join(lines) + "\n")
    return f"text:{tmp_path}/alpha.txt:0.7;text:{tmp_path}/beta.txt:0.3"


def test_a_mixtures_tokenizer_learns_from_a_sample_of_the_blend_by_weight(tmp_path, monkeypatch):
    cfg = make_cfg("builtin", mixture=_two_sources(tmp_path), tokenizer_sample_sentences=1000)
    mix = mixture.of_config(cfg)
    sample = prepare_lib.weighted_sample(cfg, mix, 1000, seed=0)
    assert len(sample) == 1000 and sum(s.startswith("alpha") for s in sample) == 700
    assert len(set(sample)) == 1000  # each part's own uniform draw, no sentence twice
    assert sample == prepare_lib.weighted_sample(cfg, mix, 1000, seed=0)
    assert sample != prepare_lib.weighted_sample(cfg, mix, 1000, seed=1)
    # ensure_tokenizer trains on exactly that sample (SentencePiece stopped before it starts).
    taken = {}

    def train(sentences, out_dir, **kwargs):
        taken.update(sentences=list(sentences), **kwargs)
        raise DataError("stopped")

    monkeypatch.setattr(tokenizer_lib, "train_tokenizer", train)
    with pytest.raises(DataError, match="stopped"):
        prepare_lib.ensure_tokenizer(cfg, str(tmp_path / "tokenizer"), seed=0)
    assert taken["sentences"] == sample and taken["sample_sentences"] == 1000


def test_a_mixtures_parts_are_prepared_apart_and_kept_when_the_weights_change(
    corpus, tokenizer, tmp_path
):
    """Each part's shards are those of its source alone (the same folder, reused); the blend's
    key names the mixture, and its record each part's key, which names that folder."""
    folder = corpus.removeprefix("text:").removesuffix("/*.txt")
    spec = f"text:{folder}/part0.txt:0.7;text:{folder}/part1.txt:0.3"
    cfg = make_cfg("builtin", mixture=spec)
    cache = str(tmp_path / "cache")
    blend = prepare_lib.prepare_mixture(cfg, tokenizer, cache, seed=0)
    assert blend.names == ("part0", "part1") and blend.proportions == (700000, 300000)
    alone = prepare_lib.prepare(make_cfg(f"text:{folder}/part1.txt"), tokenizer, cache, seed=0)
    assert alone.directory == blend.parts[1].directory
    assert sorted(os.listdir(cache)) == sorted(os.path.basename(p.directory) for p in blend.parts)
    reweighted = make_cfg("builtin", mixture=spec.replace("0.7", "0.5").replace("0.3", "0.5"))
    again = prepare_lib.prepare_mixture(reweighted, tokenizer, cache, seed=0)
    assert [p.directory for p in again.parts] == [p.directory for p in blend.parts]
    fields = prepare_lib.key_fields(cfg, tokenizer, 0)
    assert fields["mixture"] == spec and "source" not in fields
    assert (
        fields["mixture_fingerprint"]
        == prepare_lib.key_fields(reweighted, tokenizer, 0)["mixture_fingerprint"]
    )  # the content, not the weights (the spec says those)
    record = prepare_lib.mixture_record(cfg, tokenizer, 0)["mixture"]
    assert [(r["name"], r["weight"]) for r in record] == [("part0", 0.7), ("part1", 0.3)]
    for part, prepared in zip(record, blend.parts, strict=True):
        key = prepare_lib.content_key(make_cfg(part["source"]), tokenizer, 0)
        assert part["fields"] == prepare_lib.key_fields(make_cfg(part["source"]), tokenizer, 0)
        assert os.path.basename(prepared.directory) == key[:16]
    assert prepare_lib.mixture_record(make_cfg(corpus), tokenizer, 0) == {}
    gone = make_cfg("builtin", mixture=f"{spec};text:{folder}/nothing*.txt:1")
    with pytest.raises(DataError, match=r"^data.mixture part '\w+': data.source .* matches no"):
        prepare_lib.prepare_mixture(gone, tokenizer, cache, seed=0)
