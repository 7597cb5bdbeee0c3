"""Corpus sources: turn a ``data.source`` string into a stream of documents.

A document is a list of sentences (non-empty, stripped lines), the unit ELECTRA's
``build_pretraining_dataset.py`` packs: an example never spans two documents.

Sources:
  ``builtin``     English text that ships with every CPython install, so the default run needs no
                  download: the ``pydoc_data`` documentation topics and the docstrings of the
                  standard library's pure-Python modules (read with ``ast``, never imported).
  ``text:GLOB``   plain-text files (``**`` recurses), one sentence per line, a blank line ends a
                  document. Files are streamed in chunks, never read whole; gzip files (by their
                  magic bytes) are decompressed on the fly; invalid UTF-8 bytes become U+FFFD and
                  are counted; binary and unreadable files are skipped with a warning. Links
                  are followed, but a link loop ends the walk there, and a file reached by
                  several paths is read once (see ``paths.glob``). The glob
                  may be remote (``gs://bucket/wiki/**/*.txt``; also ``s3://``, ``az://``,
                  ``hf://``): it is then listed, stat'ed and read through ``etils.epath``, with
                  the same matching rules as a local glob.
  ``parquet:GLOB[:COLUMN]``  Parquet files (most public pre-training corpora), one document per
                  row: its ``COLUMN`` (``text`` by default) split into lines and sentences as a
                  TFDS example's. Read a batch of rows at a time (``ParquetFile.iter_batches``,
                  one column), never a file whole; needs pyarrow (the ``[parquet]`` extra).
  ``jsonl:GLOB[:FIELD]``  JSON lines (gzip too), one document per line: its ``FIELD`` (``text``
                  by default), read a line at a time. A line that is not a JSON object, or whose
                  field is missing or not a string, ends the read in one line naming the file
                  and line; a null field or a blank line is no document.
                  Both globs match, list and read local and remote (``gs://``) files as a
                  ``text:`` glob does, with the same content key of the files' sizes and times.
                  The part after the last ``:`` is the column or field unless it starts with
                  ``//`` (a URI's scheme): a glob whose file names hold a ``:`` names the column
                  too. A JSON field inside an object is named by its path (``meta/text``); a
                  dictionary-encoded (categorical) parquet column of text is text. A lone
                  surrogate in a JSON string (``"\ud800"``, valid JSON but no text) is replaced
                  by U+FFFD and counted, as invalid UTF-8 bytes are.
  ``tfds:NAME[:VERSION][:SPLIT]``  a TFDS text dataset (split ``train`` by default); each example
                  is a document, its ``data.tfds_text_field`` split into lines and sentences.

Lines longer than ``max_line_chars`` are cut into pieces (after a sentence end, else at a space,
where there is one) and
documents are ended after ``max_document_chars``: a file with no newline at all then streams in
bounded memory instead of becoming one giant sentence.
"""

from __future__ import annotations

import ast
import codecs
import collections
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import sysconfig
import warnings
import zlib
from collections.abc import Iterable, Iterator

from electra_jax.config import pretrain_keys, schema
from electra_jax.errors import DataError
from electra_jax.store import deadline, jsonio
from electra_jax.store import paths as path_layer  # `paths` names lists of files here
from electra_jax.store.jsonio import bom_encoding, json_kind, one_line

# Bumped whenever the way ``builtin`` text is extracted changes, so cached prepared data keyed on
# the fingerprint is not silently reused with different content.
_BUILTIN_VERSION = "builtin-v2"
# Bumped whenever the way text files are read changes (line cutting, binary detection, ...).
_TEXT_VERSION = "text-v2"
_TFDS_VERSION = "tfds-v1"
_RECORDS_VERSION = {"parquet": "parquet-v1", "jsonl": "jsonl-v1"}
# The sources that are a glob of files, each one read in its format (see _FILE_READERS).
FILE_KINDS = ("text", "parquet", "jsonl")
# The column (parquet) or field (jsonl) read when data.source names none: the name the Hugging
# Face datasets and most corpora dumped from them use.
DEFAULT_FIELD = "text"
# Rows of a parquet file decoded at a time: a few MB of text, whatever the file's row groups.
PARQUET_BATCH_ROWS = 1024
# A JSON line longer than this is refused rather than read whole: no document is that long, and
# a file of one giant line (a JSON array, not JSON lines) would otherwise be held in memory.
MAX_JSON_LINE_BYTES = 1 << 28

# Stdlib directories whose text is not English prose worth training on (test fixtures, the IDLE
# app, third-party packages), or that hold files that do not parse as Python 3.
_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "_bundled"}
)

