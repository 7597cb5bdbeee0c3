"""Which cluster started this process, as jax's own cluster detection reads it.

`jax.distributed.initialize()` without arguments finds the other processes of a SLURM job, an
Open MPI `mpirun`, a GKE TPU slice (TPU_WORKER_HOSTNAMES), a Cloud TPU VM slice (its metadata
server) or a Kubernetes Job/JobSet (the pod's Job through the API server: jax's `[k8s]` extra).
train.py asks the same detection, in the same order, whether this process is one of several,
so that a single-host run (no cluster, or a cluster of one process) never starts
`jax.distributed` and a multi-host run always does. Nothing here keeps its own list of
variables: a cluster jax learns to detect is detected here too.

Imports only jax's cluster registry (jax, not flax or orbax).
"""

from __future__ import annotations

import dataclasses
import os
import warnings


class DetectionError(Exception):
    """The process is in a cluster whose other processes cannot be found (one line)."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """What jax.distributed.initialize gets for a multi-process launch.

    cluster: jax's class for the environment (SlurmCluster, OmpiCluster, GkeTpuCluster,
      GceTpuCluster, K8sCluster); coordinator_address: "host:port" of process 0;
      num_processes > 1; process_id in [0, num_processes); local_device_ids: the GPUs this
      process drives (one per process under SLURM and Open MPI: [local rank]), None for all
      (TPUs, Kubernetes).
    """

    cluster: str
    coordinator_address: str
    num_processes: int
    process_id: int
    local_device_ids: tuple[int, ...] | None

    def initialize_kwargs(self) -> dict:
        """The keyword arguments of jax.distributed.initialize for this launch."""
        return dict(
            coordinator_address=self.coordinator_address,
            num_processes=self.num_processes,
            process_id=self.process_id,
            local_device_ids=list(self.local_device_ids) if self.local_device_ids else None,
        )


# Variables that launchers set in each process of a multi-process launch, by launcher. Any of
# them set means this process may be one of several: what detection then found, or why the
# process runs alone (a variable left over in a shell, a launcher jax cannot read), is one line
# at start (`found`). The number-valued ones are checked where they are read (whole numbers),
# before jax's own int() meets them.
LAUNCHERS = {
    "SLURM": ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID"),
    "Open MPI": ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    "a TPU slice": ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID"),
    "a Kubernetes Indexed Job": ("JOB_COMPLETION_INDEX",),
}  # fmt: skip
_COUNTS = {"SLURM_NTASKS": 1, "OMPI_COMM_WORLD_SIZE": 1}  # >= 1; the others are indices >= 0
_INDICES = ("SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "TPU_WORKER_ID",
            "JOB_COMPLETION_INDEX")  # fmt: skip


def _check_numbers() -> None:
    """DetectionError naming a launcher's number variable that is no whole number."""
    from electra_jax.store import environment

    for name in (*_COUNTS, *_INDICES):
        what = "a process count" if name in _COUNTS else "a process index"
        environment.whole_number(
            name, f"{what} of a multi-process launch", _COUNTS.get(name, 0), DetectionError
        )


def cluster_variables() -> list[str]:
    """The launchers' variables set here, as NAME=VALUE. TPU_WORKER_HOSTNAMES naming one host
    is left out: one host is one process (and topology.quiet_libtpu names 'localhost' there
    on a machine without TPUs)."""
    out = []
    for names in LAUNCHERS.values():
        for name in names:
            value = os.environ.get(name)
            if value is None or (name == "TPU_WORKER_HOSTNAMES" and "," not in value):
                continue
            out.append(f"{name}={value}")
    return out


def _kubernetes_without_package() -> bool:
    """A pod of a Kubernetes Indexed Job (a JobSet's included) whose other pods jax cannot find:
    the `kubernetes` package is missing. Pod 0 too: nothing in its environment says whether it
    is the only pod, and training alone while the others fail would waste the whole job."""
    if "KUBERNETES_SERVICE_HOST" not in os.environ or not os.environ.get("JOB_COMPLETION_INDEX"):
        return False
    import importlib.util

    return importlib.util.find_spec("kubernetes") is None


