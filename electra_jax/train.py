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
from absl import logging as absl_logging
from ml_collections import config_flags

from electra_jax.cli import fail, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A get_config() file such as configs/tiny.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and data go.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print a one-line JSON summary (sizes, FLOPs) and train nothing."
)
_COMPILE = flags.DEFINE_bool(
    "compile",
    True,
    "With --dry_run: also compile the step ahead of time on this machine's devices, for the "
    "per-device memory and XLA's FLOP count (simulate a pod's devices on a CPU with "
    "XLA_FLAGS=--xla_force_host_platform_device_count=N).",
)
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0, for multi-host runs without auto-detection.",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")
_PEER_TIMEOUT = flags.DEFINE_integer(
    "peer_timeout_seconds",
    60,
    "Multi-host runs: how long a silent process may go before the others end with an error.",
)


def _maybe_initialize_distributed() -> None:
    import jax

    explicit = bool(_COORDINATOR.value)
    detected = int(os.environ.get("SLURM_NTASKS", "1")) > 1 or "," in os.environ.get(
        "TPU_WORKER_HOSTNAMES", ""
    )
    if not (explicit or detected):
        return
    if explicit and (_NUM_PROCESSES.value is None or _PROCESS_ID.value is None):
        fail("--coordinator_address needs --num_processes and --process_id")
    # CPU devices of different processes talk through gloo (GPUs use NCCL, TPUs their ICI).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = dict(
        # A peer that stops answering is declared dead after this long and the run ends with
        # an error on every process, rather than waiting in a collective forever.
        heartbeat_timeout_seconds=_PEER_TIMEOUT.value,
        initialization_timeout=_PEER_TIMEOUT.value * 5,
    )
    if explicit:
        kwargs.update(
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
    # Otherwise SLURM's and TPU VMs' variables are read by jax itself.
    jax.distributed.initialize(**kwargs)


def main(argv) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE")
    if _CONFIG.value is None:
        fail("--config is required, e.g. --config=configs/tiny.py")
    if not _VERBOSE.value:
        # jax reports at INFO each backend it probes and lacks ("Unable to initialize backend
        # 'tpu'"), which absl prints: noise that would bury the one line an error is.
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
        # orbax reports every step of a multi-host save at INFO.
        absl_logging.set_verbosity(absl_logging.WARNING)
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
            print(json.dumps(loop.describe(config, compile=_COMPILE.value)))
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