# Bytes read per call: large enough that the per-call overhead vanishes, small enough to keep a
# file with no newline in bounded memory.
READ_CHUNK_BYTES = 1 << 20
# A "sentence" longer than this many characters (~500 tokens, past any usual seq_length) is cut
# into pieces: packing trims segments to seq_length anyway, and one 50 MB line must not be held
# or tokenized as a single string. Kept under SentencePiece's training limit of 4192 bytes for
# ASCII text, so cut pieces of an all-in-one-line file still count for the tokenizer.
MAX_LINE_CHARS = 2000
# Documents longer than this are ended early: packing holds a document's sentences until it ends.
MAX_DOCUMENT_CHARS = 1 << 20
# A file is binary if its first bytes hold a NUL or are mostly not UTF-8.
_SNIFF_BYTES = 8192
_BINARY_INVALID_FRACTION = 0.3
_GZIP_MAGIC = b"\x1f\x8b"

_log = logging.getLogger("electra_jax.data")

# Bytes replaced by the counting error handler below. Reading is single-threaded within a process
# (workers only tokenize), so a module-level counter read before and after each file is exact.
_replaced = [0]


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += error.end - error.start
    return "\ufffd", error.end


codecs.register_error("electra_jax_count_replace", _count_and_replace)


@dataclasses.dataclass
class SourceStats:
    """What reading a source met, filled in while its documents are iterated.

    files: files (or TFDS examples) read.
    bytes_replaced: invalid UTF-8 bytes replaced by U+FFFD.
    skipped: ``path: reason`` for each file skipped (binary, unreadable, corrupt gzip).
    empty_files: files with no non-blank line.
    files_total, bytes_total: the matched files and their size on disk (text sources; bytes
      only for local files), for progress lines; None where unknown.
    """

    files: int = 0
    bytes_replaced: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)
    empty_files: int = 0
    files_total: int | None = None
    bytes_total: int | None = None
    # Bytes of the files done with, and the file being read (its position counts too).
    _bytes_done: int = dataclasses.field(default=0, repr=False)
    _reading: object = dataclasses.field(default=None, repr=False, compare=False)

    def bytes_read(self) -> int:
        """Bytes of the source's files read so far, as on disk (a gzip file's compressed bytes,
        like ``bytes_total``), read ahead by up to one chunk."""
        position = 0
        if self._reading is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                position = self._reading.tell()
        return self._bytes_done + position


