"""python -m electra_jax.train --config=configs/tiny.py --workdir=runs/tiny [--config.KEY=VALUE ...]

Flags only: parse the config and the workdir, join the other processes when there are any, and
hand over to loop.train(). Bad input ends with one line on stderr and exit code 2; a diverged
run (NaN/Inf under train.nan_policy='stop') with one line and exit code 1; SIGTERM / SIGINT with a
checkpoint of the current step and exit code 0.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from electra_jax.cli import fail, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A get_config() file such as configs/tiny.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and data go.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print a one-line JSON summary (sizes, FLOPs) and train nothing."
)
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0, for multi-host runs without auto-detection.",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")


def _maybe_initialize_distributed() -> None:
    import jax

    if _COORDINATOR.value:
        jax.distributed.initialize(
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1 or "," in os.environ.get(
        "TPU_WORKER_HOSTNAMES", ""
    ):
        jax.distributed.initialize()  # SLURM and TPU VM pods are detected by jax itself


def main(argv) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE")
    if _CONFIG.value is None:
        fail("--config is required, e.g. --config=configs/tiny.py")
    if not _VERBOSE.value:
        # jax reports at INFO each backend it probes and lacks ("Unable to initialize backend
        # 'tpu'"), which absl prints: noise that would bury the one line an error is.
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    from electra_jax import loop
    from electra_jax.checkpointing import CheckpointError, Preempted
    from electra_jax.data import DataError
    from electra_jax.validate import ConfigError

    try:
        config = _CONFIG.value
        config.to_dict()  # the file is loaded lazily: fail here, not in the middle of a run
    except OSError:
        fail(f"config file {flags.FLAGS['config'].config_filename} cannot be read; check --config")
    try:
        if _DRY_RUN.value:
            from electra_jax.validate import check_config

            check_config(config)
            print(json.dumps(loop.describe(config)))
            return
        if not _WORKDIR.value:
            fail("--workdir is required: where checkpoints and metrics go")
        _maybe_initialize_distributed()
        loop.train(config, _WORKDIR.value)
    except (ConfigError, DataError, CheckpointError) as e:
        if _VERBOSE.value:
            raise
        fail(str(e))
    except loop.NonFiniteError as e:
        if _VERBOSE.value:
            raise
        # Not bad input (exit 2) but a diverged run: exit 1, still one line.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        # A signal during startup: no step ran since the last checkpoint, so nothing is lost.
        print(
            f"preempted before training started ({e}); run the same command to resume",
            file=sys.stderr,
        )
        sys.exit(0)
    except KeyboardInterrupt:
        if _VERBOSE.value:
            raise
        print(
            "interrupted; finished checkpoints are kept: run the same command to resume",
            file=sys.stderr,
        )
        sys.exit(130)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
