"""Tests of electra_jax.store.paths: which paths are remote (one scheme parser, case-insensitive),
an epath for one, one line for a missing filesystem or an unwritable store, and the functions that
hold the choice between a local and a remote code path (locally here; in a bucket against the
GCS server of tests/gcs_emulator.py)."""

import glob
import os
import pathlib

import pytest

import electra_jax
from electra_jax.errors import DataError
from electra_jax.store import paths


def test_a_scheme_makes_a_path_remote_in_either_case():
    assert paths.scheme("gs://bucket/corpus/*.txt") == "gs"
    assert paths.scheme("s3+x://b/k") == "s3+x"
    # RFC 3986 section 3.1: a scheme is case-insensitive; the lower-case form is canonical.
    assert paths.scheme("GS://bucket/x") == "gs" and paths.scheme("S3+X://b/k") == "s3+x"
    for local in ("corpus/*.txt", "/abs/path", "C:/data", "./gs:/x", "", "1gs://x"):
        assert paths.scheme(local) is None, local
        assert not paths.is_remote(local)


def test_a_uri_is_handed_on_with_its_scheme_in_lower_case():
    epath = pytest.importorskip("etils.epath")
    assert paths.normal("GS://Bucket/Dir/X.txt") == "gs://Bucket/Dir/X.txt"
    assert paths.normal("runs/GS://x") == "runs/GS://x"
    assert paths.absolute("Gs://b/run/") == "gs://b/run"
    # etils knows only the lower-case prefix (GS:// is a KeyError there).
    path = paths.remote_path("GS://bucket/x.txt", "data.source")
    assert isinstance(path, epath.Path) and os.fspath(path) == "gs://bucket/x.txt"


def test_an_unknown_scheme_is_one_line_in_the_callers_error():
    with pytest.raises(DataError) as e:
        paths.remote_path("http://example.com/x.txt", "data.tokenizer", DataError)
    message = str(e.value)
    assert message.startswith("data.tokenizer: http://example.com/x.txt has scheme http://")
    assert "gs://, s3://" in message and "\n" not in message
    with (
        pytest.raises(ValueError, match="has scheme ftp://"),
        paths.remote_errors("FTP://h/x", "x"),
    ):
        pass


def test_a_missing_filesystem_package_is_named_with_its_install_command():
    s3 = r"data.source: reading s3://b/x needs s3fs, .* install s3fs"
    with (
        pytest.raises(DataError, match=s3),
        paths.remote_errors("s3://b/x", "data.source", DataError),
    ):
        raise ImportError("No module named 's3fs'")
    gs = r"needs gcsfs \(or tensorflow\)"
    with pytest.raises(DataError, match=gs), paths.remote_errors("GS://b/x", "x", DataError):
        raise ImportError("No module named 'gcsfs'")
    with paths.remote_errors("gs://b/x", "data.source", DataError):
        pass  # nothing raised: nothing said
    # A local path's ImportError is not a filesystem package's: it is left as it is.
    with pytest.raises(ImportError), paths.remote_errors("local/x", "data.source", DataError):
        raise ImportError("No module named 'zstandard'")


def test_only_gs_is_written_directly():
    assert paths.unwritable("runs/x") == "" and paths.unwritable("gs://b/x") == ""
    assert paths.unwritable("GS://b/x") == ""
    assert paths.unwritable("gs:///x") == "names no bucket; use gs://BUCKET/PATH"
    why = paths.unwritable("S3://b/x")
    assert why.startswith("is a s3:// URI, which electra_jax does not write directly; give gs://")
    assert "does not read or write directly" in paths.unwritable("az://c/x", read=True)


def test_local_size_is_known_for_a_local_file_only(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"12345")
    assert paths.local_size(str(tmp_path / "a.txt")) == 5
    assert paths.local_size(str(tmp_path / "missing.txt")) == 0
    assert paths.local_size("gs://b/a.txt") is None
    assert paths.total_size([str(tmp_path / "a.txt")] * 2) == 10
    assert paths.total_size([str(tmp_path / "a.txt"), "gs://b/a.txt"]) is None


def test_write_via_replaces_a_local_file_atomically(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")

    def fail(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError):
        paths.write_via(str(target), fail)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.safetensors"]
    paths.write_via(str(target), lambda tmp: pathlib.Path(tmp).write_bytes(b"new"))
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["model.safetensors"]
    with paths.local_copy(str(target)) as local:
        assert local == str(target)


def _save(files):
    def write(tmp):
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)

    return write


