"""Which steps a workdir has saved, read from the names of its checkpoint folders, and the
'WORKDIR@STEP' form that names one of them.

Without orbax, jax or a checkpoint manager (store/checkpointing.py has those): the commands and
benchmarks that refuse a step that is not there answer before importing them.
"""

from __future__ import annotations

import re

from electra_jax.store import filenames, paths

# A step's folder as this run names it: ASCII digits, no leading zero. orbax takes for a step
# any name of decimal digits without a leading zero (Unicode ones too: its regex's \d), and
# treats that folder as its own: restores it, deletes it once older than checkpoint.keep, and
# refuses to save that step again (StepAlreadyExistsError).
STEP_NAME = re.compile(r"0|[1-9][0-9]*")


def checkpoint_dir(workdir: str) -> str:
    """WORKDIR/checkpoints, absolute (a gs:// workdir as it is: orbax writes there directly)."""
    return paths.join(paths.absolute(workdir), filenames.CHECKPOINTS_DIR)


def saved_steps(workdir: str) -> list[int]:
    """The finished steps under WORKDIR/checkpoints, ascending (without opening a manager: a
    step's folder is renamed to its number only once written; set-aside ones are not steps)."""
    directory = checkpoint_dir(workdir)
    if not paths.isdir(directory):
        return []
    return sorted(int(n) for n in paths.listdir(directory) if STEP_NAME.fullmatch(n))


def has_checkpoints(workdir: str) -> bool:
    """Whether WORKDIR/checkpoints holds any finished step (without opening a manager)."""
    return bool(saved_steps(workdir))


def split_step(path: str) -> tuple[str, int | None]:
    """'WORKDIR@STEP' -> (WORKDIR, STEP); any other path (one that exists as named included,
    so a folder whose name has an '@' still loads) -> (path, None)."""
    head, sep, tail = path.rpartition("@")
    # isascii: '²' and '٣' are digits to str.isdigit() but not to int().
    if not sep or not head or not (tail.isascii() and tail.isdigit()) or paths.exists(path):
        return path, None
    return head, int(tail)
