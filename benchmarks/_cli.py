"""What the benchmarks' command lines share with the package's commands (electra_jax/cli.py):
bad input is one `error:` line naming the flag or file and what to do, exit code 2, no traceback
unless --verbose, and it is found before any expensive work (compiling, training) starts."""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import runpy
import sys

from electra_jax import cli
from electra_jax.config import pretrain_keys, schema


class Parser(argparse.ArgumentParser):
    """argparse, with its usage-and-error answer to a bad flag as `cli.fail`'s one line, and
    --verbose (a failure keeps its traceback)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--verbose", action="store_true", help="keep a failure's traceback")

    def error(self, message: str) -> None:
        cli.fail(f"{message} (see --help)")

    def parse_known_args(self, args=None, namespace=None):
        # argparse takes a repeated flag's later value without a word; the commands refuse it
        # (strict_settings.repeated_flag), and so do the benchmarks. Flags that collect their
        # values (--set, action='append') may repeat.
        argv = sys.argv[1:] if args is None else list(args)
        seen: dict[str, str] = {}
        for arg in argv:
            if arg == "--":
                break
            action = self._option_string_actions.get(arg.split("=", 1)[0])
            if action is None or isinstance(action, argparse._AppendAction):
                continue
            if action.dest in seen:
                self.error(
                    f"{arg.split('=', 1)[0]} is given twice (as {seen[action.dest]} and {arg})"
                )
            seen[action.dest] = arg
        return super().parse_known_args(args, namespace)


def _number(kind, low: float, words: str):
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}; give {words}") from None
        if not value >= low or value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {words}")
        return value

    return parse


positive_int = _number(int, 1, "a whole number >= 1")
natural_int = _number(int, 0, "a whole number >= 0")
positive_float = _number(float, sys.float_info.min, "a finite number > 0")
natural_float = _number(float, 0.0, "a finite number >= 0")


def names(flag: str, value: str, known, what: str) -> list[str]:
    """The comma-separated `value` of `flag`, each one of `known`; one line naming the unknown
    ones and what is known otherwise."""
    got = cli.each_once(flag, [v for v in value.split(",") if v])
    unknown = [v for v in got if v not in known]
    if unknown or not got:
        which = f"unknown {what} {', '.join(unknown)}" if unknown else f"no {what}"
        cli.fail(f"{flag} {value!r}: {which}; use some of {', '.join(known)}")
    return got


def given(flag: str, value, what: str):
    """`value`; one line when the flag was not given (None): an input the repository does not
    hold, such as a corpus or GLUE's files, has no default that could point at one machine's
    folders."""
    if value is None:
        cli.fail(f"{flag} is missing; give {what}")
    return value


def directory(flag: str, path: str | None, what: str) -> str:
    """`path`, a folder; one line otherwise (also when it was not given)."""
    if not os.path.isdir(given(flag, path, what)):
        state = "is not a folder" if os.path.exists(path) else "does not exist"
        cli.fail(f"{flag} {path} {state}; give {what}")
    return path


def file(flag: str, path: str, what: str) -> str:
    """`path`, a file; one line otherwise."""
    if not os.path.isfile(path):
        state = "is not a file" if os.path.exists(path) else "does not exist"
        cli.fail(f"{flag} {path} {state}; give {what}")
    return path


def matches(flag: str, pattern: str | None, what: str) -> list[str]:
    """The files `pattern` names (a glob); one line when none (or it was not given)."""
    found = sorted(p for p in glob.glob(given(flag, pattern, what)) if os.path.isfile(p))
    if not found:
        cli.fail(f"{flag} {pattern} matches no file; give {what}")
    return found


def config(flag: str, path: str):
    """The ConfigDict of the pre-training config file `path` (its get_config()); one line when
    the file is missing, does not run, gives no ConfigDict or a fine-tuning config (the
    benchmarks that take --config time or read pre-training)."""
    import ml_collections

    file(flag, path, "a config file such as configs/tiny.py")
    with failures(f"{flag} {path}", also=(Exception,)):  # the user's file runs here
        get_config = runpy.run_path(path).get("get_config")
        if get_config is None:
            cli.fail(f"{flag} {path} has no get_config() function (see configs/tiny.py)")
        value = get_config()
    if not isinstance(value, ml_collections.ConfigDict):
        cli.fail(f"{flag} {path}: get_config() returned {type(value).__name__}, not a ConfigDict")
    cli.check_family(value, path, os.path.basename(sys.argv[0]), finetuning=False)
    return value


def glue_tasks(flag: str, value: str) -> list[str]:
    """The GLUE tasks the comma-separated `value` names, by their names ('sst2' is SST-2); one
    line naming an unknown one and the known ones."""
    from electra_jax.errors import DataError
    from electra_jax.finetune import tasks

    found = []
    for name in [v for v in value.split(",") if v] or [""]:
        try:
            found.append(tasks.get_task(name).name)
        except DataError:
            cli.fail(f"{flag} {value!r}: {name!r} is not a GLUE task; use {', '.join(tasks.TASKS)}")
    given = [v for v in value.split(",") if v]
    # sst2 and SST-2 are one task: the check is on the names they resolve to.
    cli.each_once(flag, given, key=lambda name: tasks.get_task(name).name)
    return found


# A list flag names each thing once (cli.each_once's rule), in the benchmarks as in the commands.
each_once = cli.each_once


def settings(flag: str, items: list[str]) -> list[str]:
    """A repeatable `KEY=VALUE` flag's items, each key set once (the later one would win)."""
    return each_once(flag, items, key=lambda item: item.partition("=")[0].strip())


