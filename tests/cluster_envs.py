"""The environments jax's cluster detection (jax/_src/clusters/*.py, jax 0.10.2) reads, faked.

Each cluster is detected by jax's own code; only what cannot run here is faked: the variables
the cluster's launcher sets, a Cloud TPU VM's metadata server (a real HTTP server on
127.0.0.1 that jax's `requests` call reaches), the Kubernetes API (a stand-in for the
`kubernetes` package jax imports) and name resolution of hosts that do not exist here.

What each environment reads (jax 0.10.2):
- SlurmCluster: SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID.
- OmpiCluster (Open MPI 4's mpirun): OMPI_MCA_orte_hnp_uri, OMPI_COMM_WORLD_SIZE,
  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK.
- GkeTpuCluster (on a TPU VM): TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES, TPU_WORKER_ID,
  MEGASCALE_COORDINATOR_ADDRESS / MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID (else the metadata
  server's tpu-env).
- GceTpuCluster (on a TPU VM, TPU_SKIP_MDS_QUERY unset): the metadata server's
  agent-worker-number, worker-network-endpoints and tpu-env (GCE_METADATA_IP says where it is).
- K8sCluster: KUBERNETES_SERVICE_HOST, HOSTNAME, JOB_COMPLETION_INDEX, and through the API the
  pod's Job (its parallelism, its JobSet's name label).
All: JAX_COORDINATOR_PORT overrides the port each one picks.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import sys
import threading
import types

# Variables of the clusters above (and of the machines' own launchers) that a test's
# environment must not inherit.
_PREFIXES = ("SLURM_", "OMPI_", "PMIX_", "TPU_WORKER", "TPU_PROCESS", "MEGASCALE_", "KUBERNETES_")
_NAMES = ("JOB_COMPLETION_INDEX", "JAX_COORDINATOR_PORT", "JAX_COORDINATOR_ADDRESS", "HOSTNAME")


def scrub(monkeypatch) -> None:
    """No cluster: drop every variable a cluster environment reads."""
    for key in list(os.environ):
        if key.startswith(_PREFIXES) or key in _NAMES:
            monkeypatch.delenv(key)


def slurm(ntasks: int, procid: int, localid: int, nodelist: str, job_id: int = 4242) -> dict:
    """The variables srun gives one task of a job step."""
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NTASKS": str(ntasks),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
    }


def on_tpu_vm(monkeypatch) -> None:
    """What jax decided at import on a machine with TPU chips (here there are none)."""
    from jax._src.clusters import cloud_tpu_cluster, cluster

    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setattr(cluster, "running_in_cloud_tpu_vm", True)


def resolve_names(monkeypatch) -> list[str]:
    """Every host name resolves (none of the fakes' hosts exists); returns the names asked."""
    from jax._src.clusters import cloud_tpu_cluster, k8s_cluster

    asked: list[str] = []

    def gethostbyname(name):
        asked.append(name)
        return "10.1.2.3"

    fake = types.SimpleNamespace(gethostbyname=gethostbyname, gaierror=socket.gaierror)
    monkeypatch.setattr(cloud_tpu_cluster, "socket", fake)
    monkeypatch.setattr(k8s_cluster, "socket", fake)
    return asked


@contextlib.contextmanager
def metadata_server(attributes: dict[str, str]):
    """A GCE metadata server on 127.0.0.1 serving instance attributes; yields GCE_METADATA_IP."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            prefix = "/computeMetadata/v1/instance/attributes/"
            key = self.path[len(prefix) :] if self.path.startswith(prefix) else None
            ok = key in attributes and self.headers.get("Metadata-Flavor") == "Google"
            body = attributes[key].encode() if ok else b"not found"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def kubernetes_api(monkeypatch, *, job_name: str, parallelism: int, labels: dict[str, str]):
    """The `kubernetes` package jax imports, answering for one pod of one Job.

    job_name, parallelism: the pod's Job; labels: the Job's labels (a JobSet's Jobs carry
    jobset.sigs.k8s.io/jobset-name). Clears K8sCluster's cached answers first.
    """
    from jax._src.clusters import k8s_cluster

    ns = types.SimpleNamespace
    owner = ns(kind="Job", controller=True, name=job_name)
    pod = ns(
        metadata=ns(name=f"{job_name}-x", labels={"job-name": job_name}, owner_references=[owner]),
        spec=ns(subdomain=labels.get("jobset.sigs.k8s.io/jobset-name")),
    )
    job = ns(metadata=ns(name=job_name, labels=labels), spec=ns(parallelism=parallelism))

    class ApiException(Exception):
        pass

    class CoreV1Api:
        def list_namespaced_pod(self, namespace, field_selector):
            return ns(items=[pod])

        def list_namespaced_service(self, namespace):
            return ns(items=[])

    class BatchV1Api:
        def read_namespaced_job(self, name, namespace):
            assert name == job_name
            return job

    module = types.ModuleType("kubernetes")
    module.config = ns(load_incluster_config=lambda: None)
    module.client = ns(
        CoreV1Api=CoreV1Api, BatchV1Api=BatchV1Api, exceptions=ns(ApiException=ApiException)
    )
    monkeypatch.setitem(sys.modules, "kubernetes", module)
    # The service account's namespace file exists only in a pod.
    monkeypatch.setattr(k8s_cluster.K8sCluster, "_namespace", classmethod(lambda cls: "default"))
    # jax caches the pod and its Job for the process's life: another test's fake must not stay.
    for cached in ("_pod", "_job", "_headless_svc", "_controller"):
        getattr(k8s_cluster.K8sCluster, cached).__func__.cache_clear()


def kubernetes_missing(monkeypatch) -> None:
    """A pod whose image lacks the `kubernetes` package."""
    monkeypatch.setitem(sys.modules, "kubernetes", None)
