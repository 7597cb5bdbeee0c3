"""Tests of electra_jax.data.sources: the builtin corpus and text globs."""

import ast
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

from electra_jax.data import sources
from electra_jax.errors import DataError
from electra_jax.store import paths


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


def test_builtin_is_parsed_once_per_process_and_each_read_gets_its_own_lists(
    builtin_docs, monkeypatch
):
    # Preparing a run reads its corpus twice (the tokenizer's sample, then the shards): the
    # second read, and every later run in the process, must not parse the standard library again.
    parsed = []
    monkeypatch.setattr(sources, "_docstring_documents", lambda p: parsed.append(p) or iter(()))
    again = list(sources.iter_documents("builtin"))
    assert not parsed and _digest(again) == _digest(builtin_docs)
    again[0].append("a sentence a caller added")  # a caller's edit is not the next caller's
    assert _digest(sources.iter_documents("builtin")) == _digest(builtin_docs)


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

    # Files are opened by the path layer (paths.open_file).
    monkeypatch.setattr(paths, "open", deny, raising=False)
    with caplog.at_level(logging.WARNING, logger="electra_jax.data"):
        docs, stats = _read(f"{tmp_path}/*.txt")
    assert docs == [["fine"]]
    assert stats.skipped == [f"{tmp_path / 'locked.txt'}: Permission denied"]
    assert "locked.txt" in caplog.text
    with pytest.raises(DataError, match=r"locked\.txt: Permission denied"):
        _read(f"{tmp_path}/locked.txt")


def test_a_store_that_does_not_answer_ends_the_read_rather_than_skipping_a_file(
    tmp_path, monkeypatch
):
    # A file a bucket did not answer for is no unreadable file: skipped, the corpus would lose
    # it without a word. The glob and the open get no answer here (deadline.NoAnswer, which
    # paths raises for a request past its deadline: tests/store/test_deadline.py).
    from electra_jax.store import deadline

    (tmp_path / "a.txt").write_text("fine\n")
    (tmp_path / "b.txt").write_text("also fine\n")
    real_open = sources._open_binary

    def no_answer(path, *args, **kwargs):
        if path.endswith("b.txt"):
            raise deadline.NoAnswer("gs://bucket/b.txt", 60)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sources, "_open_binary", no_answer)
    with pytest.raises(DataError, match=r"gs://bucket/b\.txt: no answer within 60s"):
        _read(f"{tmp_path}/*.txt")

    def silent_glob(pattern, what, error):
        raise deadline.NoAnswer("gs://bucket/corpus", 60)

    monkeypatch.setattr(paths, "glob", silent_glob)
    with pytest.raises(DataError, match=r"^data.source 'text:gs://bucket/corpus/\*.txt': gs://"):
        _read("gs://bucket/corpus/*.txt")


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
        "print(json.dumps([sources._matched_files(source, sys.argv[1]), docs,\n"
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


# ---- parquet and JSON lines -------------------------------------------------------------------

ROWS = [
    "First document. It has two sentences.\nAnd a second paragraph.",
    None,  # a null: no document
    "",  # no text: no document
    "Second document, one line.",
    "caf\u00e9 and na\u00efve.",
]


def _pq():
    return pytest.importorskip("pyarrow.parquet", reason="parquet sources need pyarrow ([parquet])")


def _write_parquet(path, rows, column="text", row_group_size=2, **columns):
    import pyarrow as pa

    table = pa.table({column: pa.array(rows, pa.string()), **columns})
    _pq().write_table(table, path, row_group_size=row_group_size)


def _write_jsonl(path, rows, field="text", opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"id": i, field: row}) + "\n")
            if i == 1:
                f.write("\n")  # a blank line: no document


def _expected(rows):
    return [d for r in rows if r for d in sources._example_documents(r, sources.SourceOptions())]


def test_parquet_and_jsonl_rows_are_documents(tmp_path):
    _write_parquet(tmp_path / "b.parquet", ROWS[:2])
    _write_parquet(tmp_path / "a.parquet", ROWS[2:])
    _write_jsonl(tmp_path / "b.jsonl", ROWS[:2])
    _write_jsonl(tmp_path / "a.jsonl.gz", ROWS[2:], opener=gzip.open)
    want = _expected(ROWS[2:]) + _expected(ROWS[:2])  # files in sorted order, rows in order
    assert want[0] == ["Second document, one line."]
    assert ["First document.", "It has two sentences.", "And a second paragraph."] in want
    for source, names in (
        (f"parquet:{tmp_path}/*.parquet", ("a.parquet", "b.parquet")),
        (f"jsonl:{tmp_path}/*.jsonl*", ("a.jsonl.gz", "b.jsonl")),
    ):
        stats = sources.SourceStats()
        assert list(sources.iter_documents(source, stats)) == want, source
        assert (stats.files, stats.files_total, stats.skipped) == (2, 2, [])
        size = sum((tmp_path / n).stat().st_size for n in names)
        assert stats.bytes_read() == stats.bytes_total == size  # as on disk: progress lines