_DATA_KEYS = schema.by_name(pretrain_keys.KEYS)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Reading options beyond the source string (config keys ``data.tfds_*``)."""

    tfds_text_field: str = _DATA_KEYS["data.tfds_text_field"].default
    tfds_data_dir: str = _DATA_KEYS["data.tfds_data_dir"].default
    max_line_chars: int = MAX_LINE_CHARS
    max_document_chars: int = MAX_DOCUMENT_CHARS

    @classmethod
    def from_config(cls, data_cfg) -> SourceOptions:
        """From the ``data`` config section (a caller may give a section of its own making:
        keys it lacks keep the schema's defaults)."""
        names = ("tfds_text_field", "tfds_data_dir")
        return cls(**{name: str(data_cfg[name]) for name in names if name in data_cfg})


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # The tokenizer sample and the packing pass read the same files: say each thing once.
    if message not in _warned:
        _warned.add(message)
        _log.warning("%s", message)


def cut_line(line: str, limit: int) -> list[str]:
    """Cuts a line into pieces of at most ``limit`` characters: after the last sentence end in
    the second half of the window (so sentences stay whole, as the packer expects), else at its
    last space (so words do), else mid-word."""
    pieces = []
    while len(line) > limit:
        ends = [m.end() for m in _SENTENCE_END_RE.finditer(line, limit // 2, limit)]
        cut = ends[-1] if ends else line.rfind(" ", limit // 2, limit)
        cut = limit if cut <= 0 else cut
        pieces.append(line[:cut])
        line = line[cut:]
    pieces.append(line)
    return pieces


def _split_documents(lines: Iterable[str], max_document_chars: int = MAX_DOCUMENT_CHARS):
    """Groups lines into documents: a blank line ends a document; the end of input ends one too,
    and so does reaching max_document_chars (a bound on memory, not a semantic break).

    Args:
      lines: raw lines (with or without trailing newlines).

    Yields:
      documents, each a non-empty list of stripped, non-empty sentences.
    """
    doc: list[str] = []
    size = 0
    for line in lines:
        sentence = line.strip()
        if sentence:
            doc.append(sentence)
            size += len(sentence)
            if size >= max_document_chars:
                yield doc
                doc, size = [], 0
        elif doc:
            yield doc
            doc, size = [], 0
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
    for node in _docstring_owners(tree):
        doc = ast.get_docstring(node, clean=True)
        if doc:
            sentences.extend(s.strip() for s in doc.splitlines() if s.strip())
    if sentences:
        yield sentences


# The nodes whose children can hold a docstring's owner (a def or a class): statements, and the
# except clauses and match cases that hold statements. An expression holds no statement.
_STATEMENT_NODES = (ast.stmt, ast.excepthandler, ast.match_case)


def _docstring_owners(tree: ast.Module) -> Iterator[ast.AST]:
    """The module, then its classes and functions at any depth, in ast.walk's (breadth-first)
    order. Expressions, most of a module's nodes, are not entered: no def or class is below
    one, and leaving out a subtree keeps the order of the nodes left, so the corpus is the same
    as walking every node (tests/data/test_sources.py), in a fraction of the time."""
    queue = collections.deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        queue.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, _STATEMENT_NODES))


@functools.cache
def _builtin_corpus() -> tuple[tuple[str, ...], ...]:
    """The builtin corpus's documents, read once per process: parsing the standard library takes
    about 2 s, and preparing a run reads its corpus twice (the tokenizer's sample, then the
    shards). About 2 MB of text: the interpreter's files do not change while it runs."""
    documents = itertools.chain(
        _pydoc_topic_documents(),
        (
            doc
            for path in _stdlib_python_files(sysconfig.get_paths()["stdlib"])
            for doc in _docstring_documents(path)
        ),
    )
    return tuple(tuple(doc) for doc in documents)


def _builtin_documents() -> Iterator[list[str]]:
    for doc in _builtin_corpus():
        yield list(doc)


class SourceAbsent(DataError):
    """A file source whose glob matches no file (the corpus moved or deleted): what a resume can
    stand in for with the shards its data record names (resume.prepared_data)."""


def _matched_files(source: str, pattern: str) -> list[str]:
    """The files a file source's glob matches, sorted (`source`: data.source, for messages)."""
    what = f"data.source '{source}'"
    try:
        paths, errors = path_layer.glob(pattern, what, DataError)
    except deadline.NoAnswer as e:  # a store that stopped answering: no listing to go by
        raise DataError(f"{what}: {deadline.no_answer_line(e)}") from None
    if not paths:
        why = f" (listing failed: {errors[0]})" if errors else ""
        # Listed without an error, the files are gone; a failed listing says nothing of them.
        raise (DataError if errors else SourceAbsent)(
            f"{what} matches no files{why}; check the glob (use ** for subdirectories), that "
            "the files exist and that this machine can read them"
        )
    return paths


_sniffed_invalid = [0]


def _count_and_drop(error: UnicodeDecodeError) -> tuple[str, int]:
    _sniffed_invalid[0] += error.end - error.start
    return "", error.end


codecs.register_error("electra_jax_sniff", _count_and_drop)


def _looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    if not head:
        return False
    # An incremental decode of the sniffed prefix: a multi-byte character cut at the end of the
    # prefix is not an error.
    _sniffed_invalid[0] = 0
    codecs.getincrementaldecoder("utf-8")("electra_jax_sniff").decode(head, final=False)
    return _sniffed_invalid[0] > _BINARY_INVALID_FRACTION * len(head)


def _open_binary(path: str, gzip_ok: bool = True):
    """Opens path for reading bytes, through gzip when it starts with gzip's magic bytes (and
    `gzip_ok`).

    Returns:
      (stream to read, object to close): the stream is the file itself or a GzipFile over it.
    """
    # epath's TensorFlow backend opens through a context manager, fsspec's returns the file:
    # an ExitStack closes either, and the local file alike.
    closer = contextlib.ExitStack()
    try:
        with path_layer.remote_errors(path, "data.source", DataError):
            f = closer.enter_context(path_layer.open_file(path, "rb"))
            magic = f.read(2)
        f.seek(0)
    except BaseException:
        closer.close()
        raise
    if magic == _GZIP_MAGIC and gzip_ok:
        return gzip.GzipFile(fileobj=f, mode="rb"), closer
    return f, closer


def _file_lines(f, first: bytes, max_line_chars: int) -> Iterator[str]:
    """Decoded lines of a binary stream, read in chunks; overlong lines come out in pieces."""
    decoder = codecs.getincrementaldecoder("utf-8")("electra_jax_count_replace")
    pending = ""
    chunk = first
    while True:
        final = not chunk
        text = decoder.decode(chunk, final=final)
        if text:
            lines = (pending + text).split("\n")
            pending = lines.pop()
            for line in lines:
                if len(line) > max_line_chars:
                    yield from cut_line(line, max_line_chars)
                else:
                    yield line
            if len(pending) > max_line_chars:
                # No newline in sight: emit all but the last piece (which may continue).
                *full, pending = cut_line(pending, max_line_chars)
                yield from full
        if final:
            break
        chunk = f.read(READ_CHUNK_BYTES)
    if pending:
        yield pending


@contextlib.contextmanager
def _file_read(path: str, stats: SourceStats):
    """What reading one file adds to `stats`, however the reading ends: its bytes replaced, and
    its size to the bytes done (the progress lines')."""
    size = path_layer.local_size(path) or 0
    before = _replaced[0]
    try:
        yield
    finally:
        stats.bytes_replaced += _replaced[0] - before
        stats._reading = None
        stats._bytes_done += size


def _text_documents(paths: list[str], stats: SourceStats, opts: SourceOptions):
    for path in paths:
        found = False
        with _file_read(path, stats):
            try:
                stream, raw = _open_binary(path)
            except deadline.NoAnswer as e:  # not skipped: the corpus would lose a good file
                raise DataError(f"data.source: {deadline.no_answer_line(e)}") from None
            except OSError as e:
                stats.skipped.append(f"{path}: {e.strerror or e}")
                _warn_once(f"skipping {path}: cannot be read ({e.strerror or e})")
                continue
            # The file on disk under a gzip stream: its position is in the units of bytes_total.
            stats._reading = getattr(stream, "fileobj", stream)
            try:
                with raw, stream:
                    head = stream.read(_SNIFF_BYTES)
                    if _looks_binary(head):
                        encoding = bom_encoding(head)
                        stats.skipped.append(
                            f"{path}: {encoding} text, not UTF-8" if encoding else f"{path}: binary"
                        )
                        _warn_once(
                            f"skipping {path}: {encoding} text (its byte-order mark), not UTF-8: "
                            f"convert it, e.g. iconv -f {encoding} -t UTF-8"
                            if encoding
                            else f"skipping {path}: binary (NUL bytes or mostly not UTF-8)"
                        )
                        continue  # Counted as skipped, not as empty.
                    stats.files += 1
                    lines = _file_lines(stream, head, opts.max_line_chars)
                    for doc in _split_documents(lines, opts.max_document_chars):
                        found = True
                        yield doc
            except (OSError, EOFError, zlib.error) as e:
                # A truncated or corrupt gzip member, or a read error mid-file: keep what was read.
                stats.skipped.append(f"{path}: {e}")
                _warn_once(f"stopped reading {path} early: {e}")
        if not found:
            stats.empty_files += 1


def _nothing_usable(source: str, paths: list[str], stats: SourceStats) -> DataError:
    skipped = "; ".join(stats.skipped[:3]) + (" ..." if len(stats.skipped) > 3 else "")
    if stats.skipped and len(stats.skipped) == len(paths):
        what = f"all {len(paths)} matched files were skipped ({skipped})"
    elif stats.skipped:
        what = (
            f"{len(paths)} files matched: {stats.empty_files} have no text, "
            f"{len(stats.skipped)} were skipped ({skipped})"
        )
    else:
        examples = ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
        what = f"all {len(paths)} matched files are empty or blank ({examples})"
    return DataError(f"data.source '{source}' has no usable text: {what}")


# ---- parquet and JSON lines: one document per row ---------------------------------------------


def _needs_pyarrow(source: str) -> DataError:
    return DataError(
        f"data.source '{source}' needs pyarrow to read parquet: pip install -e '.[parquet]'"
    )


def _import_pyarrow(source: str):
    try:
        # pyarrow: only on the path that uses it (an optional extra, or slow to import).
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise _needs_pyarrow(source) from None
    return pa, pq


def _parquet_rows(source: str, path: str, stream, column: str):
    """The text of each row of one parquet file's `column` (None for a null), a batch of
    PARQUET_BATCH_ROWS rows at a time: only that column is read, never the file whole. The file's
    footer (its schema) is read at the call."""
    pa, pq = _import_pyarrow(source)
    try:
        parquet = pq.ParquetFile(stream)
    except (pa.ArrowException, OSError) as e:
        raise _Unreadable(f"not a parquet file ({one_line(e, 200)})") from None
    schema = parquet.schema_arrow
    if schema.get_field_index(column) < 0:
        raise DataError(
            f"data.source '{source}': {path} has no column '{column}' (it has "
            f"{', '.join(schema.names) or 'none'}); name the text column: parquet:GLOB:COLUMN"
        )
    kind = schema.field(column).type
    # A dictionary-encoded (categorical) column of text is text: decoded batch by batch.
    encoded = pa.types.is_dictionary(kind)
    kind = kind.value_type if encoded else kind
    # Read as bytes and decoded here: invalid UTF-8 in a string column becomes U+FFFD and is
    # counted, as in text files, where pyarrow's own decoding would raise.
    as_bytes = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}.get(kind)
    if as_bytes is None and kind not in (pa.binary(), pa.large_binary()):
        raise DataError(
            f"data.source '{source}': column '{column}' of {path} holds {kind}, not text; name "
            "a string column: parquet:GLOB:COLUMN"
        )

    def rows():
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column]):
            values = batch.column(0)
            values = values.dictionary_decode() if encoded else values
            for value in (values.cast(as_bytes) if as_bytes else values).to_pylist():
                yield None if value is None else value.decode("utf-8", "electra_jax_count_replace")

    return rows()


