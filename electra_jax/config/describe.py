"""`--print_config`: every key of a config, its value and its doc, in the schema's order.

A key's doc is its schema declaration's (pretrain_keys.py, or finetune_keys.py for the config's
family), unless the config file comments the line that sets it: a config that overrides a
default may say why (configs/tiny.py: "32 wide, 1 head"). A key's comment in a file is the one on
its assignment's line (`config.a.b = 1  # ...`), or else the block of comment lines right above
it; a config that starts from another (configs/tiny.py runs small.py, named as a string ending
in .py beside it) gets the base file's comments for the keys it does not comment itself. Imports
nothing of electra_jax but the schema, and no jax.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from typing import Any

from electra_jax.config import finetune_keys, pretrain_keys
from electra_jax.config.schema import flatten


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


def _docs(config: Any) -> tuple[list[str], dict[str, str]]:
    """(the keys in the schema's order, {key or section: doc}) of the config's table: a
    fine-tuning family's when the config names one, else pre-training's."""
    if "family" in config:
        keys = finetune_keys.TABLES.get(config.family, ())
        sections = finetune_keys.SECTIONS if keys else {}
    else:
        keys, sections = pretrain_keys.KEYS, pretrain_keys.SECTIONS
    return [k.name for k in keys], {**sections, **{k.name: k.doc for k in keys}}


def describe(config: Any, config_file: str) -> str:
    """Every key of `config` (a ConfigDict, overrides applied) as `key = value  # doc`, one a
    line, in the schema's order (keys it does not declare last, by name), each section's doc
    above its first key; the first line names the file."""
    path = config_file.partition(":")[0]  # config_flags' FILE:ARG
    order, docs = _docs(config)
    docs.update({key: text for key, text in file_comments(path).items() if text})
    lines = [
        f"# {config_file}: every key (override with --config.KEY=VALUE), its value, its comment"
    ]
    section = ""
    values = flatten(config.to_dict())
    rank = {key: i for i, key in enumerate(order)}
    for key in sorted(values, key=lambda k: (rank.get(k, len(rank)), k)):
        value = values[key]
        here = key.rpartition(".")[0]
        if here != section:
            section = here
            if docs.get(section):
                lines.append(f"# {section}: {docs[section]}")
        doc = docs.get(key)
        lines.append(f"{key} = {value!r}" + (f"  # {doc}" if doc else ""))
    return "\n".join(lines)
