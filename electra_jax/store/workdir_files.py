"""The one defensive reader of the files a run writes into its workdir (metrics.jsonl, eval.jsonl,
commands.jsonl, config_changes.jsonl, ...), for every command that reads them back.

A workdir file may be anything by the time it is read: a folder or a FIFO of that name, a byte
that is not UTF-8, a row that is a JSON list, a field missing or of another type, a file cut
short by a killed run. Each is one WorkdirFileError naming the file (and the line) and what to
do, never a traceback from deep inside the reader's caller, and never a wait on a FIFO
(paths.read_bytes opens without blocking and refuses what is not a regular file).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from electra_jax.errors import ConfigError
from electra_jax.store import jsonio, paths


class WorkdirFileError(ConfigError):
    """A workdir file that cannot be what the run wrote (one line naming it and what to do). A
    ConfigError, so that every command's one line for bad input (train, prepare, finetune,
    evaluate, the benchmarks) meets it wherever it is read, a fine-tuning's init_from's
    metrics.jsonl included."""


AWAY = "move it away (or restore the run's own file from a copy)"


def read_text(path: str, error: type[Exception] = WorkdirFileError) -> str | None:
    """The UTF-8 text of the workdir file `path`, or None when it is absent.

    Raises:
      error: a folder, FIFO, socket or device of that name, an unreadable file, or bytes that
        are not UTF-8; the message names the file and what to do.
    """
    try:
        data = paths.read_bytes(path)
    except FileNotFoundError:
        return None
    except paths.NotAFile as e:
        raise error(f"{path} is {e.kind}, not the file the run writes there; {AWAY}") from None
    except OSError as e:
        raise error(
            f"{path} cannot be read ({e.strerror or jsonio.one_line(e, 200)}); check its "
            "permissions and the storage"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path} cannot be read: {jsonio.text_problem(e)}; {AWAY}") from None


def read_rows(
    path: str,
    error: type[Exception] = WorkdirFileError,
    numbers: Iterable[str] = (),
    by_step: bool = False,
) -> list[dict]:
    """The rows of a JSON-lines workdir file ([] when it is absent).

    A last line cut short (no newline after it: a run killed while appending) is dropped, as the
    run that resumes drops it. Any other line that is not a JSON object, and a row whose
    `numbers` fields (those present) are not finite numbers, is refused, naming the line: read
    on, it would fail later in words that name neither file nor line. `by_step`: every row
    must hold its `step`, a whole number >= 0 (the rows of metrics.jsonl, eval.jsonl,
    commands.jsonl and config_changes.jsonl are keyed by it).

    Raises:
      error: see read_text, and the rows above.
    """
    text = read_text(path, error)
    if text is None:
        return []
    lines = text.splitlines(keepends=True)
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = jsonio.loads(line)
        except ValueError as e:
            if number == len(lines) and not line.endswith("\n"):
                break  # half-written by a run killed while appending: dropped, as on resume
            raise error(
                f"{path} line {number} is not JSON ({jsonio.one_line(e, 120)}); {AWAY}"
            ) from None
        if not isinstance(row, dict):
            raise error(
                f"{path} line {number} is a JSON {jsonio.json_kind(row)}, not a row of the run "
                f"(an object); {AWAY}"
            )
        step = row.get("step")
        if by_step and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
            got = "no step" if step is None else f"step {jsonio.one_line(repr(step), 40)}"
            raise error(
                f"{path} line {number} has {got}, not a step number (a whole number >= 0); {AWAY}"
            )
        for field in numbers:
            value = row.get(field)
            if value is not None and not _finite_number(value):
                raise error(
                    f"{path} line {number}: {field} is {jsonio.one_line(repr(value), 60)}, not a "
                    f"finite number; {AWAY}"
                )
        rows.append(row)
    return rows


def _finite_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def require(rows: list[dict], path: str, fields: Iterable[str], error=WorkdirFileError) -> None:
    """`error` naming the first row of `rows` (read from `path`) that lacks one of `fields`."""
    for i, row in enumerate(rows):
        missing = [f for f in fields if row.get(f) is None]
        if missing:
            raise error(
                f"{path}: row {i + 1} (step {row.get('step', '?')}) has no "
                f"{', '.join(missing)}; {AWAY}"
            )