def _jsonl_rows(source: str, path: str, stream, field: str):
    """The `field` of each JSON line of one file (None for a null or a blank line), a line at a
    time."""
    number = 0
    while True:
        line = stream.readline(MAX_JSON_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        where = f"data.source '{source}': {path} line {number}"
        if len(line) > MAX_JSON_LINE_BYTES:
            raise DataError(
                f"{where} is over {MAX_JSON_LINE_BYTES >> 20} MB: JSON lines hold one object a "
                "line (a JSON array or one huge object is not JSON lines)"
            )
        if number == 1:
            encoding = bom_encoding(line)
            if encoding:
                raise DataError(
                    f"{where}: the file is {encoding} text (its byte-order mark), not UTF-8: "
                    f"convert it, e.g. iconv -f {encoding} -t UTF-8"
                )
            line = line.removeprefix(codecs.BOM_UTF8)
        text = line.decode("utf-8", "electra_jax_count_replace")
        if not text.strip():
            yield None
            continue
        try:
            record = jsonio.loads(text)
        except ValueError as e:
            raise DataError(
                f"{where} is not JSON ({one_line(e, 120)}); each line must be one JSON object"
            ) from None
        if not isinstance(record, dict):
            raise DataError(f"{where} is a JSON {json_kind(record)}, not an object")
        value = record
        for depth, name in enumerate(field.split("/")):  # meta/text: a field of an object
            if not isinstance(value, dict) or name not in value:
                inside = "/".join(field.split("/")[:depth]) or None
                if isinstance(value, dict):
                    fields = ", ".join(sorted(value)[:10]) or "none"
                    has = f"it has {fields}" if inside is None else f"'{inside}' has {fields}"
                else:
                    has = f"'{inside}' is a {json_kind(value)}"
                raise DataError(
                    f"{where} has no field '{field}' ({has}); name the text field: "
                    "jsonl:GLOB:FIELD (a field of an object: jsonl:GLOB:OUTER/FIELD)"
                )
            value = value[name]
        if value is not None and not isinstance(value, str):
            raise DataError(
                f"{where}: field '{field}' is a {json_kind(value)}, not text; name a string "
                "field: jsonl:GLOB:FIELD"
            )
        if value is not None:
            # A "\ud800" escape is valid JSON but no text SentencePiece can encode: replaced
            # by U+FFFD and counted, as invalid UTF-8 bytes are.
            value, lone = jsonio.without_lone_surrogates(value)
            _replaced[0] += lone
        yield value


class _Unreadable(Exception):
    """A file a record reader cannot read at all (not parquet): skipped, as a binary text file."""


def _record_documents(
    source: str, kind: str, paths: list[str], field: str, stats: SourceStats, opts: SourceOptions
):
    """Documents of parquet or JSON-lines files, one per row with text; files that cannot be
    opened or read are skipped (and counted) as text sources skip them."""
    rows = _parquet_rows if kind == "parquet" else _jsonl_rows
    for path in paths:
        found = False
        try:
            with _file_read(path, stats):
                # A parquet file's footer is read first: its reader seeks, so no gzip layer.
                stream, raw = _open_binary(path, gzip_ok=kind == "jsonl")
                stats._reading = getattr(stream, "fileobj", stream)
                with raw, stream:
                    texts = rows(source, path, stream, field)
                    stats.files += 1
                    for text in texts:
                        for doc in () if text is None else _example_documents(text, opts):
                            found = True
                            yield doc
        except _Unreadable as e:
            stats.skipped.append(f"{path}: {e}")
            _warn_once(f"skipping {path}: {e}")
            continue  # Counted as skipped, not as empty.
        except (OSError, EOFError, zlib.error) as e:
            # Cannot be opened, or a read error (a truncated gzip member) mid-file.
            stats.skipped.append(f"{path}: {getattr(e, 'strerror', None) or e}")
            _warn_once(f"stopped reading {path}: {e}")
            continue
        if not found:
            stats.empty_files += 1


def _file_source(source: Source, stats: SourceStats):
    """The documents of a file source (text, parquet or jsonl): its files listed at the call."""
    paths = _matched_files(source.name, source.pattern)
    stats.files_total = len(paths)
    stats.bytes_total = path_layer.total_size(paths)
    if source.kind == "text":
        documents = _text_documents(paths, stats, source.options)
    else:
        documents = _record_documents(
            source.name, source.kind, paths, source.field, stats, source.options
        )

    def generate():
        found = False
        for doc in documents:
            found = True
            yield doc
        if not found:
            raise _nothing_usable(source.name, paths, stats)

    return generate()


# ---- TFDS ------------------------------------------------------------------------------------

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


def _parse_tfds(arg: str) -> tuple[str, str]:
    """'NAME[:VERSION][:SPLIT]' -> (tfds name with version, split)."""
    parts = arg.split(":")
    name, split = parts[0], "train"
    rest = parts[1:]
    if rest and _VERSION_RE.match(rest[0]):
        name += ":" + rest.pop(0)
    if rest:
        split = ":".join(rest)
    return name, split


def _import_tfds(source: str):
    try:
        # tensorflow_datasets: only on the path that uses it (an optional extra, or slow to import).
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(
            f"data.source '{source}' needs tensorflow-datasets: pip install -e '.[tfds]'"
        ) from None
    return tfds


def _tfds_no_answer(source: str, opts: SourceOptions, error: Exception) -> None:
    """DataError naming data.tfds_data_dir when `error` is a request's timeout (a gs://
    data_dir that stopped answering), not a dataset TFDS lacks."""
    if deadline.is_timeout(error):
        where = f"data.tfds_data_dir {opts.tfds_data_dir}" if opts.tfds_data_dir else "TFDS"
        raise DataError(
            f"data.source '{source}': {where}: {deadline.no_answer_line(error)}"
        ) from None


def _tfds_builder(source: str, name: str, opts: SourceOptions):
    tfds = _import_tfds(source)
    # TFDS reads a gs:// data_dir itself (through etils.epath): its requests' deadline first.
    path_layer.bound(opts.tfds_data_dir)
    try:
        return tfds.builder(name, data_dir=opts.tfds_data_dir or None)
    except Exception as e:  # DatasetNotFoundError, a bad version, a config that does not exist
        _tfds_no_answer(source, opts, e)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"data.source '{source}': TFDS has no dataset '{name}' ({first})") from None


