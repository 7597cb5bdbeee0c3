"""launch/k8s/'s JobSets, offline: each parses, names the image, the train command with a
gs:// workdir, and what the pods get; and what Kubernetes and GKE give each pod of them, fed to
jax's own cluster detection (electra_jax.pretraining.cluster.detect, as train.py calls it),
makes every pod one process of one run with pod 0 as the coordinator."""

import math
import re
import shlex

import pytest
import yaml

from electra_jax.pretraining import cluster
from tests import cluster_envs
from tests.conftest import ROOT

K8S = ROOT / "launch" / "k8s"


def _docs(name):
    return list(yaml.safe_load_all((K8S / name).read_text()))


def _jobset(docs):
    [jobset] = [d for d in docs if d["kind"] == "JobSet"]
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    [replicated] = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    [container] = job["template"]["spec"]["containers"]
    return jobset, replicated, job, container


def _check_command(container):
    assert re.fullmatch(r"[a-z0-9.-]+(/[\w.-]+)+:[\w.-]+", container["image"]), container["image"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "electra_jax.train"]
    [config] = [a for a in command if a.startswith("--config=")]
    assert (ROOT / config.split("=", 1)[1]).is_file()
    [workdir] = [a.split("=", 1)[1] for a in command if a.startswith("--workdir=")]
    assert workdir.startswith("gs://")
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    # The compilation cache on the bucket, beside the workdir.
    assert env["JAX_COMPILATION_CACHE_DIR"] == workdir.rsplit("/", 1)[0] + "/jax_compilation_cache"
    return env


def _check_job(jobset, replicated, job):
    # One Job, Indexed (JOB_COMPLETION_INDEX, GKE's TPU webhook), every pod needed to start.
    assert replicated["replicas"] == 1
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"] > 1
    # A preempted or repaired node restarts the whole JobSet, which resumes from the bucket.
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] > 0
    assert job["template"]["spec"]["terminationGracePeriodSeconds"] >= 60


def _pods(jobset, replicated, job):
    """Each pod's hostname and the JobSet's headless service (its subdomain)."""
    name = jobset["metadata"]["name"]
    subdomain = jobset["spec"].get("network", {}).get("subdomain", name)
    job_name = f"{name}-{replicated['name']}-0"
    return [f"{job_name}-{i}" for i in range(job["parallelism"])], subdomain, job_name


@pytest.fixture
def no_cluster(monkeypatch):
    cluster_envs.scrub(monkeypatch)
    return monkeypatch


def test_tpu_jobset_makes_the_slice_one_run(no_cluster):
    monkeypatch = no_cluster
    jobset, replicated, job, container = _jobset(_docs("tpu_jobset.yaml"))
    _check_command(container)
    _check_job(jobset, replicated, job)
    pod = job["template"]["spec"]
    chips = container["resources"]["limits"]["google.com/tpu"]
    topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"]
    # One pod per VM of the slice: the topology's chips over the chips of a VM.
    assert job["parallelism"] * chips == math.prod(int(n) for n in topology.split("x"))
    hosts, subdomain, _ = _pods(jobset, replicated, job)
    cluster_envs.on_tpu_vm(monkeypatch)
    cluster_envs.resolve_names(monkeypatch)
    # A GKE TPU node's metadata: its tpu-env, without MEGASCALE_* for a single slice.
    with cluster_envs.metadata_server({"tpu-env": "ACCELERATOR_TYPE: 'v5litepod-16'\n"}) as where:
        monkeypatch.setenv("GCE_METADATA_IP", where)
        for i in range(len(hosts)):
            # What GKE's TPU webhook gives pod i of an Indexed Job with a subdomain.
            monkeypatch.setenv("TPU_WORKER_HOSTNAMES", ",".join(f"{h}.{subdomain}" for h in hosts))
            monkeypatch.setenv("TPU_WORKER_ID", str(i))
            launch = cluster.detect(timeout_seconds=5)
            assert launch.cluster == "GkeTpuCluster"
            assert launch.coordinator_address == f"{hosts[0]}.{subdomain}:8482"
            assert (launch.num_processes, launch.process_id) == (len(hosts), i)


def test_gpu_jobset_makes_the_nodes_one_run(no_cluster):
    monkeypatch = no_cluster
    docs = _docs("gpu_jobset.yaml")
    jobset, replicated, job, container = _jobset(docs)
    env = _check_command(container)
    _check_job(jobset, replicated, job)
    pod = job["template"]["spec"]
    assert not pod.get("hostNetwork")  # jax finds the pod by its own IP
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    # The service account may read what jax's Kubernetes detection asks the API server for.
    by_kind = {d["kind"]: d for d in docs}
    account = pod["serviceAccountName"]
    assert by_kind["ServiceAccount"]["metadata"]["name"] == account
    binding = by_kind["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    rules = {
        (g, r): set(rule["verbs"])
        for rule in by_kind["Role"]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"get", "list"} <= rules[("", "pods")] and "get" in rules[("batch", "jobs")]
    # The same XLA flags as launch/slurm.sbatch (one list, tested against this jaxlib there).
    sbatch = (ROOT / "launch" / "slurm.sbatch").read_text()
    [defaults] = re.findall(r'export XLA_FLAGS="(.*?)\$\{XLA_FLAGS', sbatch, re.S)
    assert env["XLA_FLAGS"].split() == shlex.split(defaults.replace("\\\n", " "))

    hosts, subdomain, job_name = _pods(jobset, replicated, job)
    cluster_envs.resolve_names(monkeypatch)
    cluster_envs.kubernetes_api(
        monkeypatch,
        job_name=job_name,
        parallelism=job["parallelism"],
        labels={"jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"]},
    )
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    for i, host in list(enumerate(hosts))[:: len(hosts) - 1]:  # the first pod and the last
        # What Kubernetes gives pod i of an Indexed Job.
        monkeypatch.setenv("HOSTNAME", host)
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(i))
        launch = cluster.detect(timeout_seconds=5)
        assert launch.cluster == "K8sCluster"
        assert launch.coordinator_address == f"{hosts[0]}.{subdomain}:55527"
        assert (launch.num_processes, launch.process_id) == (len(hosts), i)
        assert launch.local_device_ids is None  # one process drives every GPU of its node