def test_a_named_column_or_field_is_read(tmp_path):
    _write_parquet(tmp_path / "a.parquet", ROWS, column="content")
    _write_jsonl(tmp_path / "a.jsonl", ROWS, field="content")
    want = _expected(ROWS)
    assert list(sources.iter_documents(f"parquet:{tmp_path}/*.parquet:content")) == want
    assert list(sources.iter_documents(f"jsonl:{tmp_path}/*.jsonl:content")) == want
    # The part after the last ':' is the field only without a '/': a URI keeps its scheme.
    assert sources.parse("parquet:gs://b/c4/*.parquet").pattern == "gs://b/c4/*.parquet"
    assert sources.parse("parquet:gs://b/c4/*.parquet").field == "text"
    assert sources.parse("jsonl:gs://b/x:y/*.jsonl:body").pattern == "gs://b/x:y/*.jsonl"
    assert sources.parse("jsonl:gs://b/x:y/*.jsonl:body").field == "body"


def test_a_missing_column_or_field_is_named_in_one_line(tmp_path):
    _write_parquet(tmp_path / "a.parquet", ROWS, column="content", id=list(range(len(ROWS))))
    with (tmp_path / "a.jsonl").open("w") as f:
        f.write('{"text": "fine"}\n{"body": "elsewhere", "id": 2}\n')
    cases = {
        f"parquet:{tmp_path}/*.parquet": r"a\.parquet has no column 'text' \(it has content, id\);"
        r" name the text column: parquet:GLOB:COLUMN",
        f"parquet:{tmp_path}/*.parquet:id": r"column 'id' of .*a\.parquet holds int64, not text",
        f"jsonl:{tmp_path}/*.jsonl": r"a\.jsonl line 2 has no field 'text' \(it has body, id\);"
        r" name the text field: jsonl:GLOB:FIELD",
        f"jsonl:{tmp_path}/*.jsonl:body": r"a\.jsonl line 1 has no field 'body' \(it has text\)",
    }
    for source, message in cases.items():
        with pytest.raises(DataError, match=message) as e:
            list(sources.iter_documents(source))
        assert "\n" not in str(e.value) and str(e.value).startswith(f"data.source '{source}'")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"text": "cut', r"line 2 is not JSON \(.*\); each line must be one JSON object"),
        ('["text"]', "line 2 is a JSON list, not an object"),
        ('{"text": 3}', "line 2: field 'text' is a number, not text"),
    ],
)
def test_a_bad_json_line_is_named(tmp_path, line, message):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        list(sources.iter_documents(f"jsonl:{tmp_path}/a.jsonl"))


def test_jsonl_encodings(tmp_path):
    # A UTF-8 byte-order mark is read past; invalid UTF-8 is replaced and counted as in text.
    (tmp_path / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "caf\xe9 au lait."}\n')
    stats = sources.SourceStats()
    docs = list(sources.iter_documents(f"jsonl:{tmp_path}/a.jsonl", stats))
    assert docs == [["caf\ufffd au lait."]] and stats.bytes_replaced == 1
    (tmp_path / "b.jsonl").write_bytes('{"text": "x"}\n'.encode("utf-16"))
    with pytest.raises(DataError, match="b.jsonl line 1: the file is UTF-16 text"):
        list(sources.iter_documents(f"jsonl:{tmp_path}/b.jsonl"))


def test_a_file_that_is_not_parquet_is_skipped(tmp_path, caplog):
    _write_parquet(tmp_path / "a.parquet", ROWS)
    (tmp_path / "b.parquet").write_text("not parquet\n")
    stats = sources.SourceStats()
    with caplog.at_level(logging.WARNING, logger="electra_jax.data"):
        docs = list(sources.iter_documents(f"parquet:{tmp_path}/*.parquet", stats))
    assert docs == _expected(ROWS) and stats.files == 1
    assert len(stats.skipped) == 1 and "b.parquet: not a parquet file" in stats.skipped[0]
    (tmp_path / "a.parquet").unlink()
    with pytest.raises(DataError, match="has no usable text: all 1 matched files were skipped"):
        list(sources.iter_documents(f"parquet:{tmp_path}/*.parquet"))


def test_parquet_is_read_a_batch_at_a_time(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow", reason="parquet sources need pyarrow ([parquet])")
    row = "The chef cooked a meal for the family. " * 25  # ~1 KB
    # ~16 MB of text (the file compresses it to ~130 KB), which read whole takes as much memory.
    _write_parquet(tmp_path / "a.parquet", [row] * 16_000, row_group_size=500)
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 100)
    peak = count = 0
    for _ in sources.iter_documents(f"parquet:{tmp_path}/a.parquet"):
        peak, count = max(peak, pa.total_allocated_bytes()), count + 1
    assert count == 16_000
    assert peak < 4 << 20, peak  # a row group or two (~0.5 MB each of text), never all 16 MB


