"""The one reader of settings that come from environment variables: each value is checked where
it is read and refused in one line naming the variable, never passed on to an int() or float()
(or a library) that fails later in words that name nothing, nor silently replaced by a default.

A leaf (no package imports), so that the store's lock, cluster detection and the commands all
read their variables the same way; callers give the error type their command reports in one line.
"""

from __future__ import annotations

import math
import os


class EnvironmentValueError(ValueError):
    """An environment variable whose value cannot be what it names (one line naming it)."""


def whole_number(
    name: str,
    what: str,
    minimum: int = 0,
    error: type[Exception] = EnvironmentValueError,
) -> int | None:
    """The value of environment variable `name` as a whole number >= `minimum`; None when it
    is unset or empty. `what`: what the variable says, for the message.

    Raises:
      error: any other value (`abc`, `1.5`, `-1`, `²`), naming the variable.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
    if not (value.isascii() and value.lstrip("-").isdigit()) or int(value) < minimum:
        raise error(
            f"environment variable {name}={os.environ[name]!r} is not a whole number >= "
            f"{minimum} ({what}); set it right or unset it"
        )
    return int(value)


def positive_seconds(
    name: str,
    what: str,
    default: float,
    error: type[Exception] = EnvironmentValueError,
    maximum: float = math.inf,
) -> float:
    """The value of environment variable `name` as a finite number of seconds > 0, at most
    `maximum`; `default` when it is unset or empty.

    Raises:
      error: any other value (`abc`, `0`, `inf`, `nan`, past `maximum`), naming the variable.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= maximum):
        most = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise error(
            f"environment variable {name}={os.environ[name]!r} is not a number of seconds > 0"
            f"{most} ({what}); set it right or unset it (default {default:g})"
        )
    return seconds