DTYPES = schema.by_name(pretrain_keys.KEYS)["model.dtype"].rule  # the choices of model.dtype


def set_field(flag: str, config, item: str, sections: bool) -> None:
    """Applies `KEY=VALUE` (`SECTION.KEY=VALUE` when `sections`) to `config`, the value parsed
    as the field's type; one line for an unknown key or a value of another type."""
    key, eq, value = item.partition("=")
    path = key.split(".")
    if not eq or len(path) != (2 if sections else 1):
        form = "SECTION.KEY=VALUE" if sections else "KEY=VALUE"
        cli.fail(f"{flag} {item!r}: give {form}")
    node = config
    for part in path[:-1]:
        node = node.get(part) if hasattr(node, "get") else None
    if not hasattr(node, "keys") or path[-1] not in node:
        cli.fail(f"{flag} {item!r}: {key} is not a config key")
    current = node[path[-1]]
    if isinstance(current, bool):  # bool("False") is True
        if value not in ("True", "False"):
            cli.fail(f"{flag} {item!r}: use True or False")
        node[path[-1]] = value == "True"
    elif isinstance(current, (int, float)):
        try:
            node[path[-1]] = type(current)(value)
        except ValueError:
            cli.fail(f"{flag} {item!r}: {key} takes {type(current).__name__} values")
    else:
        node[path[-1]] = value


def checked(config) -> None:
    """validate.check_config, before the work: its line names the config key (the flags set
    data.source, train.batch_size, data.seq_length)."""
    from electra_jax import validate

    with failures(""):
        validate.check_config(config)


def drew(fig) -> bool:
    """Whether any panel of the matplotlib figure `fig` holds a line, band, bar or image."""
    return any(ax.has_data() for ax in fig.axes)


def legend(ax, **options) -> None:
    """A legend on `ax` when something on it is labelled (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)


def save_figure(fig, path: str, drawn: bool | None = None, **savefig) -> None:
    """Writes `fig` to `path` (atomically: a reader never sees half a PNG) and closes it; a
    figure with nothing drawn (`drawn`, by default `drew(fig)`) is one line and exit 2
    instead: an empty plot would read as a result. `savefig`: matplotlib's options (dpi)."""
    import matplotlib.pyplot as plt

    drawn = drew(fig) if drawn is None else drawn
    if not drawn:
        plt.close(fig)
        cli.fail(
            f"{path}: nothing to plot (none of the runs read has the values this plot draws: "
            "none finished, or none logged them); nothing was written"
        )
    root, ext = os.path.splitext(path)
    tmp = f"{root}.tmp-{os.getpid()}{ext}"
    try:
        fig.savefig(tmp, format=ext[1:] or "png", **savefig)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def run(main, *args) -> None:
    """A benchmark's entry point: `main(*args)`, with the package's bad-input errors (as
    `failures` names them), wherever below it they are raised, as their one line, exit 2."""
    with failures(""):
        main(*args)


@contextlib.contextmanager
def failures(where: str, also: tuple = ()):
    """The block's bad-input errors (the package's ConfigError, DataError, PretrainedError and
    WorkdirFileError, and the classes in `also`) as one line starting with `where`; a
    traceback with --verbose."""
    from electra_jax.errors import ConfigError, DataError

    try:
        yield
    except Exception as e:
        # PretrainedError's module imports flax; importing it here would cost a refusal of a
        # bad flag seconds. One of its errors can only exist once that module is loaded.
        weights = sys.modules.get("electra_jax.model.weights")
        pretrained = (weights.PretrainedError,) if weights else ()
        # And a run's file that the run cannot have written (store/workdir_files.py).
        files = sys.modules.get("electra_jax.store.workdir_files")
        workdir_files = (files.WorkdirFileError,) if files else ()
        if (
            not isinstance(e, (ConfigError, DataError, *pretrained, *workdir_files, *also))
            or "--verbose" in sys.argv
        ):
            raise
        reason = " ".join(str(e).split()) or type(e).__name__
        cli.fail(f"{where}: {reason}" if where else reason)