def _build_command(name: str, opts: SourceOptions) -> str:
    data_dir = f" --data_dir={opts.tfds_data_dir}" if opts.tfds_data_dir else ""
    return f"tfds build {name}{data_dir} --file_format=array_record"


def _tf_examples(builder, split: str):
    """Examples through tf.data, for datasets prepared as TFRecord (the TFDS default)."""
    try:
        # tensorflow: only on the path that uses it (an optional extra, or slow to import).
        import tensorflow as tf
    except ImportError:
        raise DataError(
            f"TFDS dataset '{builder.name}' is stored as {builder.info.file_format}, which "
            "needs TensorFlow to read: pip install tensorflow-cpu, or rebuild it with "
            "--file_format=array_record"
        ) from None
    # TensorFlow would otherwise reserve most of every GPU's memory, which JAX needs.
    tf.config.set_visible_devices([], "GPU")
    # tensorflow_datasets: only on the path that uses it (an optional extra, or slow to import).
    import tensorflow_datasets as tfds

    ds = builder.as_dataset(split=split, shuffle_files=False)
    return tfds.as_numpy(ds)


def _tfds_examples(source: str, name: str, split: str, opts: SourceOptions):
    builder = _tfds_builder(source, name, opts)
    try:
        # ArrayRecord-prepared data (and tfds.testing.mock_data) read without TensorFlow.
        data = builder.as_data_source(split=split)
        return (data[i] for i in range(len(data)))
    except NotImplementedError:
        pass  # Prepared, but in a format without random access (TFRecord).
    except Exception as e:
        _tfds_no_answer(source, opts, e)
        if builder.is_prepared():
            raise DataError(f"data.source '{source}': cannot read split '{split}': {e}") from None
    if not builder.is_prepared():
        raise DataError(
            f"TFDS dataset '{name}' is not prepared in "
            f"{opts.tfds_data_dir or '~/tensorflow_datasets'} and is not downloaded during "
            f"training; prepare it with: {_build_command(name, opts)}"
        )
    return _tf_examples(builder, split)


