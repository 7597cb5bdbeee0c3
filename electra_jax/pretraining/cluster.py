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


def _kubernetes_peer_alone() -> bool:
    """A pod of an Indexed Job other than the first: surely one of several pods.

    (Pod 0 may be the only one, e.g. a single-node JobSet, and then trains alone.)
    """
    return "KUBERNETES_SERVICE_HOST" in os.environ and os.environ.get(
        "JOB_COMPLETION_INDEX", "0"
    ) not in ("", "0")


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

    env = present_cluster()
    if env is None:
        if _kubernetes_peer_alone():
            raise DetectionError(
                f"this process is pod {os.environ['JOB_COMPLETION_INDEX']} of a Kubernetes "
                "Indexed Job, but jax finds the other pods "
                "through the Kubernetes API and the `kubernetes` package is not installed: "
                "install jax[k8s] in the image (launch/k8s/ says how), or pass "
                "--coordinator_address, --num_processes and --process_id"
            )
        if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
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
