"""Tests of electra_jax.data.sources: the builtin corpus and text globs."""

import hashlib
import os
import subprocess
import sys

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


def test_unknown_and_tfds_sources_raise():
    with pytest.raises(DataError, match="not supported yet"):
        sources.iter_documents("tfds:wikipedia/20230601.en")
    with pytest.raises(DataError, match="not a known source"):
        sources.iter_documents("bogus")
    with pytest.raises(DataError, match="not a known source"):
        sources.iter_documents("text:")


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
