"""python -m electra_jax.finetune --config=configs/glue.py --config.task=SST-2 \
    --config.data_dir=glue_data/SST-2 --config.init_from=runs/tiny --workdir=runs/tiny-sst2
python -m electra_jax.finetune --config=configs/squad.py --config.version=2.0 \
    --config.data_dir=squad --config.init_from=runs/tiny --workdir=runs/tiny-squad2

Flags only: parse the config, plan the workdir's run (prior_run.plan without the claim), then
hand over to finetune.loop.finetune_planned(), the one runner; `config.family` ('glue' or
'squad') picks the task family. Rerunning the command on the same --workdir resumes from its
newest checkpoint. Bad input (an unknown task or config key,
missing or malformed data, an unreadable init_from, a workdir holding another run) ends with one
line on stderr and exit code 2; a diverged run (a NaN/Inf training loss) with one line and exit
code 1; SIGTERM saves a checkpoint and exits 0; --verbose shows the traceback instead.
"""

from __future__ import annotations

import shlex
import sys

from absl import app, flags

from electra_jax import cli
from electra_jax.errors import CheckpointError, ConfigError, DataError
from electra_jax.finetune import checks, prior_run, reading
from electra_jax.store import paths

_COMMAND = cli.ConfigCommand.define(
    "electra_jax.finetune",
    "configs/glue.py with --config.task=..., or configs/squad.py with --config.version=...",
    "configs/glue.py",
    True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where eval_results.json and predictions go.")
_VERBOSE = _COMMAND.verbose
_ALLOW_CHANGE = flags.DEFINE_string(
    "allow_change",
    "",
    "Resuming: what may differ from what the run started from (comma-separated): data_dir (the "
    "task's files, or config.data_dir), init_from (the pre-trained weights, or config.init_from);"
    " recorded in config_changes.jsonl. Other differences are refused.",
)


def main(argv) -> None:
    config = _COMMAND.start(argv, _WORKDIR, "where eval_results.json and the trained model go")
    if config is None:
        return
    allow = [k.strip() for k in _ALLOW_CHANGE.value.split(",") if k.strip()]
    cli.each_once("--allow_change", allow)
    command = shlex.join(["python", "-m", "electra_jax.finetune", *sys.argv[1:]])
    with cli.one_line_for(ConfigError, CheckpointError, verbose=_VERBOSE.value):
        checks.check_allowed(allow)
        # Before jax, flax and orbax are imported: bad settings, a workdir the run's claim would
        # refuse (a file, a folder not ours or of the other kind, a link out) and what a rerun
        # of it would refuse (another run, other settings or labels): the plan without the
        # claim, nothing written. The runner claims it for good (rerun.take) and asks again
        # only what another process may change before the lock.
        family, task = checks.check_config(config)
        planned = prior_run.plan(
            config, _WORKDIR.value, family, task, tuple(allow), command, claim=False
        )
    data = _read_new_runs_task(config, family, task)
    # jax, flax and orbax: only once the settings and a new run's task files are known good.
    from electra_jax.finetune import loop
    from electra_jax.store import checkpointing

    if not _VERBOSE.value:
        checkpointing.quiet_write_failures()  # orbax's threads' reports of a full disk
    _COMMAND.run(lambda: loop.finetune_planned(planned, data=data))


def _read_new_runs_task(config, family: str, task):
    """A new run's task examples (finetune.reading), read before jax is imported: a missing or
    malformed task file is one line in a blink. None for a workdir that holds anything: the
    runner then asks first whether it holds this run (finished, or to resume), then reads."""
    workdir = _WORKDIR.value
    if paths.exists(workdir) and paths.listdir(workdir):
        return None
    with cli.one_line_for(DataError, verbose=_VERBOSE.value):
        return reading.READERS[family](config, task)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