def _tfds_text(example, field: str, source: str) -> str:
    try:
        value = example[field]
    except (KeyError, TypeError, IndexError):
        fields = sorted(example) if isinstance(example, dict) else type(example).__name__
        raise DataError(
            f"data.source '{source}' has no field '{field}' (it has {fields}); set "
            "data.tfds_text_field"
        ) from None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="electra_jax_count_replace")
    if hasattr(value, "item"):  # a numpy scalar from tf.data
        value = value.item()
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="electra_jax_count_replace")
    return str(value)


def _example_documents(text: str, opts: SourceOptions) -> Iterator[list[str]]:
    """One example (a TFDS example's, a parquet row's or a JSON line's text), one document: its
    lines (paragraphs in Wikipedia and C4) are split into sentences so that a paragraph longer
    than seq_length is not mostly trimmed; a document over max_document_chars is ended early."""
    sentences = []
    for line in text.split("\n"):
        for sentence in _SENTENCE_END_RE.split(line.strip()):
            if sentence:
                sentences.extend(cut_line(sentence, opts.max_line_chars))
    return _split_documents(sentences, opts.max_document_chars)


def _tfds_source(source: str, arg: str, stats: SourceStats, opts: SourceOptions):
    name, split = _parse_tfds(arg)
    examples = _tfds_examples(source, name, split, opts)

    def generate():
        found = False
        for example in examples:
            before = _replaced[0]
            text = _tfds_text(example, opts.tfds_text_field, source)
            stats.bytes_replaced += _replaced[0] - before
            stats.files += 1
            for doc in _example_documents(text, opts):
                found = True
                yield doc
        if not found:
            raise DataError(f"data.source '{source}' has no text in field '{opts.tfds_text_field}'")

    return generate()


