"""Tests of electra_jax.data.sources: the builtin corpus and text globs."""

import ast
import glob
import gzip
import hashlib
import json
import logging
import os
import pathlib
import subprocess
import sys
import sysconfig
import tracemalloc

import pytest

from electra_jax.data import DataError, sources


@pytest.fixture(scope="module")
def builtin_docs():
    return list(sources.iter_documents("builtin"))


def _digest(docs):
    h = hashlib.sha256()
    for doc in docs:
        for sentence in doc:
            h.update(sentence.encode("utf-8") + b"\n")
        h.update(b"\x00")
    return h.hexdigest()


def test_builtin_is_large_and_well_formed(builtin_docs):
    assert all(isinstance(doc, list) and doc for doc in builtin_docs)
    assert all(isinstance(s, str) and s and s == s.strip() for doc in builtin_docs for s in doc)
    total = sum(len(s.encode("utf-8")) + 1 for doc in builtin_docs for s in doc)
    assert total > 1_000_000
    assert len(builtin_docs) > 500  # ~180 topics and ~600 modules, one document each


def test_builtin_has_topics_and_docstrings(builtin_docs):
    text = "\n".join(s for doc in builtin_docs for s in doc)
    # From pydoc_data's reference manual topics.
    assert 'The "while" statement is used for repeated execution' in text
    # From the docstring of a stdlib module (json/__init__.py).
    assert "JSON (JavaScript Object Notation)" in text


_NESTED = '''"""Module."""
import sys
if sys.version_info > (3,):
    def in_if():
        """In an if."""
        class InDef:
            """A class in a def."""
else:
    pass
try:
    def in_try():
        """In a try."""
except ImportError:
    def in_except():
        """In an except clause."""
finally:
    async def in_finally():
        """In a finally."""
with open(__file__) as f:
    for line in f:
        while True:
            class Deep:
                """Deep in statements."""
                def method(self):
                    """A method."""
                    return lambda: None
match sys.platform:
    case "linux":
        def in_case():
            """In a match case."""
x = [lambda: 1 for _ in range(3)]
'''


def _walked(tree):
    owners = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return [n for n in ast.walk(tree) if isinstance(n, owners)]


def test_docstring_owners_are_found_in_ast_walks_order():
    # Entering statements only must find every def and class ast.walk finds, in its order: the
    # corpus (and every hash and shard made from it) depends on that order.
    tree = ast.parse(_NESTED)
    found = list(sources._docstring_owners(tree))
    assert found == _walked(tree) and len(found) == 9
    stdlib = sysconfig.get_paths()["stdlib"]
    # And on every fourth module the builtin corpus reads (all of them take seconds).
    for path in list(sources._stdlib_python_files(stdlib))[::4]:
        try:
            tree = ast.parse(pathlib.Path(path).read_bytes())
        except (SyntaxError, ValueError):
            continue
        assert list(sources._docstring_owners(tree)) == _walked(tree), path


