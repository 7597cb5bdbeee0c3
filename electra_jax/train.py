"""python -m electra_jax.train --config=configs/tiny.py --workdir=runs/tiny [--config.KEY=VALUE ...]

Flags only: parse the config, plan the workdir's run (resume.plan without the claim), join the
other processes when there are any, and hand over to runner.train_planned(). Bad input ends with
one line on stderr and exit code 2; a diverged run (NaN/Inf under train.nan_policy='stop') with
one line and exit code 1; SIGTERM / SIGINT with a checkpoint of the current step and exit code 0.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading

from absl import app, flags

from electra_jax import cli
from electra_jax.cli import each_once, fail, one_line_for
from electra_jax.data import progress
from electra_jax.errors import CheckpointError, ConfigError
from electra_jax.pretraining import cluster, resume, topology
from electra_jax.validate import check_config

_COMMAND = cli.ConfigCommand.define(
    "electra_jax.train", "A get_config() file such as configs/tiny.py.", "configs/tiny.py", False
)
_VERBOSE = _COMMAND.verbose
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
_TOPOLOGY = flags.DEFINE_string(
    "topology",
    None,
    "With --dry_run: compile for this TPU slice with the TPU compiler instead of for this "
    "machine's devices (no TPU needed; the [tpu] extra): a Cloud accelerator name such as "
    "v4-128, v5p-128, v5litepod-16, v6e-64, tpu7x-8, or a jax topology name such as v4:4x4x4, "
    "v5e:2x2, tpu7x:2x2x1.",
)
_CEILING = flags.DEFINE_bool(
    "ceiling",
    True,
    "With --topology: also compile the two one-step programs the MFU ceilings are costed from "
    "(ceiling_compile_seconds says what they took); --noceiling answers whether the step fits "
    "with the run's program alone.",
)
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "With --topology: that many slices joined over the data-center network."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0, for multi-host runs that jax's cluster detection (SLURM, Open MPI, "
    "GKE and Cloud TPU slices, Kubernetes Jobs) does not find by itself.",
)
_ALLOW_CHANGE = flags.DEFINE_string(
    "allow_change",
    "",
    "Resuming: comma-separated config keys (e.g. data.source,train.learning_rate) that may "
    "differ from the workdir's config.json from the resumed step on (data.source also lets the "
    "corpus under the same source differ from the one the run started from; config.json "
    "resumes a run whose config.json is gone with this command's settings); recorded in "
    "config_changes.jsonl. Other differences are refused.",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")
_PEER_TIMEOUT = flags.DEFINE_integer(
    "peer_timeout_seconds",
    60,
    "Multi-host runs: how long a silent process may go before the others end with an error.",
)


def _check_process_flags() -> None:
    """One line for multi-host flags that cannot work, before jax sees them."""
    n, i, address = _NUM_PROCESSES.value, _PROCESS_ID.value, _COORDINATOR.value
    if n is not None and n < 1:
        fail(f"--num_processes={n} must be >= 1")
    if i is not None and (i < 0 or (n is not None and i >= n)):
        fail(f"--process_id={i} must be in [0, --num_processes={n}) (process 0 is the coordinator)")
    if _PEER_TIMEOUT.value < 1:
        fail(f"--peer_timeout_seconds={_PEER_TIMEOUT.value} must be >= 1")
    if address:
        host, sep, port = address.rpartition(":")
        host = host.strip("[]")  # [::1]:1234
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            fail(
                f"--coordinator_address={address} is not host:port (e.g. 10.0.0.2:1234, the "
                "address of process 0 and a free port there)"
            )
        if n is None or i is None:
            fail("--coordinator_address needs --num_processes and --process_id")
    elif n is not None or i is not None:
        fail(
            "--num_processes and --process_id need --coordinator_address (or none of the three: "
            "jax finds the processes of a SLURM, Open MPI, TPU slice or Kubernetes launch itself)"
        )


def _topology_target():
    """--topology and --num_slices as a slice to compile for (topology.Target); ConfigError
    for a name no slice has or a missing libtpu, fail() for flags that cannot go together."""
    if _TOPOLOGY.value is None:
        fail("--num_slices needs --topology (a real run's slices are those of its devices)")
    if not _DRY_RUN.value:
        fail("--topology compiles for a slice that is not here: add --dry_run")
    target = topology.resolve(_TOPOLOGY.value, _NUM_SLICES.value)
    topology.require_libtpu()
    return target


def _exit_unless_joined(done: threading.Event, seconds: float, where: str) -> None:
    """Watchdog: if the processes have not all joined after `seconds`, one line and exit 2.

    jax's own startup deadline ends the process with a C++ stack trace; this one fires first.
    jax releases the GIL while it waits, so the thread runs.
    """
    if done.wait(seconds):
        return
    print(
        f"error: the processes did not all join {where} within {seconds:.0f}s (5 x "
        "--peer_timeout_seconds); check that the address is process 0's host and a free port "
        "reachable from every host, that --num_processes is right, and that every process "
        "was started",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)


def _maybe_initialize_distributed() -> None:
    """Join the other processes: the explicit flags', or those jax's cluster detection finds.

    SLURM, Open MPI, GKE and Cloud TPU slices and Kubernetes Jobs are detected by jax itself
    (electra_jax/pretraining/cluster.py); a single process (no cluster, or a cluster of one)
    starts alone.
    """
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    startup = _PEER_TIMEOUT.value * 5
    if _COORDINATOR.value:
        where = f"the coordinator {_COORDINATOR.value}"
        target = dict(
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
    else:
        try:
            launch = cluster.detect(timeout_seconds=startup)
        except cluster.DetectionError as e:
            if _VERBOSE.value:
                raise
            fail(str(e))
        line = cluster.found(launch)  # whenever a launcher's variable is set
        if line:
            print(line, file=sys.stderr, flush=True)
        if launch is None:
            return
        where = f"the coordinator {launch.coordinator_address} ({launch.cluster})"
        # What jax's own detection found, passed on as it is; jax is told not to detect again
        # (a Kubernetes pod would ask the API server twice, a TPU VM its metadata server).
        target = dict(launch.initialize_kwargs(), cluster_detection_method="deactivate")
    # CPU devices of different processes talk through gloo (GPUs use NCCL, TPUs their ICI).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    joined = threading.Event()
    threading.Thread(target=_exit_unless_joined, args=(joined, startup, where), daemon=True).start()
    try:
        jax.distributed.initialize(
            **target,
            # A peer that stops answering is declared dead after this long and the run ends
            # with an error on every process, rather than waiting in a collective forever.
            heartbeat_timeout_seconds=_PEER_TIMEOUT.value,
            # Later than the watchdog, which says what went wrong in one line.
            initialization_timeout=startup + 30,
        )
    except (ValueError, RuntimeError) as e:  # e.g. an address jax cannot parse or bind
        if _VERBOSE.value:
            raise
        fail(f"cannot start the multi-host run ({' '.join(str(e).split())[:200]})")
    finally:
        joined.set()


def devices_line() -> str:
    """The run's first log line: where it runs (backend, device kind and count, processes)."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    devices = jax.devices()
    kinds = ", ".join(sorted({d.device_kind for d in devices}))
    return (
        f"jax {jax.__version__} on {jax.default_backend()}: {len(devices)} x {kinds} "
        f"({jax.local_device_count()} on this host), {jax.process_count()} process"
        f"{'es' if jax.process_count() > 1 else ''}"
    )


