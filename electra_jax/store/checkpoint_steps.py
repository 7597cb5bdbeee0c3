"""Which steps a workdir has saved, read from the names of its checkpoint folders, the
'WORKDIR@STEP' form that names one of them, and what else its checkpoints/ folder holds
(`survey`: entries orbax would take for steps that are not the run's; `set_aside`: damaged ones).

Without orbax, jax or a checkpoint manager (store/checkpointing.py has those): the commands and
benchmarks that refuse a step that is not there, or a workdir whose checkpoints/ a resume would
refuse, answer before importing them.
"""

from __future__ import annotations

import json
import re

from electra_jax.errors import CheckpointError
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


CORRUPT_SUFFIX = ".corrupt"
# The item (folder) holding the input position and the layout that saved it, and its file.
POSITION = "position"
POSITION_FILE = "position.json"


# What orbax takes for a step (STEP_NAME is what this run writes).
_ORBAX_STEP_NAME = re.compile(r"0|[1-9]\d*")
# What each checkpoint folder this run writes holds (orbax's metadata, its commit marker, and
# the items): a folder holding none of them is not one of ours.
_CHECKPOINT_ENTRIES = ("_CHECKPOINT_METADATA", "commit_success.txt", "state", POSITION)
# Names in checkpoints/ that are this run's without being steps: a checkpoint set aside as
# damaged, orbax's temporary folder of a save in progress or cut off.
_SET_ASIDE_NAME = re.compile(r"[0-9]+" + re.escape(CORRUPT_SUFFIX) + r"(\.[0-9]+)?")
_TMP_MARK = ".orbax-checkpoint-tmp"


class ForeignFolderError(CheckpointError):
    """An entry of checkpoints/ that orbax would take for a step but is no checkpoint of this
    run at that step: another program's folder, or a checkpoint renamed or copied by hand.
    Nothing is moved or changed; the message names the entry, what it holds and the way out."""


def survey(directory: str) -> list[str]:
    """Checks the entries of a checkpoints/ folder (`directory`) before orbax lists them: the
    names that are not this run's (a user's `backup`, `99_copy`, ...), sorted, which orbax
    ignores and the run leaves as they are; [] when there are none or no folder.

    Raises ForeignFolderError for an entry orbax would take for step N that is not the run's
    checkpoint N: a file, a folder holding none of a checkpoint's entries (an export put there),
    a name of non-ASCII digits, or a checkpoint whose input position says another step (renamed
    or copied by hand). An empty folder is left to the restore (damage: set aside, with
    nothing in it to lose)."""
    if not paths.isdir(directory):
        return []
    others = []
    for name in sorted(paths.listdir(directory)):
        if _ORBAX_STEP_NAME.fullmatch(name):
            _check_step_folder(directory, name)
        elif not (name.startswith(".") or _SET_ASIDE_NAME.fullmatch(name) or _TMP_MARK in name):
            others.append(name)
    return others


def _check_step_folder(directory: str, name: str) -> None:
    """ForeignFolderError when `directory`/`name` (a step's name to orbax) is not the run's
    checkpoint of that step."""
    folder, step = paths.join(directory, name), int(name)
    if not paths.isdir(folder):
        _refuse_foreign(directory, name, "is a file, not a checkpoint folder")
    if not STEP_NAME.fullmatch(name):
        _refuse_foreign(directory, name, "is named in digits that this run never writes")
    try:
        entries = sorted(paths.listdir(folder))
    except OSError:
        return  # unreadable here: the restore names the machine's error in one line
    if entries and not set(entries) & set(_CHECKPOINT_ENTRIES):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        _refuse_foreign(directory, name, f"holds {shown}, not a checkpoint")
    try:
        held = read_position_file(folder)["data"]["next_index"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no readable position: the restore decides (damage, or the state's step)
    if isinstance(held, int) and not isinstance(held, bool) and held != step:
        renamed(directory, step, held, "its input position")


def _refuse_foreign(directory: str, name: str, what: str) -> None:
    raise ForeignFolderError(
        f"{paths.join(directory, name)} {what}, but orbax would take it for checkpoint "
        f"{int(name)} (restore it, delete it with the old checkpoints, or fail to save that "
        f"step): move it out of {directory}; nothing was changed"
    )


def renamed(directory: str, step: int, held: int, source: str) -> None:
    """Raises ForeignFolderError for `directory`/`step` holding the run's state at step `held`
    (as `source` says): a checkpoint renamed or copied by hand, which a resume would take for
    step `step`, training again steps it holds and ending in orbax's StepAlreadyExistsError."""
    folder, back = paths.join(directory, str(step)), paths.join(directory, str(held))
    way = (
        f"move it out of {directory} ({back} is there)"
        if paths.exists(back)
        else f"rename it back to {back}, or move it out of {directory}"
    )
    raise ForeignFolderError(
        f"{folder} holds the run's state at step {held} ({source}), not step {step}: renamed "
        f"or copied by hand, it would be resumed as the wrong step; {way}; nothing was changed"
    )


def read_position_file(folder: str) -> dict | None:
    """The POSITION item of a checkpoint folder as saved; None when it has none."""
    path = paths.join(folder, POSITION, POSITION_FILE)
    if not paths.exists(path):
        return None
    return json.loads(paths.read_bytes(path))


def set_aside(workdir: str) -> list[str]:
    """The checkpoints of WORKDIR moved aside as damaged (`<step>.corrupt*`), oldest first."""
    directory = checkpoint_dir(workdir)
    if not paths.isdir(directory):
        return []
    names = [n for n in paths.listdir(directory) if _SET_ASIDE_NAME.fullmatch(n)]
    return sorted(names, key=lambda n: (int(n.split(".")[0]), n))
