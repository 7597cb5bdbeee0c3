"""What every command-line entry point shares: flag errors and failures as one line, exit 2."""

from __future__ import annotations

import re
import sys

from absl import flags


def fail(message: str) -> None:
    """One `error:` line on stderr and exit code 2 (bad input, not a crash)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


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
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        suggestion = re.search(r'Did you mean "([^"]+)"', text)
        if isinstance(e, (KeyError, AttributeError)):
            keys = [a.split("=")[0] for a in overrides]
            where = [k for k in keys if k.rsplit(".", 1)[-1] in text] or keys
            hint = f'; did you mean "{suggestion.group(1)}"?' if suggestion else ""
            fail(f"unknown config key {' '.join(where)}{hint}")
        fail(" ".join(text.replace("flag --", "--").split()))
        raise AssertionError("unreachable") from e
