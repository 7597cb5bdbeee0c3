"""A deadline on a call to a remote service: it ends within a stated time, answered or not.

Network libraries' own timeouts are per request and per library version (huggingface_hub's
client has none by default, and retries), so a service that accepts the connection and never
answers held `export --push_to_hub` forever. Here the call runs on a daemon thread that the
caller stops waiting for at the deadline; the command then reports it in one line and ends
(a daemon thread blocked on a socket does not hold the process up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class DeadlinePassed(TimeoutError):
    """The call did not end within its deadline (it may still be running, abandoned)."""


def call_within(seconds: float, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """fn(*args, **kwargs)'s result or exception, if it ends within `seconds`.

    Raises:
      DeadlinePassed: it did not; the call is left running on its daemon thread.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (handed to the caller, whatever it is)
            outcome["error"] = e

    thread = threading.Thread(target=run, name="electra_jax-deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeadlinePassed(f"no answer within {seconds:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
