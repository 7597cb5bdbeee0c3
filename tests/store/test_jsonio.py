"""jsonio: JSON files as the package writes (atomically) and reads them, and its value words."""

import json
import os

import pytest

from electra_jax.store import jsonio
from tests.conftest import error_line, run_command


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
    for encoding, name in (("utf-16", "UTF-16"), ("utf-32", "UTF-32")):
        (tmp_path / "x.json").write_text('{"a": 1}', encoding=encoding)
        with pytest.raises(_Error, match=f"it is {name} text .its byte-order mark., not UTF-8"):
            jsonio.read_json(path, _Error)
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(_Error, match="holds a JSON list, not an object \\(a config\\)"):
        jsonio.read_json_object(path, "a config", _Error)


def test_values_are_named_as_json_names_them_and_text_is_one_line():
    kinds = [jsonio.json_kind(v) for v in ({}, [], "s", True, 3, 2.5, None)]
    assert kinds == ["object", "list", "string", "boolean", "number", "number", "null"]
    assert jsonio.one_line("a\n  b\tc") == "a b c"
    assert jsonio.one_line("x" * 50, limit=10) == "xxxxxxx..."


DEEP = "[" * 50_000 + "]" * 50_000  # past the parser's recursion limit


def test_json_nested_too_deep_is_a_value_error_like_malformed_json(tmp_path):
    assert jsonio.loads("[" * jsonio.MAX_DEPTH + "]" * jsonio.MAX_DEPTH) is not None
    for text in (DEEP, '{"a": ' * 5_000 + "1" + "}" * 5_000, "[" * 101 + "]" * 101):
        with pytest.raises(ValueError, match="nested more than 100"):
            jsonio.loads(text)
    (tmp_path / "x.json").write_text(DEEP)
    with pytest.raises(_Error, match=r"x.json cannot be read \(JSON nested more than 100"):
        jsonio.read_json(str(tmp_path / "x.json"), _Error)


def _deep_object() -> str:
    return '{"data": ' + DEEP + "}"


@pytest.mark.parametrize("where", ["squad", "hf_config", "workdir_config"])
def test_deep_json_through_the_commands_is_one_line_naming_the_file(tmp_path, where):
    """A SQuAD file, a transformers config.json, a workdir's config.json: each read by the
    command a user runs, each one `error:` line naming the file, never a RecursionError."""
    args = [f"--workdir={tmp_path / 'run'}"]
    if where == "squad":
        bad = tmp_path / "squad" / "train-v1.1.json"
        bad.parent.mkdir()
        bad.write_text(_deep_object())
        (bad.parent / "dev-v1.1.json").write_text(_deep_object())
        args += ["--config=configs/squad.py", f"--config.data_dir={bad.parent}"]
    else:
        bad = tmp_path / "model" / ("discriminator" if where == "hf_config" else "") / "config.json"
        bad.parent.mkdir(parents=True)
        bad.write_text(_deep_object())
        glue = tmp_path / "SST-2"
        glue.mkdir()
        for name in ("train.tsv", "dev.tsv"):
            (glue / name).write_text("sentence\tlabel\nthe river\t1\nthe king\t0\n")
        args += [
            "--config=configs/glue.py",
            f"--config.data_dir={glue}",
            f"--config.init_from={tmp_path / 'model'}",
        ]
    out = run_command("electra_jax.finetune", *args)
    last = error_line(out)
    assert "RecursionError" not in out.stderr, out.stderr
    assert last.startswith("error: ") and f"{bad} " in last and "nested more than" in last, last