def test_builtin_is_deterministic_and_imports_nothing(builtin_docs):
    # A fresh interpreter (another hash seed, nothing cached) must give the same corpus, and
    # reading it must not import the modules it parses (importing runs their code).
    code = (
        "import hashlib, sys\n"
        "from electra_jax.data import sources\n"
        "before = set(sys.modules)\n"
        "h = hashlib.sha256()\n"
        "for doc in sources.iter_documents('builtin'):\n"
        "    for s in doc:\n"
        "        h.update(s.encode('utf-8') + b'\\n')\n"
        "    h.update(b'\\x00')\n"
        "new = set(sys.modules) - before\n"
        "assert not {'turtle', 'tkinter', 'antigravity', 'this', 'smtplib'} & new, new\n"
        "print(h.hexdigest())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _digest(builtin_docs)


def test_text_glob_documents(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("b one\n\n\n  b two  \nb three\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("a one\na two\n\na three", encoding="utf-8")
    (tmp_path / "sub" / "c.txt").write_bytes(b"c \xff one\n")
    (tmp_path / "skip.md").write_text("not matched\n")
    docs = list(sources.iter_documents(f"text:{tmp_path}/**/*.txt"))
    # Sorted paths (a, b, sub/c); blank lines and file ends end documents; bad UTF-8 replaced.
    assert docs == [
        ["a one", "a two"],
        ["a three"],
        ["b one"],
        ["b two", "b three"],
        ["c \ufffd one"],
    ]


def test_text_glob_matching_nothing_raises(tmp_path):
    with pytest.raises(DataError, match=r"nothing\*\.txt"):
        sources.iter_documents(f"text:{tmp_path}/nothing*.txt")
    with pytest.raises(DataError, match="matches no files"):
        sources.source_fingerprint(f"text:{tmp_path}/nothing*.txt")


def test_unknown_sources_raise():
    with pytest.raises(DataError, match="not a known source"):
        sources.iter_documents("bogus")
    with pytest.raises(DataError, match="not a known source"):
        sources.iter_documents("text:")
    with pytest.raises(DataError, match="not a known source"):
        sources.iter_documents("tfds:")


def test_fingerprints(tmp_path):
    assert sources.source_fingerprint("builtin") == sources.source_fingerprint("builtin")
    path = tmp_path / "a.txt"
    path.write_text("one\n")
    glob = f"text:{tmp_path}/*.txt"
    first = sources.source_fingerprint(glob)
    assert first == sources.source_fingerprint(glob)
    assert first != sources.source_fingerprint("builtin")
    path.write_text("one two\n")  # New size: new content key.
    second = sources.source_fingerprint(glob)
    assert second != first
    (tmp_path / "b.txt").write_text("x\n")  # A new file: new content key.
    assert sources.source_fingerprint(glob) not in (first, second)


def test_stdlib_walk_is_sorted_and_skips_tests(tmp_path):
    # Directory listings come in file-system order; the walk must sort so every machine agrees.
    names = [f"m{i:02d}" for i in range(25)]
    for i in (7, 3, 19, 0, 24, 11, 5, 16, 2, 21, 9, 14, 1, 23, 6, 18, 12, 4, 20, 8, 15, 10, 22):
        (tmp_path / names[i]).mkdir()
        (tmp_path / names[i] / "mod.py").write_text('"""Doc."""\n')
        (tmp_path / f"{names[i]}.py").write_text('"""Doc."""\n')
    for skipped in ("test", "idlelib", "site-packages"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x.py").write_text('"""Skipped."""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    paths = list(sources._stdlib_python_files(str(tmp_path)))
    rel = [os.path.relpath(p, tmp_path) for p in paths]
    assert all(r.startswith("m") or r == "broken.py" for r in rel)
    assert len(rel) == 2 * 23 + 1
    # Files of a directory first (sorted), then its subdirectories (sorted), recursively.
    top = [r for r in rel if os.sep not in r]
    sub = [r for r in rel if os.sep in r]
    assert rel == top + sub and top == sorted(top) and sub == sorted(sub)
    docs = [d for p in paths for d in sources._docstring_documents(p)]
    assert docs == [["Doc."]] * 46  # The file that does not parse is skipped.


# ---- text files at scale: encodings, gzip, binary, unreadable, huge lines -------------------


def _read(pattern, **options):
    stats = sources.SourceStats()
    opts = sources.SourceOptions(**options)
    return list(sources.iter_documents(f"text:{pattern}", stats, opts)), stats


def test_invalid_utf8_is_replaced_and_counted(tmp_path, monkeypatch):
    # Latin-1: each accented letter is one invalid byte in UTF-8.
    (tmp_path / "latin1.txt").write_bytes("café naïve\nsecond line\n".encode("latin-1"))
    # Valid UTF-8 whose multi-byte characters straddle the tiny read chunks: nothing replaced.
    (tmp_path / "utf8.txt").write_bytes("ééé ñ 日本語\n".encode())
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 3)
    docs, stats = _read(f"{tmp_path}/*.txt")
    assert docs == [["caf\ufffd na\ufffdve", "second line"], ["ééé ñ 日本語"]]
    assert stats.bytes_replaced == 2
    assert stats.files == 2 and stats.skipped == [] and stats.empty_files == 0


def test_gzip_is_read_transparently(tmp_path):
    text = "one\ntwo\n\nthree " + "x" * 100 + "\n"
    (tmp_path / "plain.txt").write_text(text)
    with gzip.open(tmp_path / "packed.txt.gz", "wt") as f:
        f.write(text)
    plain, _ = _read(f"{tmp_path}/plain.txt")
    packed, stats = _read(f"{tmp_path}/packed.txt.gz")
    assert packed == plain == [["one", "two"], ["three " + "x" * 100]]
    assert stats.files == 1


def test_binary_file_is_skipped_with_a_warning(tmp_path, caplog):
    (tmp_path / "a.txt").write_text("real text\n")
    (tmp_path / "blob.txt").write_bytes(bytes(range(256)) * 40)  # NUL bytes
    (tmp_path / "noise.txt").write_bytes(bytes(range(128, 256)) * 64)  # no NUL, no valid UTF-8
    with caplog.at_level(logging.WARNING, logger="electra_jax.data"):
        docs, stats = _read(f"{tmp_path}/*.txt")
    assert docs == [["real text"]]
    assert [s.split(": ")[0] for s in stats.skipped] == [
        str(tmp_path / "blob.txt"),
        str(tmp_path / "noise.txt"),
    ]
    assert str(tmp_path / "blob.txt") in caplog.text and "binary" in caplog.text
    caplog.clear()
    (tmp_path / "wide.txt").write_text("wide text\n" * 50, encoding="utf-16")
    with caplog.at_level(logging.WARNING, logger="electra_jax.data"):
        _read(f"{tmp_path}/[aw]*.txt")
    with pytest.raises(DataError, match=r"wide\.txt: UTF-16 text, not UTF-8"):
        _read(f"{tmp_path}/wide.txt")
    assert f"skipping {tmp_path / 'wide.txt'}: UTF-16 text (its byte-order mark), not UTF-8" in (
        caplog.text
    )


def test_nothing_usable_raises_naming_the_files(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "empty" / "b.txt").write_text("\n  \n\n")
    with pytest.raises(DataError, match=r"all 2 matched files are empty.*a\.txt"):
        _read(f"{tmp_path}/empty/*.txt")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.bin").write_bytes(b"\x00\x01" * 100)
    with pytest.raises(DataError, match=r"all 1 matched files were skipped .*x\.bin: binary"):
        _read(f"{tmp_path}/bin/*")


def test_unreadable_file_is_skipped_or_fatal(tmp_path, monkeypatch, caplog):
    # chmod cannot deny root, so the denial is simulated at the open call.
    (tmp_path / "a.txt").write_text("fine\n")
    (tmp_path / "locked.txt").write_text("secret\n")
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sources, "open", deny, raising=False)
    with caplog.at_level(logging.WARNING, logger="electra_jax.data"):
        docs, stats = _read(f"{tmp_path}/*.txt")
    assert docs == [["fine"]]
    assert stats.skipped == [f"{tmp_path / 'locked.txt'}: Permission denied"]
    assert "locked.txt" in caplog.text
    with pytest.raises(DataError, match=r"locked\.txt: Permission denied"):
        _read(f"{tmp_path}/locked.txt")


def test_file_without_newline_is_cut_into_bounded_pieces(tmp_path, monkeypatch):
    words = [f"w{i % 997}" for i in range(60_000)]
    (tmp_path / "one_line.txt").write_text(" ".join(words))  # ~300 KB, no newline
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 16 << 10)
    docs, _ = _read(f"{tmp_path}/*.txt", max_line_chars=1000, max_document_chars=50_000)
    pieces = [s for doc in docs for s in doc]
    assert all(len(p) <= 1000 for p in pieces) and len(pieces) > 250
    assert all(sum(map(len, doc)) < 50_000 + 1000 for doc in docs) and len(docs) > 5
    # Cut at spaces: every word survives whole and in order.
    assert " ".join(pieces).split() == words


def test_file_without_newline_streams_in_bounded_memory(tmp_path, monkeypatch):
    size = 8 << 20
    with open(tmp_path / "big.txt", "wb") as f:
        block = b"abcdefg " * (1 << 17)  # 1 MB
        for _ in range(size // len(block)):
            f.write(block)
    monkeypatch.setattr(sources, "READ_CHUNK_BYTES", 256 << 10)
    opts = sources.SourceOptions(max_document_chars=256 << 10)
    n = 0
    tracemalloc.start()
    try:
        for doc in sources.iter_documents(f"text:{tmp_path}/big.txt", options=opts):
            n += sum(map(len, doc))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size * 0.99 < n < size  # all text but the spaces stripped at the cut points
    assert peak < 3 << 20, peak  # a few chunks, never the 8 MB file


def test_long_lines_are_cut_after_sentence_ends_when_there_are_some():
    sentence = "The chef cooked a meal for the family. "
    line = sentence * 60  # ~2,300 characters, one paragraph on one line
    pieces = sources.cut_line(line, 500)
    assert all(len(p) <= 500 for p in pieces) and len(pieces) >= 5
    # Every piece but the last ends a sentence and the next one starts one.
    assert all(p.rstrip().endswith("family.") for p in pieces[:-1])
    assert all(p.startswith("The chef") for p in pieces)
    assert "".join(pieces) == line
    # Without sentence ends, words still stay whole.
    words = " ".join(f"w{i}" for i in range(400))
    assert " ".join(sources.cut_line(words, 100)).split() == words.split()


# ---- links in local globs -------------------------------------------------------------------


def test_text_glob_follows_links_but_not_loops(tmp_path):
    # corpus/sub/up and corpus/sub/top point back up the tree: glob.glob's ** follows both,
    # forever (each nests inside the other). Links to files and to a directory outside are read.
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    (tmp_path / "outside" / "o.txt").write_text("omega\n")
    (tmp_path / "far.txt").write_text("far\n")
    os.symlink("..", root / "sub" / "up")
    os.symlink(os.path.join("..", ".."), root / "sub" / "top")
    os.symlink(os.path.join("..", "outside"), root / "out")
    os.symlink(os.path.join("sub", "b.txt"), root / "c.txt")  # The same file as sub/b.txt.
    os.symlink(os.path.join("..", "far.txt"), root / "far.txt")
    code = (
        "import json, sys\n"
        "from electra_jax.data import sources\n"
        "source = 'text:' + sys.argv[1]\n"
        "docs = list(sources.iter_documents(source))\n"
        "print(json.dumps([sources._text_files(sys.argv[1]), docs,\n"
        "                  sources.source_fingerprint(source)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, f"{root}/**/*.txt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    paths, docs, fingerprint = json.loads(out.stdout)
    # Each real file once, under its own path where it has one (sub/b.txt, not c.txt).
    assert paths == [str(root / n) for n in ("a.txt", "far.txt", "out/o.txt", "sub/b.txt")]
    assert docs == [["alpha"], ["far"], ["omega"], ["beta"]]
    assert len(fingerprint) == 64


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
    assert sources._local_glob(full) == expected


def test_a_source_is_parsed_once_into_what_prepare_asks(tmp_path):
    (tmp_path / "a.txt").write_text("One sentence here. Another one.\n\nA second document.\n")
    source = sources.parse(f"text:{tmp_path}/*.txt")
    assert (source.kind, source.arg) == ("text", f"{tmp_path}/*.txt")
    assert source.name == f"text:{tmp_path}/*.txt"
    assert sources.parse(source) is source  # a Source is taken as it is
    # The value answers as the source string's entry points do.
    assert source.fingerprint() == sources.source_fingerprint(source.name)
    assert source.input_bytes() == (tmp_path / "a.txt").stat().st_size
    assert list(source.documents()) == list(sources.iter_documents(source.name))
    builtin = sources.parse("builtin")
    assert builtin.input_bytes() is None and builtin.options == sources.SourceOptions()
    with pytest.raises(DataError, match="data.source 'text' is not a known source"):
        sources.parse("text")