def main(argv) -> None:
    config = _COMMAND.start(argv)
    if config is None:
        return
    target = None
    if _TOPOLOGY.value is not None or _NUM_SLICES.value != 1:
        with one_line_for(ConfigError, verbose=_VERBOSE.value):
            target = _topology_target()
    if not (_DRY_RUN.value or _WORKDIR.value):
        fail("--workdir is required: where checkpoints and metrics go")
    _check_process_flags()
    allow = tuple(
        each_once(
            "--allow_change", [k.strip() for k in _ALLOW_CHANGE.value.split(",") if k.strip()]
        )
    )
    command = shlex.join(["python", "-m", "electra_jax.train", *sys.argv[1:]])
    planned = None
    with one_line_for(ConfigError, CheckpointError, verbose=_VERBOSE.value):
        # Before jax, flax and orbax are imported: bad settings are answered in a blink.
        check_config(config)
        if _WORKDIR.value and not _DRY_RUN.value:
            # And a workdir the run's claim would refuse (a file, a folder that is not ours or is
            # of the other kind, a link out), then what a resume of it would refuse (its
            # checkpoints/, config.json, settings and step): the plan without the claim, nothing
            # written. The runner claims it for good (rerun.take) and asks again only what
            # another process may change before the lock.
            planned = resume.plan(config, _WORKDIR.value, allow, command, claim=False)
    # jax, flax and orbax: only once the settings are known to be good.
    from electra_jax.pretraining import dry_run, runner
    from electra_jax.store import checkpointing

    if not _VERBOSE.value:
        checkpointing.quiet_write_failures()  # orbax's threads' reports of a full disk

    def work() -> None:
        if _DRY_RUN.value:
            summary = dry_run.describe(
                config, compile=_COMPILE.value, target=target, costs=_CEILING.value
            )
            print(json.dumps(summary))
            return
        _maybe_initialize_distributed()
        # Printed before the run's first line (data preparation's or the loop's), not beside the
        # one line of an error that ends it first.
        progress.announce(devices_line())
        runner.train_planned(planned)

    _COMMAND.run(work, "then run the same command to resume from the last checkpoint")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
