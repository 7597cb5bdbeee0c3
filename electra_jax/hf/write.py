"""Export: a `Pretrained` (a workdir's newest checkpoint) as a transformers ELECTRA pair.

An export D holds:
  D/discriminator/   ElectraForPreTraining: config.json, model.safetensors, tokenizer files
  D/generator/       ElectraForMaskedLM: the same files
  D/export.json      what was exported (source, step, tokenizer fingerprint), "files", the
                     relative path of every other file the export wrote, and "sha256", each
                     one's digest as written; marks D as an export
An export into an existing D writes its own files and deletes those of the previous export that
it no longer writes: anything else a user keeps in D stays untouched. What it replaces or
deletes is decided by what an export writes and can check, not by the list D hands it: a file
is the previous export's only when its path is one an export writes (LAYOUT) and its bytes are
those export.json's digest records. A file in the way that is not (a user's file, one edited
since) is refused with one line, nothing changed. Exports of versions 1 and 2 recorded no
digests: their files at LAYOUT's paths are taken as theirs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Any

from safetensors import SafetensorError

from electra_jax.data.tokenizer import MODEL_FILENAME
from electra_jax.data.wordpiece import VOCAB_FILENAME
from electra_jax.hf.electra_config import hf_config
from electra_jax.hf.names import DISCRIMINATOR, GENERATOR, NETWORKS, WEIGHTS, params_to_hf
from electra_jax.hf.tokenizer_files import write_tokenizer_files
from electra_jax.model import networks
from electra_jax.model.weights import Pretrained, PretrainedError
from electra_jax.store import filenames, jsonio, paths
from electra_jax.store.jsonio import json_kind, one_line, write_advice, write_json

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
    WEIGHTS,
    filenames.HF_TOKENIZER_FILE,
    filenames.HF_TOKENIZER_CONFIG_FILE,
    filenames.HF_SPECIAL_TOKENS_FILE,
    MODEL_FILENAME,
    VOCAB_FILENAME,
)
# The files exports of version 1 wrote (their export.json lists none): only these are replaced.
V1_FILES = tuple(f"{network}/{name}" for network in NETWORKS for name in _FILE_NAMES)
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


def _is_tmp(out: str, name: str) -> bool:
    path = os.path.join(out, name)
    return name.startswith(TMP_PREFIX) and os.path.isdir(path) and not os.path.islink(path)


def _no_link_on_the_way(out: str, rel: str) -> bool:
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


def _previous(out: str) -> dict[str, set[str] | None]:
    """The previous export's files at OUT ({} when OUT is missing or empty), as _manifest_files
    gives them.

    Raises:
      PretrainedError: OUT is a file, or a folder that holds anything but no export.json of ours.
    """
    if not os.path.lexists(out):
        return {}
    if not os.path.isdir(out):
        raise PretrainedError(f"--out {out} is a file; choose a directory path")
    names = [n for n in os.listdir(out) if not _is_tmp(out, n)]
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


def check_out(out: str) -> list[str]:
    """The files of the previous export at OUT that a new export may replace or delete ([] when
    OUT is missing or empty): an export replaces only what an export wrote.

    Raises:
      PretrainedError: OUT is a file, or a folder that holds anything but no export.json of ours.
    """
    return sorted(_previous(out))


def _verified(out: str, previous: dict[str, set[str] | None]) -> dict[str, str]:
    """{path: sha256} of the previous export's files that are there as it wrote them: a plain
    file (no link on the way) whose digest is one its manifest records (any, for versions 1
    and 2)."""
    found = {}
    for rel, digests in previous.items():
        path = os.path.join(out, rel)
        if not _no_link_on_the_way(out, rel) or os.path.islink(path) or not os.path.isfile(path):
            continue
        digest = paths.sha256_of_file(path)
        if digests is None or digest in digests:
            found[rel] = digest
    return found


def _files_below(folder: str) -> list[str]:
    """Every file under `folder`, as sorted '/'-separated relative paths."""
    found = []
    for root, _, names in os.walk(folder):
        rel = os.path.relpath(root, folder)
        found += [name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}" for name in names]
    return sorted(found)


def _write_networks(pretrained: Pretrained, folder: str) -> None:
    """FOLDER/discriminator and FOLDER/generator."""
    from safetensors.numpy import save_file

    spec, tokenizer = pretrained.spec, pretrained.tokenizer
    tensors = params_to_hf(pretrained.params, spec)
    for network in NETWORKS:
        sub = os.path.join(folder, network)
        os.makedirs(sub)
        write_json(
            os.path.join(sub, filenames.CONFIG_FILE), hf_config(spec, network, tokenizer.pad_id)
        )
        # "pt" is what transformers expects in the metadata of a PyTorch-loadable file.
        save_file(tensors[network], os.path.join(sub, WEIGHTS), metadata={"format": "pt"})
        write_tokenizer_files(tokenizer, sub, spec.max_position_embeddings)


def _move_into_place(out: str, tmp: str, previous: dict[str, set[str] | None], files: dict):
    """Renames each file of TMP (a new export, its manifest included; `files`: {path: sha256})
    into OUT, deletes the files of the previous export that the new one does not write, and
    leaves all else alone.

    Every file is replaced by one os.replace, so each is whole, old or new; export.json, written
    last, says the export is complete. Until then PARTIAL_MANIFEST lists both exports' files
    with the digests each may have. A file in the way that is not the previous export's as it
    wrote it (see `_verified`) is refused before anything is changed.
    """
    ours = _verified(out, previous)
    for rel in files:
        target = os.path.join(out, rel)
        if not _no_link_on_the_way(out, rel) or (
            os.path.isdir(target) and not os.path.islink(target)
        ):
            raise PretrainedError(
                f"--out {out}: {rel} cannot be written (a folder, a file or a link stands in its "
                "way); move that away or choose another --out (nothing was changed)"
            )
        if os.path.lexists(target) and rel not in ours:
            raise PretrainedError(
                f"--out {out}: {rel} is there but is not the file the previous export wrote "
                f"(changed since, a link, or never written by an export: its {MANIFEST} cannot "
                "vouch for it); move it away or choose another --out (nothing was changed)"
            )
    digests = {rel: sorted({d for d in (ours.get(rel), files.get(rel)) if d}) for rel in ours}
    digests.update({rel: sorted({d, *digests.get(rel, [])}) for rel, d in files.items()})
    partial = {"format": FORMAT, "version": VERSION, "files": sorted(digests), "sha256": digests}
    write_json(os.path.join(tmp, PARTIAL_MANIFEST), partial)
    os.replace(os.path.join(tmp, PARTIAL_MANIFEST), os.path.join(out, PARTIAL_MANIFEST))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out, MANIFEST))
    for rel in files:
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(tmp, rel), target)
    for rel in sorted(set(ours) - set(files)):
        target = os.path.join(out, rel)
        os.remove(target)
        parent = os.path.dirname(target)
        while parent != out and not os.listdir(parent):  # folders only it filled
            os.rmdir(parent)
            parent = os.path.dirname(parent)
    os.replace(os.path.join(tmp, MANIFEST), os.path.join(out, MANIFEST))
    os.remove(os.path.join(out, PARTIAL_MANIFEST))


def write_export(pretrained: Pretrained, out: str, readme: str | None = None) -> dict:
    """Writes OUT/discriminator, OUT/generator, OUT/README.md (`readme`, the model card, when
    given) and OUT/export.json; returns the manifest.

    OUT may be missing, empty, or a previous export; anything else is refused. The export is
    written into a hidden folder inside OUT, then each file is renamed into place, so every file
    is whole. Of a previous export only the files it wrote (its manifest lists them) are replaced
    or deleted: whatever else the user keeps in OUT stays as it is.
    """
    counts = networks.network_param_counts(pretrained.params)
    manifest = {
        "source": pretrained.source,
        "tokenizer_fingerprint": pretrained.tokenizer.fingerprint,
        # Import reads one shared block (the discriminator's): a generator trained with its own
        # tables ('gdes', 'none') then computes with the discriminator's, with a warning.
        "embedding_sharing": pretrained.spec.embedding_sharing,
        "discriminator_params": counts[DISCRIMINATOR],
        "generator_params": counts[GENERATOR],
    }

    def write(folder: str) -> None:
        _write_networks(pretrained, folder)
        if readme is not None:
            with open(os.path.join(folder, filenames.README_FILE), "w", encoding="utf-8") as f:
                f.write(readme)

    return write_folder(out, manifest, write)


def write_folder(out: str, manifest: dict, write) -> dict:
    """OUT gets the files `write(folder)` writes into an empty folder, and OUT/export.json, the
    manifest (with format, version and the list of files added); returns the manifest.

    The export and replace rules of write_export: OUT may be missing, empty or a previous export;
    files are renamed into place one by one; a previous export's files that this one does not
    write are deleted, anything else in OUT stays.
    """
    out = os.path.abspath(out)
    previous = _previous(out)
    manifest = {"format": FORMAT, "version": VERSION, **manifest}
    created = not os.path.isdir(out)
    moving = False
    try:
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):  # left by an export that was interrupted
            if _is_tmp(out, name):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=out)
        try:
            try:
                write(tmp)
            except SafetensorError as e:  # an OSError (a full disk) in safetensors' own type
                raise _os_error(e) from e
            written = {
                rel: paths.sha256_of_file(os.path.join(tmp, rel)) for rel in _files_below(tmp)
            }
            manifest["files"], manifest["sha256"] = sorted(written), written
            write_json(os.path.join(tmp, MANIFEST), manifest)
            moving = True
            _move_into_place(out, tmp, previous, written)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if created and not os.listdir(out):
                os.rmdir(out)
    except OSError as e:
        if moving:
            kept = "part of the new export is in place: run the same command to finish it"
        elif previous:
            kept = "the previous export there is intact"
        else:
            kept = "nothing was written there"
        reason = e.strerror or one_line(e, 200)
        raise PretrainedError(
            f"cannot write the export to {out} ({reason}); {kept}: {write_advice(e)}, then "
            "export again"
        ) from None
    return manifest


def _os_error(error: Exception) -> OSError:
    """The OSError a SafetensorError reports ('... I/O error: File too large (os error 27)')."""
    found = re.search(r"os error (\d+)", str(error))
    code = int(found.group(1)) if found else None
    return OSError(code, os.strerror(code) if code else one_line(error, 200))
