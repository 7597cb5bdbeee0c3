"""jsonio: JSON files as the package writes (atomically) and reads them, and its value words."""

import json
import os

import pytest

from electra_jax import jsonio


class _Error(ValueError):
    pass


def test_a_file_is_written_whole_and_replaces_the_old_one(tmp_path):
    path = str(tmp_path / "config.json")
    jsonio.write_json(path, {"b": [1, 2], "a": {"c": None}})
    text = (tmp_path / "config.json").read_text()
    assert text == json.dumps({"a": {"c": None}, "b": [1, 2]}, indent=2, sort_keys=True) + "\n"
    jsonio.write_json(path, {"a": 1})
    assert jsonio.read_json(path, _Error) == {"a": 1}
    jsonio.write_jsonl(str(tmp_path / "rows.jsonl"), [{"step": 1}, {"step": 2}])
    assert (tmp_path / "rows.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert sorted(os.listdir(tmp_path)) == ["config.json", "rows.jsonl"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "config.json"
    jsonio.write_json(str(path), {"kept": True})
    with pytest.raises(UnicodeEncodeError):
        jsonio.write_atomic(str(path), "half written \ud800")  # fails inside the write
    assert json.loads(path.read_text()) == {"kept": True}
    (tmp_path / "folder").mkdir()
    with pytest.raises(OSError):
        jsonio.write_atomic(str(tmp_path / "folder"), "{}")  # a folder is never replaced
    assert sorted(os.listdir(tmp_path)) == ["config.json", "folder"]


def test_reading_names_the_file_and_what_to_do(tmp_path):
    path = str(tmp_path / "x.json")
    with pytest.raises(_Error, match="x.json is missing"):
        jsonio.read_json(path, _Error)
    assert jsonio.read_json(path, _Error, default={"d": 1}) == {"d": 1}
    (tmp_path / "x.json").write_text("{oops")
    with pytest.raises(_Error, match=r"x.json cannot be read \(.*\); fetch or export it again"):
        jsonio.read_json(path, _Error)
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(_Error, match="holds a JSON list, not an object \\(a config\\)"):
        jsonio.read_json_object(path, "a config", _Error)


def test_values_are_named_as_json_names_them_and_text_is_one_line():
    kinds = [jsonio.json_kind(v) for v in ({}, [], "s", True, 3, 2.5, None)]
    assert kinds == ["object", "list", "string", "boolean", "number", "number", "null"]
    assert jsonio.one_line("a\n  b\tc") == "a b c"
    assert jsonio.one_line("x" * 50, limit=10) == "xxxxxxx..."
