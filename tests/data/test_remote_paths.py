"""Remote paths (gs://...) through etils.epath, without a network.

A fake GCS (a minimal fsspec filesystem over a temporary directory, registered for the gs/gcs
protocols) stands in for gcsfs, so the code under test runs through the real etils.epath and
fsspec layers: listing, stat and streaming reads go the way they go against a bucket.
"""

import glob
import gzip
import importlib
import importlib.util
import os

import pytest
from etils.epath import backend as epath_backend
from etils.epath import gpath
from fsspec import AbstractFileSystem

from electra_jax import validate
from electra_jax.data import shards as prepare_lib
from electra_jax.data import sources
from electra_jax.data.tokenizer import Tokenizer, train_tokenizer
from electra_jax.errors import ConfigError, DataError
from electra_jax.run import workdir
from tests.conftest import ROOT, micro_config, run_command
from tests.data.test_shards import make_cfg, make_corpus
from tests.data.test_tokenizer import _small_corpus

_fsspec_registry = importlib.import_module("fsspec.registry")


class _SpyFile:
    """A file that records the size of every read, to prove reads are bounded chunks."""

    def __init__(self, f, sizes):
        self._f, self._sizes = f, sizes

    def read(self, size=-1):
        self._sizes.append(size)
        return self._f.read(size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


class FakeGCS(AbstractFileSystem):
    """gs://BUCKET/KEY is ROOT/BUCKET/KEY. Only the primitives an fsspec filesystem provides
    (ls, info, _open); walk, glob, exists and isdir are fsspec's generic ones, as in gcsfs, and
    names come back without the scheme ("bucket/key"), as from gcsfs."""

    protocol = ("gs", "gcs")
    cachable = False
    root = ""
    read_sizes: list = []
    listed: list = []

    def _local(self, path):
        return os.path.join(self.root, self._strip_protocol(path))

    def info(self, path, **kwargs):
        name = self._strip_protocol(path)
        st = os.stat(self._local(name))  # FileNotFoundError as gcsfs raises it
        kind = "directory" if os.path.isdir(self._local(name)) else "file"
        return {"name": name, "type": kind, "size": st.st_size, "mtime": st.st_mtime}

    def ls(self, path, detail=True, **kwargs):
        name = self._strip_protocol(path)
        FakeGCS.listed.append(name)
        if not os.path.isdir(self._local(name)):
            entries = [self.info(name)]
        else:
            entries = [self.info(f"{name}/{n}") for n in sorted(os.listdir(self._local(name)))]
        return entries if detail else [e["name"] for e in entries]

    def _open(self, path, mode="rb", **kwargs):
        return _SpyFile(open(self._local(path), mode), FakeGCS.read_sizes)  # noqa: SIM115


def _use_fsspec_backend(monkeypatch):
    # epath prefers TensorFlow's gfile for gs:// when tensorflow is installed; the fake is fsspec.
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """The local directory behind gs://bucket (empty); cleans epath's filesystem cache after."""
    monkeypatch.setattr(FakeGCS, "root", str(tmp_path / "gcs"))
    monkeypatch.setattr(FakeGCS, "read_sizes", [])
    monkeypatch.setattr(FakeGCS, "listed", [])
    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(_fsspec_registry._registry, protocol, FakeGCS)
    _use_fsspec_backend(monkeypatch)
    (tmp_path / "gcs" / "bucket").mkdir(parents=True)
    yield tmp_path / "gcs" / "bucket"
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture
def no_gcsfs(monkeypatch):
    """gs:// as on a machine without gcsfs (and without tensorflow)."""
    monkeypatch.delitem(_fsspec_registry._registry, "gcs", raising=False)
    monkeypatch.setitem(
        _fsspec_registry.known_implementations,
        "gcs",
        {"class": "electra_jax_test_no_such_module.GCSFileSystem", "err": "Please install gcsfs"},
    )
    _use_fsspec_backend(monkeypatch)
    yield
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def _write_tree(root):
    """Nested text, gzip, Latin-1, hidden and non-matching files under root/wiki."""
    wiki = root / "wiki"
    (wiki / "sub" / "deep").mkdir(parents=True)
    (wiki / "sib").mkdir()
    (wiki / ".hid").mkdir()
    (wiki / "a.txt").write_text("a one\na two\n\na three\n")
    (wiki / "b.txt").write_text("b one\n")
    (wiki / ".dot.txt").write_text("hidden file\n")
    (wiki / "notes.md").write_text("not text\n")
    (wiki / "sub" / "c.txt").write_bytes("café\n\nnaïve\n".encode("latin-1"))  # 2 bad bytes
    (wiki / "sub" / "deep" / "d.txt").write_text("d one\nd two\n")
    with gzip.open(wiki / "sub" / "e.txt.gz", "wt") as f:
        f.write("gz one\ngz two\n\ngz three\n")
    (wiki / "sib" / "f.txt").write_text("f one\n")
    (wiki / ".hid" / "g.txt").write_text("in a hidden dir\n")
    return wiki


def _read(pattern):
    stats = sources.SourceStats()
    return list(sources.iter_documents(f"text:{pattern}", stats)), stats


def test_remote_glob_yields_the_documents_of_the_same_files_read_locally(bucket):
    _write_tree(bucket)
    remote_docs, remote_stats = _read("gs://bucket/wiki/**/*.txt*")
    local_docs, local_stats = _read(f"{bucket}/wiki/**/*.txt*")
    assert remote_docs == local_docs
    assert ["gz one", "gz two"] in remote_docs and ["caf\ufffd"] in remote_docs
    assert remote_stats.files == local_stats.files == 6
    assert remote_stats.bytes_replaced == local_stats.bytes_replaced == 2
    assert remote_stats.skipped == [] and remote_stats.empty_files == 0


@pytest.mark.parametrize(
    "pattern",
    [
        "**/*.txt",
        "*.txt",
        "**",
        "*/*.txt",
        "sub/**/*",
        "**/d*.txt",
        "**/sub/*.gz",
        "s?b/*.txt",
        "[ab].txt",
        ".*",
        ".hid/*.txt",
        "**/.hid/*",
        "a.txt",
        "sub",  # a directory, not a file: matches nothing
        "nothing*.txt",
    ],
)
def test_remote_glob_matches_what_glob_glob_matches(bucket, pattern):
    wiki = _write_tree(bucket)
    local = sorted(
        os.path.relpath(p, wiki)
        for p in glob.glob(f"{wiki}/{pattern}", recursive=True)
        if os.path.isfile(p)
    )
    if not local:
        with pytest.raises(DataError, match="matches no files"):
            sources._matched_files("text", f"gs://bucket/wiki/{pattern}")
        return
    remote = sources._matched_files("text", f"gs://bucket/wiki/{pattern}")
    prefix = "gs://bucket/wiki/"
    assert all(p.startswith(prefix) for p in remote)
    assert [p[len(prefix) :] for p in remote] == local


def test_remote_glob_lists_only_directories_a_match_can_be_under(bucket):
    # Each listing is a round trip to the bucket: sib/, deep/ and .hid/ cannot hold a match.
    _write_tree(bucket)
    assert sources._matched_files("text", "gs://bucket/wiki/sub/*.txt") == [
        "gs://bucket/wiki/sub/c.txt"
    ]
    assert sorted(FakeGCS.listed) == ["bucket/wiki/sub"]
    FakeGCS.listed.clear()
    sources._matched_files("text", "gs://bucket/wiki/s*/*.txt")
    assert sorted(FakeGCS.listed) == ["bucket/wiki", "bucket/wiki/sib", "bucket/wiki/sub"]


def test_remote_files_are_streamed_in_chunks(bucket, monkeypatch):
    block = "The chef cooked a meal for the family.\n" * 2000  # ~78 KB
    (bucket / "big.txt").write_text(block * 4)
    with gzip.open(bucket / "big.txt.gz", "wt") as f:
        f.write(block * 4)
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 16 << 10)
    docs, stats = _read("gs://bucket/big.*")
    assert stats.files == 2 and sum(len(d) for d in docs) == 2 * 4 * 2000
    sizes = FakeGCS.read_sizes
    assert sizes and all(s is not None and s > 0 for s in sizes), sizes  # never read(-1)
    assert max(sizes) < len(block), max(sizes)  # gzip's own buffer is 128 KB at most