# ---- entry points ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
    """A corpus as data.source names it, parsed once, with the options that read it: what
    prepare asks of a corpus (its documents, its size, its content key)."""

    name: str  # data.source as given: 'builtin', 'text:GLOB', 'parquet:GLOB[:COLUMN]', ...
    kind: str  # 'builtin', 'text', 'parquet', 'jsonl' or 'tfds'
    arg: str  # what follows 'KIND:' (the glob and column; the TFDS name, version and split)
    options: SourceOptions = SourceOptions()

    @property
    def pattern(self) -> str:
        """A file source's glob (text, parquet, jsonl)."""
        return _glob_and_field(self.kind, self.arg)[0]

    @property
    def field(self) -> str:
        """The parquet column or JSON field a row's text is in; '' for other sources."""
        return _glob_and_field(self.kind, self.arg)[1]

    def documents(self, stats: SourceStats | None = None) -> Iterator[list[str]]:
        """Streams the documents of the corpus, in a deterministic order.

        Args:
          stats: filled in as the documents are read (bytes replaced, files skipped, ...).

        Yields:
          documents, each a non-empty list of non-empty stripped sentences (str).

        Raises:
          DataError: a glob that matches no file, a TFDS dataset that is not available (raised
            at the call, before the first document). A source with nothing usable (only empty,
            binary or unreadable files) raises when its iteration ends.
        """
        stats = SourceStats() if stats is None else stats
        if self.kind == "builtin":
            return _builtin_documents()
        if self.kind in FILE_KINDS:
            return _file_source(self, stats)
        return _tfds_source(self.name, self.arg, stats, self.options)

    def input_bytes(self) -> int | None:
        """The size on disk of a file source's local files; None for other sources (builtin,
        TFDS, remote globs), whose size is not known without reading or a round trip per file.

        Raises:
          DataError: a glob that matches no file.
        """
        files = self.files()
        return None if files is None else sum(size for _, size in files)

    def files(self) -> list[list] | None:
        """[[absolute path, size], ...] of a file source's local files (text, parquet, jsonl),
        sorted; None for other sources (builtin, TFDS, remote globs). What a resume names when
        the corpus under the same data.source changed (resume.py).

        Raises:
          DataError: a glob that matches no file.
        """
        if self.kind not in FILE_KINDS or path_layer.scheme(self.pattern):
            return None
        paths = _matched_files(self.name, self.pattern)
        return [[os.path.abspath(p), path_layer.local_size(p) or 0] for p in paths]

    def fingerprint(self) -> str:
        """A content key of the corpus: equal keys mean the same documents (hex sha256).

        For ``builtin`` the text is fixed by the interpreter, so the Python version and the
        stdlib location identify it. For text files, (path, size, mtime_ns) of every matched
        file changes whenever a file is added, removed or rewritten, without reading the corpus;
        for remote files, (URI, size, mtime) as ``etils.epath`` stats them: mtime in whole
        seconds (GCS: the object's update time), 0 where the store reports none. Parquet and
        JSON-lines files alike, with the column or field read. For TFDS, the dataset's name,
        version, split, data_dir and text field.

        Returns:
          a 64-character hex string.
        """
        kind, arg, options = self.kind, self.arg, self.options
        if kind == "builtin":
            key: object = [_BUILTIN_VERSION, sys.version, sysconfig.get_paths()["stdlib"]]
        elif kind in FILE_KINDS:
            paths = _matched_files(self.name, self.pattern)
            files = path_layer.file_keys(paths, f"data.source '{self.name}'", DataError)
            key = [_TEXT_VERSION, files, options.max_line_chars, options.max_document_chars]
            if kind != "text":  # a text source's key is as it was before the other kinds
                key = [_RECORDS_VERSION[kind], self.field, *key]
        else:
            name, split = _parse_tfds(arg)
            builder = _tfds_builder(self.name, name, options)
            key = [
                _TFDS_VERSION,
                builder.info.full_name,
                str(builder.info.version),
                split,
                os.path.abspath(os.path.expanduser(options.tfds_data_dir))
                if options.tfds_data_dir
                else "",
                options.tfds_text_field,
                options.max_line_chars,
                options.max_document_chars,
            ]
        return hashlib.sha256(json.dumps(key).encode("utf-8")).hexdigest()


