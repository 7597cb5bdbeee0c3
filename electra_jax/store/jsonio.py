"""JSON files as the package reads and writes them, and the words its messages use for values.

It imports only paths.py (a leaf), so that `data/` (the lowest floor) and the Hugging Face
readers above it read a tokenizer_config.json or a config.json the same way, local or gs://.
"""

from __future__ import annotations

import codecs
import errno
import json
import re
from collections.abc import Iterable
from typing import Any

from electra_jax.store import paths


def one_line(text: object, limit: int = 300) -> str:
    """`text` with its whitespace runs (newlines included) collapsed, cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# Byte-order marks of the encodings a text file "not UTF-8" most often is (UTF-32's first: its
# little-endian mark begins with UTF-16's).
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def bom_encoding(head: bytes) -> str | None:
    """'UTF-16' or 'UTF-32' when `head` (a file's first bytes) starts with that byte-order
    mark; else None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    return None


def text_problem(error: ValueError) -> str:
    """Why a file could not be read as text or JSON, in words that lead to the fix: a file in
    UTF-16 or UTF-32 is named as such with the command that converts it, rather than as bytes
    that are not UTF-8."""
    if isinstance(error, UnicodeDecodeError):
        head = bytes(error.object[:4]) if error.start < 4 else b""
        encoding = bom_encoding(head)
        if encoding:
            return (
                f"it is {encoding} text (its byte-order mark), not UTF-8: convert it, e.g. "
                f"iconv -f {encoding} -t UTF-8"
            )
        return f"it is not UTF-8 text ({error.reason} at byte {error.start})"
    return one_line(error, 200)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate (a JSON "\\ud800" escape is valid JSON, but no UTF-8 text)
    replaced by U+FFFD, and how many there were. One code point for one: character offsets into
    the text (a SQuAD answer's) stay right. Every library that encodes to UTF-8 (SentencePiece,
    tokenizers) fails on one, deep inside."""
    if text.isascii():  # the common case, in one pass over the bytes
        return text, 0
    return _LONE_SURROGATE.subn("\ufffd", text)


def json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages ('list', 'string', ...)."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


# Deeper than any file the package reads (a SQuAD file nests 6 levels, a config 3), and far
# below the depth where json's parser, or code that walks the value (ConfigDict, flatten), runs
# out of Python's recursion limit.
MAX_DEPTH = 100


def _depth(value: Any) -> int:
    """How many lists and objects deep `value` nests (0 for a number), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in node if isinstance(child, dict | list))
    return deepest


def loads(text: str | bytes) -> Any:
    """json.loads for the package's readers: JSON nested deeper than MAX_DEPTH is a ValueError,
    as malformed JSON is (callers name the file), never a RecursionError from the parser or from
    code that walks the value later.

    Raises:
      ValueError: not JSON (json.JSONDecodeError), not UTF-8, or nested too deep.
    """
    too_deep = ValueError(f"JSON nested more than {MAX_DEPTH} lists or objects deep")
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep from None
    if _depth(value) > MAX_DEPTH:
        raise too_deep
    return value


# What to do about an OSError met writing, by its errno: the advice follows the error's own cause
# (a folder where a file goes is no full disk).
_WRITE_ADVICE = (
    ((errno.ENOSPC, errno.EDQUOT), "free space on that disk (or raise the quota)"),
    ((errno.EFBIG,), "raise the file size limit (ulimit -f) or use a filesystem without one"),
    ((errno.EISDIR,), "a folder stands where that file goes: move it away"),
    ((errno.ENOTDIR,), "a file stands where a folder of that path goes: move it away"),
    ((errno.EACCES, errno.EPERM), "make it writable (its permissions) or write elsewhere"),
    ((errno.EROFS,), "the filesystem is mounted read-only: write elsewhere"),
    ((errno.ENOENT,), "a folder of that path is gone (a lost mount?): restore it"),
    ((errno.ELOOP,), "a symbolic link is in the way: replace it with a real folder or file"),
    ((errno.ENOMEM,), "the machine ran out of memory: free some or use a larger one"),
)


def write_advice(error: OSError) -> str:
    """What to do about `error`, met writing, in a few words chosen by its errno (an unknown
    one: check the storage)."""
    for codes, advice in _WRITE_ADVICE:
        if error.errno in codes:
            return advice
    return "check the storage (its mount, its free space, its errors)"


def read_json(path: str, error: type[Exception], default: Any = None) -> Any:
    """The parsed file; `default` when it is given and the file is absent.

    Raises:
      error: the file is missing (without a default), unreadable or not JSON; the message names
        the file and says to fetch or export it again.
    """
    if default is not None and not paths.exists(path):
        return default
    try:
        return loads(paths.read_text(path))
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except (OSError, ValueError) as e:
        reason = text_problem(e) if isinstance(e, ValueError) else one_line(e, 200)
        raise error(f"{path} cannot be read ({reason}); fetch or export it again") from None


def read_json_object(path: str, what: str, error: type[Exception], default: Any = None) -> dict:
    """read_json, refusing a file whose top level is not an object (`what`: what it must be)."""
    value = read_json(path, error, default)
    if not isinstance(value, dict):
        raise error(
            f"{path} holds a JSON {json_kind(value)}, not an object ({what}); fetch or export it "
            "again"
        )
    return value


def write_atomic(path: str, text: str) -> None:
    """`text` as the whole of `path`, or `path` left as it was (a reader, or a run killed
    half-way, never sees part of it): locally written and synced to a temporary file beside it,
    then moved over it with os.replace; in a gs:// bucket one upload (an object appears whole).
    The package's one writer of whole files (paths.write_atomic does the writing).

    Raises:
      OSError: the folder is not writable, the disk is full, ... (the temporary file removed).
    """
    paths.write_atomic(path, text)


def write_json(path: str, obj: Any) -> None:
    """`obj` as indented JSON with sorted keys and a final newline, written atomically."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: str, rows: Iterable[Any]) -> None:
    """`rows` as JSON lines (metrics.jsonl, eval.jsonl, predictions), written atomically."""
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
