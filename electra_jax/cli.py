"""What every command-line entry point shares: flag errors and failures as one line, exit 2."""

from __future__ import annotations

import re
import sys

from absl import flags


def fail(message: str) -> None:
    """One `error:` line on stderr and exit code 2 (bad input, not a crash)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def cannot_write(error: OSError, then: str) -> str:
    """The one line for an environment error while writing (a full disk, a file size limit, a
    lost mount): which file, the system's reason, what to do; a write refused because the file
    is a link (paths.LinkRefused) says so, and nothing of free space."""
    from electra_jax.paths import LinkRefused

    if isinstance(error, LinkRefused):
        return f"{error}; {then}"
    where = f" {error.filename}" if error.filename else ""
    return f"cannot write{where} ({error.strerror or error}); free space or fix the storage, {then}"


PRINT_CONFIG_HELP = (
    "Print every key of the config (overrides applied) with its value and the comment its "
    "config file gives it, and exit: the keys --config.KEY=VALUE can set."
)


def print_config(config, filename: str) -> None:
    """What `--print_config` prints (config_help.describe), on stdout."""
    from electra_jax import config_help

    print(config_help.describe(config, filename))


def _flag_value(argv: list[str], name: str) -> str | None:
    """The value of `--name=VALUE` (or `--name VALUE`) in argv, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _config_type(config_file: str) -> str | None:
    """The type name of what a config file's get_config() returns, when not a ConfigDict.

    Overrides fail against anything else with a misleading "unknown key"; this finds the cause.
    The file is the user's own and config_flags has just run it.
    """
    import runpy

    import ml_collections

    path, _, arg = config_file.partition(":")
    try:
        get_config = runpy.run_path(path).get("get_config")
        value = get_config(arg) if arg else get_config()
    except Exception:
        return None
    if isinstance(value, ml_collections.ConfigDict):
        return None
    return type(value).__name__


def loaded_config(config, filename: str):
    """The ConfigDict a --config file gave; one line and exit 2 when the file does not give one.

    config_flags loads the file lazily, so this is where a file that cannot be read, or whose
    get_config() returns something else, is found: before any work starts.
    """
    import ml_collections

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


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with config errors (unknown key, wrong type) as one line.

    Pass as `app.run(main, flags_parser=parse_flags)`; `--verbose` keeps the traceback.
    """
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # config_flags raises KeyError, AttributeError, TypeError, ...
        if "--verbose" in argv:
            raise
        text = str(e).replace("\\n", "\n")
        config_file = _flag_value(argv, "--config")
        if isinstance(e, SyntaxError):
            fail(f"config file {config_file} is not valid Python ({e.msg}, line {e.lineno})")
        if "get_config" in text:
            fail(
                f"config file {config_file} has no get_config() function; a config file defines "
                "get_config() returning an ml_collections.ConfigDict (see configs/tiny.py)"
            )
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        suggestion = re.search(r'Did you mean "([^"]+)"', text)
        if config_file:
            kind = _config_type(config_file)
            if kind:
                fail(
                    f"config file {config_file}: get_config() returned {kind}, not an "
                    "ml_collections.ConfigDict (see configs/tiny.py)"
                )
        if isinstance(e, (KeyError, AttributeError)):
            keys = [a.split("=")[0] for a in overrides]
            where = [k for k in keys if k.rsplit(".", 1)[-1] in text] or keys
            hint = f'; did you mean "{suggestion.group(1)}"?' if suggestion else ""
            fail(f"unknown config key {' '.join(where)}{hint}")
        fail(" ".join(text.replace("flag --", "--").split()))
        raise AssertionError("unreachable") from e