def parse(source: str | Source, options: SourceOptions | None = None) -> Source:
    """data.source as a `Source` (a Source is returned as it is).

    Raises:
      DataError: not ``'builtin'``, ``'text:GLOB'``, ``'parquet:GLOB[:COLUMN]'``,
        ``'jsonl:GLOB[:FIELD]'`` or ``'tfds:NAME[:VERSION][:SPLIT]'``; a parquet source without
        pyarrow installed. Nothing is read.
    """
    if isinstance(source, Source):
        return source
    options = SourceOptions() if options is None else options
    kind, _, arg = str(source).partition(":")
    known = (kind == "builtin" and not arg) or (kind in (*FILE_KINDS, "tfds") and bool(arg))
    if not known or (kind in FILE_KINDS and not _glob_and_field(kind, arg)[0]):
        raise DataError(
            f"data.source '{source}' is not a known source; use 'builtin', 'text:GLOB' (e.g. "
            "text:corpus/**/*.txt), 'parquet:GLOB[:COLUMN]', 'jsonl:GLOB[:FIELD]' (e.g. "
            "jsonl:corpus/*.jsonl.gz:text) or 'tfds:NAME[:SPLIT]' (e.g. tfds:wikipedia/20230601.en)"
        )
    if kind == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise _needs_pyarrow(source)  # before anything is read (the import itself takes longer)
    return Source(source, kind, arg, options)


def _glob_and_field(kind: str, arg: str) -> tuple[str, str]:
    """'GLOB[:FIELD]' -> (glob, field) for parquet and jsonl ((arg, '') for the others): the
    part after the last ':' is the field when it holds no '/', so that 'gs://...' globs keep
    their scheme; a glob whose names hold a ':' names its field too."""
    if kind not in ("parquet", "jsonl"):
        return arg, ""
    glob, colon, field = arg.rpartition(":")
    # After a URI's scheme ('gs://...') there is no field; a field may name one inside an
    # object ('meta/text'), which held a '/' and was read as part of the glob.
    if not colon or field.startswith("//"):
        return arg, DEFAULT_FIELD
    return glob, field or DEFAULT_FIELD


def from_config(data_cfg) -> Source:
    """The ``data`` config section's source, with its reading options (``data.tfds_*``)."""
    return parse(data_cfg.source, SourceOptions.from_config(data_cfg))


# The source string's entry points, for callers that hold one (the tests, the prepare command).


def iter_documents(
    source: str | Source, stats: SourceStats | None = None, options: SourceOptions | None = None
) -> Iterator[list[str]]:
    """`Source.documents` of `parse(source, options)`."""
    return parse(source, options).documents(stats)


def input_bytes(source: str | Source) -> int | None:
    """`Source.input_bytes` of `parse(source)`."""
    return parse(source).input_bytes()


def source_fingerprint(source: str | Source, options: SourceOptions | None = None) -> str:
    """`Source.fingerprint` of `parse(source, options)`."""
    return parse(source, options).fingerprint()