def present_cluster():
    """jax's ClusterEnv class that `jax.distributed.initialize()` would use here, or None.

    The same walk as jax's ClusterEnv.auto_detect_unset_distributed_params: the registered
    environments in jax's order, opt-in ones (mpi4py) skipped, the first present one wins.
    """
    # jax's private module: only where this is asked.
    from jax._src import clusters

    for env in clusters.ClusterEnv._cluster_types:
        if env.opt_in_only_method:
            continue
        with warnings.catch_warnings():
            # Every pod has KUBERNETES_SERVICE_HOST: without the `kubernetes` package jax warns
            # on each start of a single-pod run; _kubernetes_peer_alone says when that matters.
            warnings.simplefilter("ignore")
            if env.is_env_present():
                return env
    return None


def detect(timeout_seconds: int) -> Launch | None:
    """The multi-process launch jax detects here, or None for a single process.

    timeout_seconds bounds the wait for the coordinator's name to resolve (TPU and Kubernetes
    clusters wait for process 0's host to come up). Raises DetectionError when this process is in
    a cluster jax recognizes but cannot find its peers, and for the ranks of a launch jax does not
    recognize (a later pod of a Kubernetes Indexed Job without the `kubernetes` package, Open
    MPI 5's ranks) rather than let each train alone.
    """
    # jax's private module: only where this is asked.
    from jax._src import clusters

    _check_numbers()
    env = present_cluster()
    if env is None:
        if _kubernetes_without_package():
            raise DetectionError(
                f"this process is pod {os.environ['JOB_COMPLETION_INDEX']} of a Kubernetes "
                "Indexed Job, but jax finds the other pods "
                "through the Kubernetes API and the `kubernetes` package is not installed: "
                "install jax[k8s] in the image (launch/k8s/ says how), or pass "
                "--coordinator_address, --num_processes and --process_id (a Job of one pod: "
                "--coordinator_address=localhost:1234 --num_processes=1 --process_id=0)"
            )
        if int(os.environ.get("OMPI_COMM_WORLD_SIZE") or 1) > 1:
            raise DetectionError(
                f"this process is rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')} of "
                f"{os.environ['OMPI_COMM_WORLD_SIZE']} started by Open MPI, whose launcher jax "
                "does not recognize (jax reads Open MPI 4's OMPI_MCA_orte_hnp_uri; Open MPI 5 "
                "has none): pass --coordinator_address=HOST0:PORT --num_processes="
                "$OMPI_COMM_WORLD_SIZE --process_id=$OMPI_COMM_WORLD_RANK"
            )
        return None
    name = env.__name__
    try:
        if env.get_process_count() <= 1:
            return None
        address, count, index, ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(
            coordinator_address=None,
            num_processes=None,
            process_id=None,
            local_device_ids=None,
            cluster_detection_method=None,
            initialization_timeout=timeout_seconds,
        )
    except Exception as e:  # each cluster fails its own way: KeyError, RuntimeError, HTTP errors
        message = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise DetectionError(
            f"jax detected a {name} launch but cannot find its processes ({message}); fix the "
            "cluster's setup or pass --coordinator_address, --num_processes and --process_id"
        ) from e
    return Launch(
        cluster=name,
        coordinator_address=address,
        num_processes=count,
        process_id=index,
        local_device_ids=tuple(ids) if ids else None,
    )


def found(launch: Launch | None) -> str | None:
    """The line a run prints at start when any launcher's variable is set: what cluster
    detection found (`launch`, from detect), or why this process runs alone and which variables
    it ignored; None when none is set (nothing to explain)."""
    if launch is not None:
        return (
            f"cluster: {launch.cluster} found {launch.num_processes} processes; this is process "
            f"{launch.process_id}, joining the coordinator {launch.coordinator_address}"
        )
    stray = cluster_variables()
    if not stray:
        return None
    env = present_cluster()
    if env is not None:
        why = f"jax's {env.__name__} counts one process here"
    else:
        missing = [
            f"{launcher} needs {', '.join(n for n in names if n not in os.environ)}"
            for launcher, names in LAUNCHERS.items()
            if launcher in ("SLURM", "Open MPI") and any(v.split("=")[0] in names for v in stray)
        ]
        why = "jax detects no launch here" + (f" ({'; '.join(missing)})" if missing else "")
        if any(v.startswith(("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")) for v in stray):
            why += "; a TPU slice is detected only on a Cloud TPU VM"
    return (
        f"cluster: {', '.join(stray)} set, but {why}: this process runs alone; unset them if "
        "they are left from another job, or pass --coordinator_address, --num_processes and "
        "--process_id"
    )
