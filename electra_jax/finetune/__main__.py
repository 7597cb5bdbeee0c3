"""python -m electra_jax.finetune --config=configs/glue.py --config.task=SST-2 \
    --config.data_dir=glue_data/SST-2 --config.init_from=runs/tiny --workdir=runs/tiny-sst2
python -m electra_jax.finetune --config=configs/squad.py --config.version=2.0 \
    --config.data_dir=squad --config.init_from=runs/tiny --workdir=runs/tiny-squad2

Flags only: parse the config and the workdir, then hand over to finetune.loop.finetune(), the
one runner; `config.family` ('glue' or 'squad') picks the task family. Rerunning the command on
the same --workdir resumes from its newest checkpoint. Bad input (an unknown task or config key,
missing or malformed data, an unreadable init_from, a workdir holding another run) ends with one
line on stderr and exit code 2; a diverged run (a NaN/Inf training loss) with one line and exit
code 1; SIGTERM saves a checkpoint and exits 0; --verbose shows the traceback instead.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from electra_jax.cli import (
    PRINT_CONFIG_HELP,
    command_config,
    each_once,
    end_interrupted,
    fail,
    one_line_for,
    parse_flags,
    print_config,
    quiet_logs,
)

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "configs/glue.py with --config.task=..., or configs/squad.py with --config.version=...",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where eval_results.json and predictions go.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
_ALLOW_CHANGE = flags.DEFINE_string(
    "allow_change",
    "",
    "Resuming: what may differ from what the run started from (comma-separated): data_dir (the "
    "task's files, or config.data_dir), init_from (the pre-trained weights, or config.init_from);"
    " recorded in config_changes.jsonl. Other differences are refused.",
)
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, PRINT_CONFIG_HELP)


def main(argv) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE")
    if _CONFIG.value is None:
        fail("--config is required, e.g. --config=configs/glue.py")
    if not _VERBOSE.value:
        quiet_logs()
    import shlex

    from electra_jax.config.schema import ConfigError
    from electra_jax.finetune import checks
    from electra_jax.run import workdir as workdir_lib
    from electra_jax.validate import NonFiniteError

    config = command_config("config", "electra_jax.finetune", finetuning=True)
    if _PRINT_CONFIG.value:
        print_config(config, flags.FLAGS["config"].config_filename)
        return
    if not _WORKDIR.value:
        fail("--workdir is required: where eval_results.json and the trained model go")
    allow = [k.strip() for k in _ALLOW_CHANGE.value.split(",") if k.strip()]
    each_once("--allow_change", allow)
    with one_line_for(ConfigError, verbose=_VERBOSE.value):
        checks.check_allowed(allow)
        # Before jax, flax and orbax are imported: bad settings, and a workdir the run's claim
        # would refuse (a file, a folder not ours or of the other kind, a link out: the claim's
        # checks, nothing written), are answered in a blink. finetune() claims it for good.
        family, task = checks.check_config(config)
        workdir_lib.claim(_WORKDIR.value, workdir_lib.FINETUNE, lock=False)
    data = _read_new_runs_task(config, family, task)
    from electra_jax.store import checkpointing
    from electra_jax.store.checkpointing import CheckpointError, Preempted

    if not _VERBOSE.value:
        checkpointing.quiet_write_failures()  # orbax's threads' reports of a full disk
    from electra_jax.data import DataError
    from electra_jax.finetune import loop

    command = shlex.join(["python", "-m", "electra_jax.finetune", *sys.argv[1:]])
    try:
        loop.finetune(
            config, _WORKDIR.value, command=command, allow_changes=tuple(allow), data=data
        )
    except (ConfigError, DataError, CheckpointError) as e:
        if _VERBOSE.value:
            raise
        fail(str(e))
    except NonFiniteError as e:
        if _VERBOSE.value:
            raise
        # Not bad input (exit 2) but a diverged run: exit 1, still one line.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        # A signal before the steps began: nothing new to save.
        print(
            f"preempted before training started ({e}); run the same command to resume",
            file=sys.stderr,
        )
        sys.exit(0)
    except KeyboardInterrupt:
        if _VERBOSE.value:
            raise
        end_interrupted()


def _read_new_runs_task(config, family: str, task):
    """A new run's task examples (finetune.reading), read before jax is imported: a missing or
    malformed task file is one line in a blink. None for a workdir that holds anything: the
    runner then asks first whether it holds this run (finished, or to resume), then reads."""
    from electra_jax.data import DataError
    from electra_jax.finetune import reading
    from electra_jax.store import paths

    workdir = _WORKDIR.value
    if paths.exists(workdir) and paths.listdir(workdir):
        return None
    with one_line_for(DataError, verbose=_VERBOSE.value):
        return reading.READERS[family](config, task)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
