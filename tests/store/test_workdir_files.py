"""The one reader of the files a run writes into its workdir: whatever stands at a file's name,
one WorkdirFileError naming the file (and line) and what to do; never a wait on a FIFO."""

import json
import os

import pytest

from electra_jax import goodput
from electra_jax.store import paths, workdir_files
from electra_jax.store.workdir_files import WorkdirFileError


def _file(tmp_path, text: str | bytes):
    path = tmp_path / "metrics.jsonl"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return str(path)


def test_every_commands_one_line_meets_it():
    """A ConfigError: train, prepare, finetune (a pre-training workdir's metrics.jsonl read for
    its init_from's record), evaluate and the benchmarks end it in their one line."""
    from electra_jax.errors import ConfigError

    assert issubclass(WorkdirFileError, ConfigError)


def test_rows_as_the_run_wrote_them_and_a_torn_last_line_dropped(tmp_path):
    path = _file(tmp_path, '{"step": 1, "loss": NaN}\n\n{"step": 2}\n{"step": 3, "lo')
    rows = workdir_files.read_rows(path, by_step=True)
    assert [r["step"] for r in rows] == [1, 2]  # NaN stays a value: a skipped update logs it
    assert workdir_files.read_rows(str(tmp_path / "absent.jsonl")) == []


@pytest.mark.parametrize(
    "text, says",
    [
        ('[1, 2]\n{"step": 1}\n', "line 1 is a JSON list, not a row of the run"),
        ('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n', "line 2 is not JSON"),
        ('{"loss": 1.0}\n', "line 1 has no step"),
        ('{"step": "4"}\n', "line 1 has step '4', not a step number"),
        ('{"step": true}\n', "line 1 has step True"),
        ('{"step": -1}\n', "line 1 has step -1"),
        (b'{"step": 1, "x": "\xff"}\n', "is not UTF-8 text"),
        (b'\xff\xfe{\x00"\x00', "it is UTF-16 text"),
    ],
)
def test_what_the_run_cannot_have_written_is_named_with_its_line(tmp_path, text, says):
    path = _file(tmp_path, text)
    with pytest.raises(WorkdirFileError, match="move it away") as e:
        workdir_files.read_rows(path, by_step=True)
    assert says in str(e.value) and path in str(e.value)


def test_a_number_column_that_is_none_is_named(tmp_path):
    path = _file(tmp_path, '{"step": 1, "wall_sec": "x"}\n')
    with pytest.raises(WorkdirFileError, match="line 1: wall_sec is 'x', not a finite number"):
        workdir_files.read_rows(path, numbers=("wall_sec",))
    path = _file(tmp_path, '{"step": 1, "wall_sec": Infinity}\n')
    with pytest.raises(WorkdirFileError, match="wall_sec is inf"):
        workdir_files.read_rows(path, numbers=("wall_sec",))


def test_a_folder_a_fifo_or_a_socket_of_the_name_is_refused_at_once(tmp_path):
    folder = tmp_path / "a" / "metrics.jsonl"
    folder.mkdir(parents=True)
    fifo = tmp_path / "b.jsonl"
    os.mkfifo(fifo)  # no writer: a plain open() would wait forever
    for path, kind in ((folder, "is a folder"), (fifo, r"is a named pipe \(FIFO\)")):
        with pytest.raises(WorkdirFileError, match=kind):
            workdir_files.read_rows(str(path))
        with pytest.raises(paths.NotAFile):
            paths.read_text(str(path))  # every reader of a whole file: jsonio.read_json too


@pytest.mark.parametrize(
    "rows, says",
    [
        ([{"step": 1, "wall_sec": 0.0, "productive_sec": 0.0, "goodput": 0.0}], "wall_sec 0.0"),
        ([{"step": 1, "wall_sec": 5.0}], "has wall_sec but no productive_sec"),
        ([{"step": 1, "wall_sec": 5.0, "productive_sec": 1.0, "goodput": 0.2, "eval_sec": "x"}],
         "eval_sec is 'x'"),
    ],
)  # fmt: skip
def test_goodput_names_a_row_it_cannot_report_on(tmp_path, capsys, rows, says):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert goodput.main([str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: ") and "\n" not in line and says in line, line


def test_goodput_of_a_fifo_answers_at_once(tmp_path, capsys):
    os.mkfifo(tmp_path / "metrics.jsonl")
    assert goodput.main([str(tmp_path)]) == 2
    assert "is a named pipe (FIFO)" in capsys.readouterr().err
