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
is the previous export's only when its path is one an export writes (LAYOUT, in hf/previous.py)
and its bytes are those export.json's digest records. A file in the way that is not (a user's
file, one edited since) is refused with one line, nothing changed. Exports of versions 1 and 2
recorded no digests: their files at LAYOUT's paths are taken as theirs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

from safetensors import SafetensorError

from electra_jax.errors import PretrainedError
from electra_jax.hf.electra_config import hf_config
from electra_jax.hf.names import DISCRIMINATOR, GENERATOR, NETWORKS, WEIGHTS, params_to_hf
from electra_jax.hf.previous import (
    FORMAT,
    MANIFEST,
    PARTIAL_MANIFEST,
    TMP_PREFIX,
    VERSION,
    is_tmp,
    no_link_on_the_way,
    previous_files,
)
from electra_jax.hf.tokenizer_files import write_tokenizer_files
from electra_jax.model import networks
from electra_jax.model.weights import Pretrained
from electra_jax.store import filenames, paths
from electra_jax.store.jsonio import one_line, write_advice, write_json


def _verified(out: str, previous: dict[str, set[str] | None]) -> dict[str, str]:
    """{path: sha256} of the previous export's files that are there as it wrote them: a plain
    file (no link on the way) whose digest is one its manifest records (any, for versions 1
    and 2)."""
    found = {}
    for rel, digests in previous.items():
        path = os.path.join(out, rel)
        if not no_link_on_the_way(out, rel) or os.path.islink(path) or not os.path.isfile(path):
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
    # safetensors: only on the path that uses it (an optional extra, or slow to import).
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
        if not no_link_on_the_way(out, rel) or (
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
    previous = previous_files(out)
    manifest = {"format": FORMAT, "version": VERSION, **manifest}
    created = not os.path.isdir(out)
    moving = False
    try:
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):  # left by an export that was interrupted
            if is_tmp(out, name):
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
