"""hf/previous.py: what an export folder's manifest says is ours."""

import json

from electra_jax.hf import previous


def test_the_paths_a_manifest_lists_that_no_export_writes(tmp_path):
    """An export.json of ours that lists a user's file: named, so the export can say it leaves
    it as it is (a folder is ours only for the files we wrote)."""
    assert previous.listed_not_ours(str(tmp_path)) == []  # no manifest
    manifest = {
        "format": previous.FORMAT,
        "version": 2,
        "files": ["README.md", "notes/mine.txt", "discriminator/config.json", "a.txt", 3],
    }
    (tmp_path / "export.json").write_text(json.dumps(manifest))
    assert previous.listed_not_ours(str(tmp_path)) == ["a.txt", "notes/mine.txt"]
    (tmp_path / "export.json").write_text("[1]")
    assert previous.listed_not_ours(str(tmp_path)) == []