def test_remote_fingerprint_follows_size_and_mtime(bucket):
    wiki = _write_tree(bucket)
    source = "text:gs://bucket/wiki/**/*.txt"
    first = sources.source_fingerprint(source)
    assert sources.source_fingerprint(source) == first
    assert first != sources.source_fingerprint(f"text:{wiki}/**/*.txt")  # URIs, not local paths
    stat = os.stat(wiki / "b.txt")
    os.utime(wiki / "b.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))  # same size
    second = sources.source_fingerprint(source)
    assert second != first
    (wiki / "b.txt").write_text("b one, longer now\n")
    third = sources.source_fingerprint(source)
    assert third not in (first, second)
    (wiki / "sib" / "new.txt").write_text("x\n")
    assert sources.source_fingerprint(source) not in (first, second, third)


def test_prepare_from_a_remote_source_writes_the_local_bytes(bucket, tmp_path):
    local_source = make_corpus(str(bucket / "corpus"), num_topics=12)
    tok = train_tokenizer(_small_corpus(), str(tmp_path / "tok"), 300, 0.9995, 0, 100_000)
    local = prepare_lib.prepare(make_cfg(local_source), tok, str(tmp_path / "a"), seed=0)
    remote = prepare_lib.prepare(
        make_cfg("text:gs://bucket/corpus/*.txt"), tok, str(tmp_path / "b"), seed=0
    )
    assert remote.manifest["files_read"] == local.manifest["files_read"] == 3
    assert remote.num_examples == local.num_examples > 0
    for a, b in zip(local.shard_paths, remote.shard_paths, strict=True):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
    again = prepare_lib.prepare(
        make_cfg("text:gs://bucket/corpus/*.txt"), tok, str(tmp_path / "b"), seed=0
    )
    assert again.directory == remote.directory  # the same content key: reused


def test_remote_tokenizer_file_or_dir(bucket, tmp_path):
    tok = train_tokenizer(_small_corpus(), str(bucket / "tok"), 300, 0.9995, 0, 100_000)
    for path in ("gs://bucket/tok", "gs://bucket/tok/spm.model"):
        loaded = Tokenizer.load(path)
        assert loaded.fingerprint == tok.fingerprint
        assert loaded.model_path == "gs://bucket/tok/spm.model"
    # data.tokenizer on a bucket is copied into the (local) workdir, as a local one is.
    cfg = make_cfg("text:unused", tokenizer="gs://bucket/tok")
    copied = prepare_lib.ensure_tokenizer(cfg, str(tmp_path / "run" / "tokenizer"), seed=0)
    assert copied.fingerprint == tok.fingerprint
    assert sorted(os.listdir(tmp_path / "run" / "tokenizer")) == ["spm.model", "spm.vocab"]
    with pytest.raises(DataError, match=r"tokenizer gs://bucket/nope\.model cannot be read"):
        Tokenizer.load("gs://bucket/nope.model")


def test_missing_backend_is_one_line_naming_path_and_package(no_gcsfs):
    source = "text:gs://bucket/wiki/**/*.txt"
    for call in (sources.iter_documents, sources.source_fingerprint):
        with pytest.raises(DataError) as e:
            call(source)
        message = str(e.value)
        assert source in message and "pip install gcsfs" in message and "\n" not in message
    with pytest.raises(DataError, match=r"data\.tokenizer: reading gs://b/spm\.model .*gcsfs"):
        Tokenizer.load("gs://b/spm.model")


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("gcsfs", "tensorflow")),
    reason="a gs:// backend is installed here",
)
def test_prepare_cli_without_backend_exits_with_one_line(tmp_path):
    out = run_command(
        "electra_jax.prepare",
        f"--config={ROOT / 'configs' / 'tiny.py'}",
        f"--workdir={tmp_path / 'run'}",
        "--config.data.source=text:gs://bucket/wiki/**/*.txt",
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "gs://bucket/wiki/**/*.txt" in errors[0], out.stderr
    assert "pip install gcsfs" in errors[0]


def test_unreadable_schemes_and_bucket_wildcards_are_one_line():
    with pytest.raises(DataError, match=r"scheme http://, which cannot be read.*gs://"):
        sources.iter_documents("text:http://example.com/*.txt")
    with pytest.raises(DataError, match="bucket name cannot hold wildcards"):
        sources.iter_documents("text:gs://bucket-*/x.txt")


def test_workdirs_and_caches_on_stores_other_than_gcs_are_refused_before_any_write(
    tmp_path, monkeypatch
):
    # gs:// is written directly (tests/test_gcs_workdir.py); another store has no generation
    # preconditions for the lock, so it is refused, and nothing local is made for it.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        workdir.check_workdir("s3://bkt/runs/small")
    message = str(e.value)
    assert message.startswith("--workdir s3://bkt/runs/small is a s3:// URI, which electra_jax")
    assert "give gs://BUCKET/PATH" in message
    assert os.listdir(tmp_path) == []  # os.makedirs would have made ./s3:/bkt/runs/small
    for key, section, field in (
        ("data.cache_dir", "data", "cache_dir"),
        ("train.init_from", "train", "init_from"),
    ):
        config = micro_config()
        config[section][field] = "s3://bkt/x"
        with pytest.raises(ConfigError, match=rf"^{key}=s3://bkt/x is a s3:// URI"):
            validate.check_config(config)
        config[section][field] = "gs://bkt/x"
        validate.check_config(config)
    # The prepare entry point (which runs no config checks) refuses them too.
    with pytest.raises(DataError, match=r"data\.cache_dir s3://bkt/c is a s3:// URI"):
        prepare_lib.prepare(make_cfg("text:x"), None, "s3://bkt/c", seed=0)
    with pytest.raises(DataError, match=r"tokenizer directory .* s3://bkt/run/tokenizer"):
        prepare_lib.ensure_tokenizer(make_cfg("text:x"), "s3://bkt/run/tokenizer", seed=0)


def test_parquet_and_jsonl_sources_read_from_a_bucket(bucket):
    # The same path layer as text: listed, keyed and read through epath; parquet through the
    # remote file object (pyarrow seeks to the footer), never read whole.
    from tests.data.test_sources import ROWS, _write_jsonl, _write_parquet

    (bucket / "c4").mkdir()
    _write_parquet(bucket / "c4" / "a.parquet", ROWS)
    _write_jsonl(bucket / "c4" / "a.jsonl.gz", ROWS, opener=gzip.open)
    _write_jsonl(bucket / "c4" / "b.jsonl", ROWS[::-1])
    for kind, pattern in (("parquet", "*.parquet"), ("jsonl", "*.jsonl*")):
        remote, local = f"{kind}:gs://bucket/c4/{pattern}", f"{kind}:{bucket}/c4/{pattern}"
        docs = list(sources.iter_documents(remote))
        assert docs and docs == list(sources.iter_documents(local))
        assert sources.source_fingerprint(remote) == sources.source_fingerprint(remote)
        assert sources.source_fingerprint(remote) != sources.source_fingerprint(local)
        assert sources.parse(remote).files() is None  # sizes cost a round trip each
    with pytest.raises(DataError, match="a.parquet has no column 'body'"):
        list(sources.iter_documents("parquet:gs://bucket/c4/*.parquet:body"))
    sizes = FakeGCS.read_sizes
    assert sizes and all(s is not None and s > 0 for s in sizes), sizes  # never read(-1)
