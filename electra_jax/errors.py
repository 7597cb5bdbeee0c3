"""The errors a user meets, each a one-line message the commands print after `error: `, in one
module below every other, so that any module may raise them and a command may catch them before
it imports jax, flax or orbax. Imports nothing.

A command answers ConfigError, DataError, PretrainedError and CheckpointError with one line and
exit code 2 (bad input), NonFiniteError with one line and exit code 1 (a diverged run), Preempted
with a line and exit code 0 (cli.run_to_the_end).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""


class DataError(ValueError):
    """Bad data input (a source, a tokenizer file, a config value) that the user must fix.

    The message is one self-contained line: it names the file or source and says what to do, so
    the command-line entry point can print it without a traceback.
    """


class PretrainedError(ValueError):
    """A path that does not hold a usable pre-trained model; the message names it, in one line."""


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used."""


class NonFiniteError(RuntimeError):
    """A run diverged: its loss, gradient norm or outputs became NaN/Inf. Raised by both runners
    (pre-training under train.nan_policy='stop', fine-tuning always), whose commands answer it
    with one line and exit 1."""


class Preempted(BaseException):
    """A termination signal arrived before training started: there is nothing new to save.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way (e.g. the
    restore's, which would take it for a damaged checkpoint) swallows it.
    """
