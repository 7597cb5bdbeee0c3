"""`--print_config`: every key of a config, its value and the comment its config file gives it.

The comments are read from the config file's source, so that the file stays the one place a
setting is explained: a key's comment is the one on its assignment's line (`config.a.b = 1  #
...`), or else the block of comment lines right above it. A config that starts from another
(configs/tiny.py runs small.py, named as a string ending in .py beside it) gets the base file's
comments for the keys it does not comment itself. Imports nothing of ours and no jax.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from typing import Any


def _comment_lines(source: str) -> tuple[dict[int, str], set[int]]:
    """({line: comment text}, the lines that hold only a comment) of a Python source."""
    comments, alone = {}, set()
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    alone = {line for line in comments if line not in code_lines}
    return comments, alone


def _target_key(node: ast.expr) -> str | None:
    """'a.b' for an assignment target `config.a.b` (any root name), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not parts:
        return None
    return ".".join(reversed(parts))


def _base_files(tree: ast.AST, path: str) -> list[str]:
    """Config files beside `path` that it names as strings ('small.py'): the configs it starts
    from."""
    here = os.path.dirname(os.path.abspath(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
            if name.endswith(".py") and os.sep not in name and "/" not in name:
                candidate = os.path.join(here, name)
                if os.path.isfile(candidate) and candidate != os.path.abspath(path):
                    found.append(candidate)
    return found


def file_comments(path: str, _seen: frozenset[str] = frozenset()) -> dict[str, str]:
    """{dotted key: comment} from a config file and the config files it starts from (its own
    comments win), in the order the keys are first assigned (the base file's first); a key
    without a comment maps to ''. An unreadable file gives {}."""
    path = os.path.abspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
        comments, alone = _comment_lines(source)
    except (OSError, SyntaxError, UnicodeDecodeError, tokenize.TokenError):
        return {}
    out: dict[str, str] = {}
    for base in _base_files(tree, path):
        if base not in _seen:
            out.update(file_comments(base, _seen | {path}))
    assignments = [n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)]
    for node in sorted(assignments, key=lambda n: n.lineno):
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        keys = [k for k in map(_target_key, targets) if k]
        if not keys:
            continue
        last = node.end_lineno or node.lineno
        inline = [comments[n] for n in range(node.lineno, last + 1) if n in comments]
        above = []
        line = node.lineno - 1
        while line in alone:
            above.insert(0, comments[line])
            line -= 1
        text = " ".join(inline or above)
        for key in keys:
            if text or key not in out:
                out[key] = text
    return out


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def describe(config: Any, config_file: str) -> str:
    """Every key of `config` (a ConfigDict, overrides applied) as `key = value  # comment`, one
    a line, in the config's order; the first line names the file."""
    path = config_file.partition(":")[0]  # config_flags' FILE:ARG
    comments = file_comments(path)
    lines = [
        f"# {config_file}: every key (override with --config.KEY=VALUE), its value, its comment"
    ]
    section = ""
    values = _flatten(config.to_dict())
    order = {key: i for i, key in enumerate(comments)}
    for key in sorted(values, key=lambda k: (order.get(k, len(order)), k)):
        value = values[key]
        here = key.rpartition(".")[0]
        if here != section:
            section = here
            if comments.get(section):  # config.model = ConfigDict()  # the discriminator
                lines.append(f"# {section}: {comments[section]}")
        comment = comments.get(key)
        lines.append(f"{key} = {value!r}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)
