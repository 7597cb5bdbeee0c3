"""What an export folder holds before an export writes into it: the paths an export writes
(LAYOUT), its manifest (export.json) and `check_out`, the files of a previous export that a new
one may replace. Without jax or flax, so that the export command refuses a bad --out before it
imports them; hf/write.py writes by these rules (its docstring says how an export replaces
another).
"""

from __future__ import annotations

import os
from typing import Any

from electra_jax.data.tokenizer import MODEL_FILENAME
from electra_jax.data.wordpiece import VOCAB_FILENAME
from electra_jax.errors import PretrainedError
from electra_jax.store import filenames, jsonio
from electra_jax.store.jsonio import json_kind, one_line

MANIFEST = filenames.EXPORT_MANIFEST
# Version 3: export.json records each file's sha256.
FORMAT, VERSION = "electra_jax.export", 3
# While one export replaces another, the union of both file lists waits here (hidden) in place of
# export.json, so that a folder a crash leaves half replaced is still recognised as ours, with
# every file either export wrote, and the next export finishes the job.
PARTIAL_MANIFEST = ".export.json.partial"
# Hidden folders in OUT where an export is written before each file is renamed into place.
TMP_PREFIX = ".electra_jax-export-"
_FILE_NAMES = (
    filenames.CONFIG_FILE,
    filenames.WEIGHTS_FILE,
    filenames.HF_TOKENIZER_FILE,
    filenames.HF_TOKENIZER_CONFIG_FILE,
    filenames.HF_SPECIAL_TOKENS_FILE,
    MODEL_FILENAME,
    VOCAB_FILENAME,
)
# The files exports of version 1 wrote (their export.json lists none): only these are replaced.
V1_FILES = tuple(
    f"{network}/{name}" for network in filenames.EXPORT_NETWORKS for name in _FILE_NAMES
)
# Every path an export of any version writes: a pre-training's per network, a fine-tuning's at
# the top with its README.md. Nothing else in OUT is replaced or deleted, whatever a manifest
# lists.
LAYOUT = frozenset({*V1_FILES, *_FILE_NAMES, filenames.README_FILE})


def _relative_file(rel: Any) -> bool:
    """Whether a manifest entry is a path inside the export: '/'-separated parts, none empty,
    '..' or hidden, so not absolute either."""
    if not isinstance(rel, str) or "\\" in rel or "\0" in rel:
        return False
    return all(part and not part.startswith(".") for part in rel.split("/"))


def is_tmp(out: str, name: str) -> bool:
    path = os.path.join(out, name)
    return name.startswith(TMP_PREFIX) and os.path.isdir(path) and not os.path.islink(path)


def no_link_on_the_way(out: str, rel: str) -> bool:
    """Whether every folder between OUT and OUT/rel is a real folder (or absent), so that writing
    or deleting OUT/rel stays inside OUT."""
    parent = out
    for part in rel.split("/")[:-1]:
        parent = os.path.join(parent, part)
        if os.path.islink(parent) or (os.path.lexists(parent) and not os.path.isdir(parent)):
            return False
    return True


def _manifest_files(out: str, name: str) -> dict[str, set[str] | None]:
    """The files the manifest OUT/name says an export wrote, at LAYOUT's paths, each with the
    digests it may have (None: an export of version 1 or 2, which recorded none);
    PretrainedError unless the manifest is ours."""
    path = os.path.join(out, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = jsonio.loads(f.read())
    except (OSError, ValueError):
        raise PretrainedError(
            f"--out {out}: its {name} is not JSON, so the folder is not an electra_jax export; "
            "choose another --out (nothing was changed)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        what = f"format {data.get('format')!r}" if isinstance(data, dict) else json_kind(data)
        raise PretrainedError(
            f"--out {out}: its {name} was not written by electra_jax (a JSON "
            f"{one_line(what, 60)}); choose another --out (nothing was changed)"
        )
    if "files" not in data:  # version 1: the layout it wrote, as far as it is there
        return {rel: None for rel in V1_FILES if os.path.lexists(os.path.join(out, rel))}
    files = data["files"]
    if not isinstance(files, list):
        raise PretrainedError(
            f"{path}: files is a JSON {json_kind(files)}, not a list of paths inside the export; "
            "choose another --out (nothing was changed)"
        )
    for rel in files:
        if not _relative_file(rel):
            raise PretrainedError(
                f"{path}: files lists {one_line(repr(rel), 80)}, which is not a path inside the "
                "export; choose another --out (nothing was changed)"
            )
    digests = data.get("sha256")
    if digests is None and data.get("version", 1) < 3:
        return {rel: None for rel in files if rel in LAYOUT}
    out_files: dict[str, set[str] | None] = {}
    for rel in files:
        found = digests.get(rel) if isinstance(digests, dict) else None
        found = [found] if isinstance(found, str) else found
        if not (isinstance(found, list) and found and all(isinstance(d, str) for d in found)):
            raise PretrainedError(
                f"{path}: its sha256 gives no digest for {one_line(repr(rel), 80)}, so the file "
                "cannot be checked as the export's; choose another --out (nothing was changed)"
            )
        if rel in LAYOUT:
            out_files[rel] = set(found)
    return out_files


def previous_files(out: str) -> dict[str, set[str] | None]:
    """The previous export's files at OUT ({} when OUT is missing or empty), as _manifest_files
    gives them.

    Raises:
      PretrainedError: OUT is a file, or a folder that holds anything but no export.json of ours.
    """
    if not os.path.lexists(out):
        return {}
    if not os.path.isdir(out):
        raise PretrainedError(f"--out {out} is a file; choose a directory path")
    names = [n for n in os.listdir(out) if not is_tmp(out, n)]
    manifests = [n for n in (MANIFEST, PARTIAL_MANIFEST) if n in names]
    if not manifests and names:
        raise PretrainedError(
            f"--out {out} exists and is not an electra_jax export (no {MANIFEST}); choose "
            "another --out or empty it"
        )
    files: dict[str, set[str] | None] = {}
    for name in manifests:
        for rel, digests in _manifest_files(out, name).items():
            if digests is None or files.get(rel, set()) is None:
                files[rel] = None
            else:
                files[rel] = files.get(rel, set()) | digests
    return files


def listed_not_ours(out: str) -> list[str]:
    """The paths OUT's manifest lists that no export writes (outside LAYOUT): another program's
    or a user's, which an export never replaces or deletes, whatever a manifest says; [] when
    there is no manifest or it lists none. Call after check_out (the manifest is ours)."""
    path = os.path.join(out, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            files = jsonio.loads(f.read()).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    return sorted(rel for rel in files or () if isinstance(rel, str) and rel not in LAYOUT)


def check_out(out: str) -> list[str]:
    """The files of the previous export at OUT that a new export may replace or delete ([] when
    OUT is missing or empty): an export replaces only what an export wrote.

    Raises:
      PretrainedError: OUT is a file, or a folder that holds anything but no export.json of ours.
    """
    return sorted(previous_files(out))