def test_replace_files_makes_or_refills_a_local_folder(tmp_path):
    folder = tmp_path / "tokenizer"
    paths.replace_files(str(folder), _save({"spm.vocab": b"v1", "spm.model": b"m1"}), "spm.model")
    assert sorted(os.listdir(folder)) == ["spm.model", "spm.vocab"]
    (folder / "notes.txt").write_bytes(b"kept")
    paths.replace_files(str(folder), _save({"spm.vocab": b"v2", "spm.model": b"m2"}), "spm.model")
    assert (folder / "spm.model").read_bytes() == b"m2" and (folder / "notes.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["tokenizer"]  # no temporary folder left


def test_a_local_folder_stands_for_itself(tmp_path):
    staged = paths.LocalFolder(str(tmp_path), prefix="t-")
    assert staged.path == str(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    staged.upload("a.txt")
    staged.close()
    assert os.listdir(tmp_path) == ["a.txt"]  # nothing copied, nothing removed


def test_in_a_bucket_each_function_reads_and_writes_the_objects(gcs, tmp_path):
    staged = paths.LocalFolder(f"{gcs}/run", prefix="t-")
    assert not staged.path.startswith("gs://") and os.path.isdir(staged.path)
    os.makedirs(os.path.join(staged.path, "tensorboard"))
    for name in ("metrics.jsonl", "tensorboard/events.1", "unsent.txt"):
        with open(os.path.join(staged.path, name), "w") as f:
            f.write(name)
    staged.upload("metrics.jsonl", "tensorboard")
    assert paths.read_text(f"{gcs}/run/tensorboard/events.1") == "tensorboard/events.1"
    assert sorted(paths.listdir(f"{gcs}/run")) == ["metrics.jsonl", "tensorboard"]
    staged.close()
    assert not os.path.exists(staged.path)

    weights = f"{gcs.upper()[:5]}{gcs[5:]}/run/model.safetensors"  # GS://... as a user may type
    paths.write_via(weights, lambda tmp: pathlib.Path(tmp).write_bytes(b"w" * 10))
    with paths.local_copy(weights) as local:
        assert not local.startswith("gs://")
        with open(local, "rb") as f:
            assert f.read() == b"w" * 10
    assert not os.path.exists(local)

    folder = f"{gcs}/run/tokenizer"
    paths.replace_files(folder, _save({"spm.vocab": b"v", "spm.model": b"m"}), "spm.model")
    assert sorted(paths.listdir(folder)) == ["spm.model", "spm.vocab"]
    assert paths.read_bytes(f"{folder}/spm.model") == b"m"
    upper = f"GS://{gcs[5:]}/run/**/spm.*"  # found in the bucket, named as etils names them
    assert paths.glob(upper, "data.source") == ([f"{folder}/spm.model", f"{folder}/spm.vocab"], [])
    keys = paths.file_keys([f"{folder}/spm.model"], "data.source")
    assert keys[0][:2] == [f"{folder}/spm.model", 1]


@pytest.mark.parametrize(
    "pattern",
    [
        "*.txt",
        "**/*.txt",
        "**",
        "*/*.txt",
        "**/.h*",
        ".hd/*",
        "*d/**/x*",
        "[ab]*",
        "x?.txt",
        "**/*d/*.md",
        "nothing/**/*.txt",
        "a.txt",
        "*d/",
    ],
)
def test_local_glob_matches_like_glob_without_links(tmp_path, pattern):
    for rel in (
        "a.txt",
        "b.md",
        ".h.txt",
        "x1.txt",
        "ad/x2.txt",
        "ad/.h3",
        "ad/bd/x4.md",
        ".hd/a.txt",
        ".hd/xd/a.txt",
        "bd/b.txt",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("t\n")
    full = os.path.join(str(tmp_path), pattern)
    expected = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
    assert paths.glob(full, "data.source") == (expected, [])


def test_only_five_choices_between_local_and_remote_are_left_outside_the_path_layer():
    """Everything else asks paths.py's functions, which hold the choice (docs/development.md
    names the five: the lock's kind, prepared data built locally and uploaded, an export's local
    OUT, W&B's own folder, a remote glob's unknown sizes)."""
    package = pathlib.Path(electra_jax.__file__).parent
    asked = []
    for module in sorted(package.rglob("*.py")):
        if module == pathlib.Path(paths.__file__):
            continue
        for line in module.read_text(encoding="utf-8").splitlines():
            if "is_remote(" in line or ".scheme(" in line or '"://" in' in line:
                asked.append(str(module.relative_to(package)))
    assert asked == [
        "data/shards.py",
        "data/sources.py",
        "export.py",
        "pretraining/wandb_mirror.py",
        "run/workdir.py",
    ]
