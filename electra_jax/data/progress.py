"""Progress lines of data preparation on stderr, at most one every few seconds.

Preparing a real corpus takes minutes (SentencePiece training, then tokenizing and packing), and
a terminal that prints nothing for that long looks hung. The lines go to stderr, like the
training loop's, so that stdout keeps only a command's result (the prepare CLI's JSON line).
Only the process that prepares prints: on multi-host runs the others find the data made.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

# Least seconds between two periodic lines of one phase; start and end lines are always printed.
INTERVAL_SECONDS = 5.0


# A line that goes out before this process's next line on stderr (see `announce`).
_announced: list[str] = []


def announce(text: str) -> None:
    """Prints `text` on stderr just before this process's next progress or log line, and not at
    all when none comes: train's first line (where it runs) then never stands beside the one
    `error:` line of a run that bad input ends before it starts."""
    _announced[:] = [text]


def print_line(text: str) -> None:
    """`text` on stderr, after the announced line if one is waiting."""
    # sys.stderr looked up at each line: pytest's capture replaces it after import.
    while _announced:
        print(_announced.pop(0), file=sys.stderr, flush=True)
    print(text, file=sys.stderr, flush=True)


class Progress:
    """The lines of one phase of preparation, each starting with the phase's name.

    Args:
      phase: e.g. ``tokenizer`` or ``packing`` (the tokenizer's training, the shards').
      interval: least seconds between two lines of ``maybe`` (None: ``INTERVAL_SECONDS`` as it
        is when the phase starts, so that a test can lower it).
      clock: monotonic seconds (a test passes a fake one).
    """

    def __init__(
        self,
        phase: str,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.phase = phase
        self._interval = INTERVAL_SECONDS if interval is None else interval
        self._clock = clock
        self._start = self._last = clock()

    def elapsed(self) -> float:
        """Seconds since the phase started."""
        return self._clock() - self._start

    def line(self, text: str) -> None:
        """Prints ``phase: text`` on stderr now (a start or end line)."""
        print_line(f"{self.phase}: {text}")
        self._last = self._clock()

    def maybe(self, text: Callable[[], str]) -> bool:
        """Prints ``text()`` when ``interval`` seconds have passed since the last line; the text
        is only made then, so a caller can ask on every item. Returns whether it printed."""
        if self._clock() - self._last < self._interval:
            return False
        self.line(text())
        return True


def count(n: float) -> str:
    """1234 -> '1,234'; 12_345_678 -> '12.3M' (millions and more are shortened)."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}G"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{int(n):,}"


def size(num_bytes: float) -> str:
    """Bytes as '512 B', '3.4 KB', '10.2 MB', '1.5 GB' (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{int(num_bytes)} B"


def duration(seconds: float) -> str:
    """Seconds as '42s', '3m05s' or '2h01m'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def share_and_eta(
    done_bytes: int, total_bytes: int | None, elapsed: float, at_least: float = 0.0
) -> str:
    """', 34% of 10.2 MB read, eta 1m05s' when the input's size is known (and some of it was
    read), else ''. The ETA assumes the rest goes at the rate so far; ``at_least`` is a share of
    the phase known done otherwise (e.g. of a cap on what it reads), which shortens it."""
    if not total_bytes or done_bytes <= 0:
        return ""
    read = min(1.0, done_bytes / total_bytes)
    fraction = min(1.0, max(read, at_least))
    eta = elapsed * (1 - fraction) / fraction
    return f", {read:.0%} of {size(total_bytes)} read, eta {duration(eta)}"