def test_jsonl_is_read_a_line_at_a_time(tmp_path):
    row = "The chef cooked a meal for the family. " * 25
    _write_jsonl(tmp_path / "a.jsonl", [row] * 8000)  # ~8 MB
    tracemalloc.start()
    try:
        n = sum(1 for _ in sources.iter_documents(f"jsonl:{tmp_path}/a.jsonl"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 8000
    assert peak < 2 << 20, peak


def test_a_jsonl_line_over_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_JSON_LINE_BYTES", 1000)
    (tmp_path / "a.jsonl").write_text(json.dumps([{"text": "x" * 50}] * 40))  # a JSON array
    with pytest.raises(DataError, match="line 1 is over 0 MB: JSON lines hold one object a line"):
        list(sources.iter_documents(f"jsonl:{tmp_path}/a.jsonl"))


def test_record_sources_have_the_content_key_and_files_of_text_sources(tmp_path):
    _write_parquet(tmp_path / "a.parquet", ROWS, extra=pa_strings(len(ROWS)))
    source = f"parquet:{tmp_path}/*.parquet"
    first = sources.source_fingerprint(source)
    assert sources.source_fingerprint(source) == first
    assert sources.source_fingerprint(source + ":extra") != first  # another column
    size = (tmp_path / "a.parquet").stat().st_size
    assert sources.parse(source).files() == [[str(tmp_path / "a.parquet"), size]]
    assert sources.input_bytes(source) == size
    _write_parquet(tmp_path / "b.parquet", ROWS)
    second = sources.source_fingerprint(source)
    assert second != first
    _write_jsonl(tmp_path / "a.jsonl", ROWS)
    jsonl = sources.source_fingerprint(f"jsonl:{tmp_path}/*.jsonl")
    assert jsonl != sources.source_fingerprint(f"text:{tmp_path}/*.jsonl")  # read otherwise
    with pytest.raises(DataError, match=r"data.source 'jsonl:.*nothing\*' matches no files"):
        sources.source_fingerprint(f"jsonl:{tmp_path}/nothing*")


def pa_strings(n):
    return [f"other {i}" for i in range(n)]


def test_a_parquet_source_without_pyarrow_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    with pytest.raises(
        DataError, match=r"needs pyarrow to read parquet: pip install -e '\.\[parquet\]'"
    ):
        sources.parse("parquet:corpus/*.parquet")
    assert sources.parse("jsonl:corpus/*.jsonl").kind == "jsonl"  # JSON lines need nothing


def test_a_field_inside_an_object_is_read_and_its_absence_named(tmp_path):
    """`jsonl:GLOB:meta/text` was read as part of the glob ("matches no files")."""
    rows = [{"meta": {"text": "Nested text."}}, {"meta": {"text": None}}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = f"jsonl:{tmp_path}/*.jsonl:meta/text"
    assert sources.parse(source).pattern == f"{tmp_path}/*.jsonl"
    assert list(sources.iter_documents(source)) == [["Nested text."]]
    (tmp_path / "a.jsonl").write_text('{"meta": {"body": "x"}}\n{"meta": 3}\n')
    with pytest.raises(DataError, match=r"line 1 has no field 'meta/text' \('meta' has body\)"):
        list(sources.iter_documents(source))
    (tmp_path / "a.jsonl").write_text('{"meta": 3}\n')
    with pytest.raises(DataError, match=r"line 1 has no field 'meta/text' \('meta' is a number\)"):
        list(sources.iter_documents(source))


def test_a_lone_surrogate_in_a_json_line_is_replaced_and_counted(tmp_path):
    """Valid JSON, no text: it crashed SentencePiece while packing."""
    (tmp_path / "a.jsonl").write_text('{"text": "a \\ud800 b and \\ud83d\\ude00 c."}\n')
    stats = sources.SourceStats()
    docs = list(sources.iter_documents(f"jsonl:{tmp_path}/a.jsonl", stats))
    assert docs == [["a \ufffd b and \U0001f600 c."]] and stats.bytes_replaced == 1
    "".join(docs[0]).encode("utf-8")  # every library's encoding of it works


def test_a_dictionary_encoded_parquet_text_column_is_text(tmp_path):
    """A categorical column of strings (pandas' `category`) was refused as "not text"."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = ["First one.", "Second one.", "First one.", None]
    table = pa.table({"text": pa.array(texts).dictionary_encode()})
    pq.write_table(table, tmp_path / "a.parquet")
    assert pa.types.is_dictionary(pq.ParquetFile(tmp_path / "a.parquet").schema_arrow[0].type)
    docs = list(sources.iter_documents(f"parquet:{tmp_path}/a.parquet"))
    assert docs == [["First one."], ["Second one."], ["First one."]]
