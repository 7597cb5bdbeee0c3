"""What every command-line entry point shares: flag errors and failures as one line, exit 2."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import os
import re
import runpy
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import ml_collections
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from electra_jax import strict_settings
from electra_jax.config import describe, finetune_keys, pretrain_keys, schema
from electra_jax.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteError,
    Preempted,
)
from electra_jax.pretraining import topology
from electra_jax.store import deadline, environment, jsonio
from electra_jax.store.paths import LinkRefused

T = TypeVar("T")

# orbax's warnings on opening checkpoints read-only, which is what reading a run's weights is
# meant to do (pretrained.py, evaluate.py): they say nothing the user can act on.
_READ_ONLY_NOTICES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


def _not_read_only_notice(record) -> bool:
    return not record.getMessage().startswith(_READ_ONLY_NOTICES)


# gcsfs's echoes of what it then raises or works around, printed (a traceback among them) before
# the command's one line for a bucket it cannot reach: the failed request's traceback from
# `retry_request`, which re-raises that error to the caller; and the warning that a bucket's
# layout could not be asked (no credentials, no network), after which gcsfs treats it as a plain
# bucket, as it should. Both log on the "gcsfs" logger; its other warnings still print.
_GCSFS_ECHOES = ("retry_request", "_get_bucket_type")


def _not_gcsfs_echo(record) -> bool:
    return record.funcName not in _GCSFS_ECHOES


def quiet_logs() -> None:
    """What a command without --verbose keeps off stderr: jax's INFO report of each backend it
    probes and lacks ("Unable to initialize backend 'tpu'"), orbax's INFO record of every
    checkpoint step it reads or writes, which absl prints, and orbax's warnings that a
    checkpoint folder is opened read-only (as we ask), and gcsfs's tracebacks of the requests
    whose error the command reports itself (_GCSFS_ECHOES); noise that would bury the one line
    an error is; and libtpu's warnings about a TPU VM's metadata on a machine that is none
    (topology.quiet_libtpu). Other warnings and errors still print."""
    topology.quiet_libtpu()  # where the [tpu] extra is installed on a machine without TPUs
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    absl_logging.set_verbosity(absl_logging.WARNING)
    absl = logging.getLogger("absl")
    if _not_read_only_notice not in absl.filters:
        absl.addFilter(_not_read_only_notice)
    gcsfs = logging.getLogger("gcsfs")
    if _not_gcsfs_echo not in gcsfs.filters:
        gcsfs.addFilter(_not_gcsfs_echo)


def fail(message: str) -> None:
    """One `error:` line on stderr and exit code 2 (bad input, not a crash)."""
    print(f"error: {message}", file=sys.stderr)
    # A failed checkpoint save can leave one of orbax's coroutines unawaited; on a loaded machine
    # the interpreter's shutdown then collects it after the error line and warns ("coroutine ...
    # was never awaited", "Enable tracemalloc ..."): noise under the line that says what to do.
    warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
    sys.exit(2)


INTERRUPTED = "interrupted; finished checkpoints are kept: run the same command to resume"


def end_interrupted(line: str = INTERRUPTED) -> None:
    """A second Ctrl-C (or SIGTERM) means "now": one line, and exit code 130 at once.

    At once, with os._exit: a save may be in flight in orbax's background thread, which an
    ordinary exit would leave running into the interpreter's shutdown, where it fails with a
    traceback ("cannot schedule new futures after shutdown"). The checkpoint it was writing
    stays a temporary folder that the next run removes; finished ones are untouched, and the
    workdir's lock was released as the run unwound.
    """
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)


def each_once(flag: str, items, key=lambda item: item) -> list:
    """`items` (a flag's list) as given, when no two of them name the same thing by `key`;
    otherwise one line naming the repeated thing, exit 2. A list that names a thing twice would
    do its work twice (one evaluation written twice, one run averaged twice) or let the later
    setting silently win, so it is refused rather than merged."""
    seen: dict = {}
    for item in items:
        k = key(item)
        if k in seen:
            forms = f"{item!r}" if seen[k] == item else f"{k} (as {seen[k]!r} and {item!r})"
            fail(f"{flag} names {forms} twice; name each once")
        seen[k] = item
    return list(items)


@contextlib.contextmanager
def one_line_for(*errors: type[Exception], verbose: bool):
    """A block whose `errors` end the command as bad input: their one `error:` line and exit
    code 2 (`fail`), or the traceback with --verbose."""
    try:
        yield
    except errors as e:
        if verbose:
            raise
        fail(str(e))


@contextlib.contextmanager
def no_answer_ends(verbose: bool):
    """A block in which a request to a remote store that got no answer within its deadline
    (`deadline.is_timeout`: NoAnswer naming the path, or a library's own timeout type, which
    httpx's is not an OSError) ends the command in one `error:` line and exit code 2, or the
    traceback with --verbose."""
    try:
        yield
    except Exception as e:
        if verbose or not deadline.is_timeout(e):
            raise
        fail(deadline.no_answer_line(e))


def cannot_write(error: OSError, then: str) -> str:
    """The one line for an environment error while writing (a full disk, a file size limit, a
    lost mount, a folder where a file goes): which file, the system's reason, what to do about
    that reason (jsonio.write_advice), then `then`; a write refused because the file is a link
    (paths.LinkRefused) says so, and nothing of free space."""
    if isinstance(error, LinkRefused):
        return f"{error}; {then}"
    where = f" {error.filename}" if error.filename else ""
    reason = error.strerror or error
    return f"cannot write{where} ({reason}); {jsonio.write_advice(error)}, {then}"


def run_to_the_end(
    work: Callable[[], T],
    verbose: bool,
    write_then: str | None = None,
    interrupted: Callable[[], None] = end_interrupted,
) -> T:
    """What `work()` returns, or how it ended as every command answers it: bad input
    (ConfigError, DataError, CheckpointError) one `error:` line and exit code 2; a diverged run
    (NonFiniteError) one line and exit code 1; with `write_then` (what to do once there is
    room), an environment error while writing (OSError) one line and exit code 2; a request to
    a remote store without an answer within its deadline one line and exit code 2; a signal
    before the steps began (Preempted) a line and exit code 0; Ctrl-C `interrupted()` (by
    default `end_interrupted`: one line, exit code 130). With `verbose` each of these but
    Preempted raises, for the traceback."""
    try:
        with no_answer_ends(verbose):
            return work()
    except (ConfigError, DataError, CheckpointError) as e:
        if verbose:
            raise
        fail(str(e))
    except NonFiniteError as e:
        if verbose:
            raise
        # Not bad input (exit 2) but a diverged run: exit 1, still one line.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # a full disk or a lost mount while writing metrics, config.json, ...
        if verbose or write_then is None:
            raise
        fail(cannot_write(e, write_then))
    except Preempted as e:
        # A signal before the steps began: no step ran since the last checkpoint, so nothing
        # new is lost.
        print(
            f"preempted before training started ({e}); run the same command to resume",
            file=sys.stderr,
        )
        sys.exit(0)
    except KeyboardInterrupt:
        if verbose:
            raise
        interrupted()


PRINT_CONFIG_HELP = (
    "Print every key of the config (overrides applied) with its value and its doc (the "
    "schema's, or the config file's comment on its line), and exit: the keys "
    "--config.KEY=VALUE can set."
)


def print_config(config, filename: str) -> None:
    """What `--print_config` prints (config.describe.describe), on stdout."""
    print(describe.describe(config, filename))


def _flag_value(argv: list[str], name: str) -> str | None:
    """The value of `--name=VALUE` (or `--name VALUE`) in argv, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


_FAILED = object()


def _run_config_file(config_file: str):
    """What a config file's get_config() returns (`FILE:ARG` passes ARG), or _FAILED when it
    raises. The file is the user's own and config_flags has just run it: the failed parse kept
    nothing, so the file runs again to find the cause."""
    path, _, arg = config_file.partition(":")
    try:
        get_config = runpy.run_path(path).get("get_config")
        return get_config(arg) if arg else get_config()
    except Exception:
        return _FAILED


def _config_type(config_file: str) -> str | None:
    """The type name of what a config file's get_config() returns, when not a ConfigDict.

    Overrides fail against anything else with a misleading "unknown key"; this finds the cause.
    """
    value = _run_config_file(config_file)
    if value is _FAILED or isinstance(value, ml_collections.ConfigDict):
        return None
    return type(value).__name__


def loaded_config(config, filename: str):
    """The ConfigDict a --config file gave; one line and exit 2 when the file does not give one.

    config_flags loads the file lazily, so this is where a file that cannot be read, or whose
    get_config() returns something else, is found: before any work starts.
    """
    try:
        config.to_dict()
    except OSError:
        fail(f"config file {filename} cannot be read; check --config")
    except AttributeError:
        pass
    if not isinstance(config, ml_collections.ConfigDict):
        fail(
            f"config file {filename}: get_config() returned {type(config).__name__}, not an "
            "ml_collections.ConfigDict (see configs/tiny.py)"
        )
    return config


# Which command takes which configs (a config's `family` key marks a fine-tuning config).
PRETRAINING_CONFIGS = "pre-training configs (configs/tiny.py, small.py, base.py, large.py)"
FINETUNING_CONFIGS = "fine-tuning configs (configs/glue.py, configs/squad.py)"


def check_family(config, filename: str, command: str, finetuning: bool) -> None:
    """One line and exit 2 when `config` is not of the family `command` takes: a fine-tuning
    config (it has `family`) given to train or prepare, or a pre-training one to finetune.
    Before anything reads a field, which would end in an AttributeError."""
    family = config.get("family")
    commands = (
        f"electra_jax.train and electra_jax.prepare take {PRETRAINING_CONFIGS}; "
        f"electra_jax.finetune takes {FINETUNING_CONFIGS}"
    )
    if finetuning:
        if family is None:
            fail(
                f"config file {filename} is a pre-training config, not a fine-tuning one: "
                f"{commands}"
            )
        return
    if family is not None:
        fail(f"config file {filename} is a fine-tuning config (family {family!r}): {commands}")
    missing = [name for name in pretrain_keys.REQUIRED_SECTIONS if name not in config]
    if missing:
        fail(
            f"config file {filename} has no {', '.join(missing)} section"
            f"{'s' if len(missing) > 1 else ''}: {command} takes {PRETRAINING_CONFIGS}; start "
            "from one of them"
        )


def command_config(flag_name: str, command: str, finetuning: bool):
    """The ConfigDict of the config flag `flag_name`, loaded now (the flag loads its file
    lazily: fail here, not in the middle of a run) and of the family `command` takes, with
    every key the schema declares that the file lacks at its default (config/schema.complete),
    so that every read is a plain attribute; one line and exit 2 otherwise (loaded_config,
    check_family)."""
    filename = flags.FLAGS[flag_name].config_filename
    try:
        config = flags.FLAGS[flag_name].value
    except OSError:
        fail(f"config file {filename} cannot be read; check --config")
    config = loaded_config(config, filename)
    check_family(config, filename, command, finetuning=finetuning)
    # A key the file sets is checked as an override is: a misspelt one was silently ignored.
    declared, keys = strict_settings.file_keys(config, finetuning)
    unknown = unknown_keys(declared, [f"--config.{k}=" for k in keys])
    if unknown:
        fail(
            f"config file {filename} sets unknown config key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; --print_config lists the keys"
        )
    return complete(config, finetuning)


def complete(config, finetuning: bool):
    """`config` with the keys of its command's schema it lacks at their defaults (a fine-tuning
    config: its family's, but those the family's config must hold itself)."""
    if finetuning:
        return finetune_keys.complete(config)
    return schema.complete(config, pretrain_keys.KEYS)


def unknown_keys(config, overrides: list[str]) -> list[str]:
    """Of `overrides` (`--config.KEY=VALUE` arguments), the KEYs `config` does not have, each
    with a did-you-mean of the closest key when there is one: ['train.num_step (did you mean
    train.num_steps?)']."""
    known = strict_settings.config_keys(config)
    out = []
    for arg in overrides:
        key = arg.split("=", 1)[0].removeprefix("--config.")
        if re.split(r"\[", key, maxsplit=1)[0] in known:  # a[0]: an element of a list field
            continue
        # Keys as deep as this one: 'model.zzz' is no misspelling of the section 'model'.
        alike = [k for k in known if k.count(".") == key.count(".")]
        close = difflib.get_close_matches(key, alike, n=1, cutoff=0.7)
        out.append(f"{key} (did you mean {close[0]}?)" if close else key)
    return out


def _raised_in(error: BaseException, config_file: str) -> tuple[BaseException, int, str] | None:
    """(the exception, its line, its function) when `error`, or an exception it was raised from,
    was raised by code of the config file itself: the deepest frame of that file."""
    target = os.path.realpath(config_file.partition(":")[0])
    seen = set()
    chain = []
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for exc in reversed(chain):  # the original error first: config_flags wraps it
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.realpath(f.filename) == target
        ]
        if frames:
            return exc, frames[-1].lineno, frames[-1].name
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with config errors (unknown key, wrong type) as one line.

    Pass as `app.run(main, flags_parser=parse_flags)`; `--verbose` keeps the traceback.
    """
    repeated = strict_settings.repeated_flag(argv, flags.FLAGS)
    if repeated:  # absl would take the later value without a word
        fail(f"{repeated} is given twice; give it once")
    try:  # read again where a request is sent; checked here, before any work
        deadline.request_seconds()
    except environment.EnvironmentValueError as e:
        fail(str(e))
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # config_flags raises KeyError, AttributeError, TypeError, ...
        if "--verbose" in argv:
            raise
        text = str(e).replace("\\n", "\n")
        config_file = _flag_value(argv, "--config")
        if isinstance(e, SyntaxError):
            fail(f"config file {config_file} is not valid Python ({e.msg}, line {e.lineno})")
        raised = _raised_in(e, config_file) if config_file else None
        if raised:
            exc, line, function = raised
            where = "at its top level" if function == "<module>" else f"in {function}()"
            fail(
                f"config file {config_file} raised {type(exc).__name__}: "
                f"{jsonio.one_line(exc, 200)} (line {line}, {where}); fix the file "
                "(--verbose shows the traceback)"
            )
        if "Error whilst parsing config file" in text and config_file:
            # get_config itself could not be called (an argument it does not take, ...).
            cause = e
            while cause.__cause__ or cause.__context__:
                cause = cause.__cause__ or cause.__context__
            fail(
                f"config file {config_file}: get_config() cannot be called as --config asks "
                f"({type(cause).__name__}: {jsonio.one_line(cause, 200)})"
            )
        if "has no attribute 'get_config'" in text:
            fail(
                f"config file {config_file} has no get_config() function; a config file defines "
                "get_config() returning an ml_collections.ConfigDict (see configs/tiny.py)"
            )
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        if config_file:
            kind = _config_type(config_file)
            if kind:
                fail(
                    f"config file {config_file}: get_config() returned {kind}, not an "
                    "ml_collections.ConfigDict (see configs/tiny.py)"
                )
        if isinstance(e, (KeyError, AttributeError)):
            config = _run_config_file(config_file) if config_file else _FAILED
            unknown = [] if config is _FAILED else unknown_keys(config, overrides)
            if unknown:
                fail(
                    f"unknown config key{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(unknown)} in {config_file}; --print_config lists the keys"
                )
            suggestion = re.search(r'Did you mean "([^"]+)"', text)
            hint = f'; did you mean "{suggestion.group(1)}"?' if suggestion else ""
            fail(f"unknown config key in {' '.join(overrides)}{hint}")
        fail(" ".join(text.replace("flag --", "--").split()))
        raise AssertionError("unreachable") from e


@dataclasses.dataclass(frozen=True)
class ConfigCommand:
    """A command that runs a config file (train, prepare, finetune): the flags each has
    (--config, --verbose, --print_config; `define` makes them) and how each starts and ends."""

    name: str  # the module users run: "electra_jax.train"
    example: str  # the config file suggested when --config is missing
    finetuning: bool  # which family of configs it takes
    config: Any  # the flags' holders
    verbose: Any
    print_config: Any

    @classmethod
    def define(cls, name: str, config_help: str, example: str, finetuning: bool):
        """The command's shared flags, defined once at its module's import."""
        return cls(
            name,
            example,
            finetuning,
            config_flags.DEFINE_config_file("config", None, config_help, lock_config=True),
            flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors."),
            flags.DEFINE_bool("print_config", False, PRINT_CONFIG_HELP),
        )

    def start(self, argv: list[str], workdir_flag: Any = None, workdir_for: str = ""):
        """The config to run (command_config), after what every config command checks first:
        no stray arguments, a --config, and jax's, absl's and orbax's logs quiet unless
        --verbose (`quiet_logs`); then, given `workdir_flag`, a --workdir (`workdir_for`: what
        goes there). None when --print_config printed the config: nothing more to do."""
        if len(argv) > 1:
            fail(f"unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE")
        if self.config.value is None:
            fail(f"--config is required, e.g. --config={self.example}")
        if not self.verbose.value:
            quiet_logs()
        config = command_config("config", self.name, finetuning=self.finetuning)
        if self.print_config.value:
            print_config(config, flags.FLAGS["config"].config_filename)
            return None
        if workdir_flag is not None and not workdir_flag.value:
            fail(f"--workdir is required: {workdir_for}")
        return config

    def run(self, work: Callable[[], T], write_then: str | None = None, **ends) -> T:
        """run_to_the_end(work) with this command's --verbose."""
        return run_to_the_end(work, self.verbose.value, write_then, **ends)
