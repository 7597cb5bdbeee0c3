"""Corpus sources: turn a ``data.source`` string into a stream of documents.

A document is a list of sentences (non-empty, stripped lines), the unit ELECTRA's
``build_pretraining_dataset.py`` packs: an example never spans two documents.

Sources:
  ``builtin``     English text that ships with every CPython install, so the default run needs no
                  download: the ``pydoc_data`` documentation topics and the docstrings of the
                  standard library's pure-Python modules (read with ``ast``, never imported).
  ``text:GLOB``   plain-text files, one sentence per line, a blank line ends a document.
  ``tfds:...``    not supported yet.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator

from electra_jax.data import DataError

# Bumped whenever the way ``builtin`` text is extracted changes, so cached prepared data keyed on
# the fingerprint is not silently reused with different content.
_BUILTIN_VERSION = "builtin-v2"

# Stdlib directories whose text is not English prose worth training on (test fixtures, the IDLE
# app, third-party packages), or that hold files that do not parse as Python 3.
_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "_bundled"}
)


def _split_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Groups lines into documents: a blank line ends a document; the end of input ends one too.

    Args:
      lines: raw lines (with or without trailing newlines).

    Yields:
      documents, each a non-empty list of stripped, non-empty sentences.
    """
    doc: list[str] = []
    for line in lines:
        sentence = line.strip()
        if sentence:
            doc.append(sentence)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _pydoc_topic_documents() -> Iterator[list[str]]:
    # pydoc_data.topics is a plain dict literal (the rendered reference manual topics); importing
    # it runs no library code. Sorted keys make the order independent of how the dict was built.
    from pydoc_data.topics import topics

    for name in sorted(topics):
        # A topic is one document: its blank lines separate paragraphs of one page, and cutting
        # there would leave most examples a few sentences long, mostly padding.
        sentences = [s.strip() for s in topics[name].splitlines() if s.strip()]
        if sentences:
            yield sentences


def _stdlib_python_files(stdlib: str) -> Iterator[str]:
    for root, dirs, files in os.walk(stdlib):
        # os.walk visits directories in listing order, which depends on the file system: sort in
        # place so the corpus (and every hash derived from it) is the same on every machine.
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(root, name)


def _docstring_documents(path: str) -> Iterator[list[str]]:
    try:
        with open(path, "rb") as f:
            source = f.read()
        with warnings.catch_warnings():
            # Old modules have invalid escape sequences in string literals; parsing them warns.
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError):
        return  # Not Python 3 (e.g. a test fixture) or unreadable: not worth failing over.
    # All docstrings of a module make one document: most are a line or two, and as documents of
    # their own they would pack into short, mostly padded, single-segment examples.
    sentences: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                sentences.extend(s.strip() for s in doc.splitlines() if s.strip())
    if sentences:
        yield sentences


def _builtin_documents() -> Iterator[list[str]]:
    yield from _pydoc_topic_documents()
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in _stdlib_python_files(stdlib):
        yield from _docstring_documents(path)


def _text_files(pattern: str) -> list[str]:
    expanded = os.path.expanduser(pattern)
    paths = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
    if not paths:
        raise DataError(
            f"data.source 'text:{pattern}' matches no files; check the glob (use ** for "
            "subdirectories) and that the files exist"
        )
    return paths


def _text_documents(paths: list[str]) -> Iterator[list[str]]:
    for path in paths:
        # errors='replace': one stray byte in a large crawl should cost a character, not the run.
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from _split_documents(f)


def _parse(source: str) -> tuple[str, str]:
    kind, _, arg = source.partition(":")
    if kind == "builtin" and not arg:
        return kind, arg
    if kind == "text" and arg:
        return kind, arg
    if kind == "tfds":
        raise DataError(
            f"data.source '{source}': tfds sources are not supported yet; "
            "use 'builtin' or 'text:GLOB'"
        )
    raise DataError(
        f"data.source '{source}' is not a known source; use 'builtin' or 'text:GLOB' "
        "(e.g. text:corpus/**/*.txt)"
    )


def iter_documents(source: str) -> Iterator[list[str]]:
    """Streams the documents of a corpus, in a deterministic order.

    Args:
      source: ``'builtin'`` or ``'text:GLOB'``.

    Yields:
      documents, each a non-empty list of non-empty stripped sentences (str).

    Raises:
      DataError: unknown or unsupported source, or a glob that matches no file (raised at the
        call, before the first document, so the error is not deferred to iteration).
    """
    kind, arg = _parse(source)
    if kind == "builtin":
        return _builtin_documents()
    return _text_documents(_text_files(arg))


def source_fingerprint(source: str) -> str:
    """A content key of a source: equal keys mean the same documents (hex sha256).

    For ``builtin`` the text is fixed by the interpreter, so the Python version and the stdlib
    location identify it. For text files, (path, size, mtime_ns) of every matched file changes
    whenever a file is added, removed or rewritten, without reading the corpus.

    Args:
      source: ``'builtin'`` or ``'text:GLOB'``.

    Returns:
      a 64-character hex string.
    """
    kind, arg = _parse(source)
    if kind == "builtin":
        key: object = [_BUILTIN_VERSION, sys.version, sysconfig.get_paths()["stdlib"]]
    else:
        files = []
        for path in _text_files(arg):
            st = os.stat(path)
            files.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
        key = ["text-v1", files]
    return hashlib.sha256(json.dumps(key).encode("utf-8")).hexdigest()
