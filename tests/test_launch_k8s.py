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
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    # The compilation cache on the bucket, beside the workdir.
    assert env["JAX_COMPILATION_CACHE_DIR"] == workdir.rsplit("/", 1)[0] + "/jax_compilation_cache"
    return env


def _check_job(jobset, replicated, job):
    # One Job per slice (GPU: one Job), Indexed (JOB_COMPLETION_INDEX, GKE's TPU webhook), every
    # pod needed to start.
    assert replicated["replicas"] >= 1
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


# The fields of the JobSet API (jobset.x-k8s.io/v1alpha2: kubernetes-sigs/jobset's
# api/jobset/v1alpha2/jobset_types.go) and of the batch/v1 Job and core/v1 Pod it embeds that
# launch/k8s/ uses or may come to use, each with its type: written here from those APIs, not
# the CRD's generated schema, which the suite does not carry. A key outside it (a typo, a field
# at the wrong level) or a value of the wrong type fails, as the API server's strict field
# validation would refuse it. int/str/bool: that type; {key: spec}: an object of those keys;
# [spec]: a list of them; dict: a map of any keys; a tuple: one of those values.
_STR_MAP = dict
_CONTAINER = {
    "name": str,
    "image": str,
    "command": [str],
    "args": [str],
    "workingDir": str,
    "env": [{"name": str, "value": str, "valueFrom": dict}],
    "ports": [{"containerPort": int, "name": str, "protocol": ("TCP", "UDP", "SCTP")}],
    "resources": {"limits": _STR_MAP, "requests": _STR_MAP},
    "securityContext": {"privileged": bool},
    "volumeMounts": [{"name": str, "mountPath": str, "readOnly": bool}],
}
_POD_SPEC = {
    "restartPolicy": ("Never", "OnFailure"),  # what a Job's pods may have
    "hostNetwork": bool,
    "dnsPolicy": ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"),
    "terminationGracePeriodSeconds": int,
    "nodeSelector": _STR_MAP,
    "serviceAccountName": str,
    "tolerations": [dict],
    "volumes": [dict],
    "containers": [_CONTAINER],
}
_META = {"name": str, "labels": _STR_MAP, "annotations": _STR_MAP}
_JOB_SPEC = {
    "parallelism": int,
    "completions": int,
    "completionMode": ("NonIndexed", "Indexed"),
    "backoffLimit": int,
    "template": {"metadata": _META, "spec": _POD_SPEC},
}
JOBSET_SCHEMA = {
    "apiVersion": ("jobset.x-k8s.io/v1alpha2",),
    "kind": ("JobSet",),
    "metadata": _META,
    "spec": {
        "replicatedJobs": [
            {
                "name": str,
                "replicas": int,
                "template": {"metadata": _META, "spec": _JOB_SPEC},
            }
        ],
        "network": {"enableDNSHostnames": bool, "subdomain": str, "publishNotReadyAddresses": bool},
        "failurePolicy": {
            "maxRestarts": int,
            "restartStrategy": ("Recreate", "BlockingRecreate", "InPlaceRestart"),
            "rules": [dict],
        },
        "successPolicy": {"operator": ("All", "Any"), "targetReplicatedJobs": [str]},
        "suspend": bool,
        "ttlSecondsAfterFinished": int,
    },
}


def schema_errors(value, spec, path="") -> list[str]:
    """Where `value` leaves `spec` (JOBSET_SCHEMA's form), as 'path: what' lines."""
    if isinstance(spec, tuple):
        return [] if value in spec else [f"{path}: {value!r} is not one of {spec}"]
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [e for i, v in enumerate(value) for e in schema_errors(v, spec[0], f"{path}[{i}]")]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        return [
            e
            for k, v in value.items()
            for e in (
                schema_errors(v, spec[k], f"{path}.{k}") if k in spec else [f"{path}.{k}: unknown"]
            )
        ]
    # bool is an int to Python, not to the API.
    ok = isinstance(value, spec) and (spec is bool or not isinstance(value, bool))
    return [] if ok else [f"{path}: {value!r} is not {spec.__name__}"]


@pytest.mark.parametrize("name", ["tpu_jobset.yaml", "gpu_jobset.yaml"])
def test_jobsets_keep_to_the_jobset_api(name):
    [jobset] = [d for d in _docs(name) if d["kind"] == "JobSet"]
    assert schema_errors(jobset, JOBSET_SCHEMA) == []


def test_the_schema_check_catches_a_misplaced_field():
    jobset, replicated, job, _ = _jobset(_docs("tpu_jobset.yaml"))
    replicated["parallelism"] = job.pop("parallelism")  # a Job's field one level up
    job["completionMode"] = "indexed"
    errors = sorted(schema_errors(jobset, JOBSET_SCHEMA))
    assert errors == [
        ".spec.replicatedJobs[0].parallelism: unknown",
        ".spec.replicatedJobs[0].template.spec.completionMode: 'indexed' is not one of "
        "('NonIndexed', 'Indexed')",
    ]
    assert schema_errors({"replicas": True}, {"replicas": int}) == [".replicas: True is not int"]


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


def _pod_env(container, labels: dict) -> dict:
    """The container's environment in a pod with these labels: the Downward API's
    metadata.labels['...'] and $(VAR) of the variables before it, as the kubelet resolves them."""
    env = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            [key] = re.fullmatch(
                r"metadata\.labels\['(.+)'\]", e["valueFrom"]["fieldRef"]["fieldPath"]
            ).groups()
            env[e["name"]] = labels[key]
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
    return env


@pytest.mark.parametrize("slices", [1, 2])
def test_the_slice_count_is_one_knob_and_one_run(no_cluster, slices):
    """The TPU JobSet with replicas: N and nothing else changed: still the JobSet API, and what
    each pod of it gets (GKE's worker list and index of its slice, MEGASCALE_* from its JobSet
    labels) makes the pods of all slices one run of N x parallelism processes with pod 0 of
    slice 0 as the coordinator."""
    monkeypatch = no_cluster
    docs = _docs("tpu_jobset.yaml")
    jobset, replicated, job, container = _jobset(docs)
    replicated["replicas"] = slices
    assert schema_errors(jobset, JOBSET_SCHEMA) == []
    _check_command(container)
    _check_job(jobset, replicated, job)
    # Each slice's Job on a node pool of its own.
    annotations = jobset["metadata"]["annotations"]
    assert (
        annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"]
        == "cloud.google.com/gke-nodepool"
    )
    name = jobset["metadata"]["name"]
    subdomain = jobset["spec"].get("network", {}).get("subdomain", name)
    per_slice = job["parallelism"]

    def host(slice_id, worker):  # the JobSet's pod hostnames
        return f"{name}-{replicated['name']}-{slice_id}-{worker}.{subdomain}"

    cluster_envs.on_tpu_vm(monkeypatch)
    cluster_envs.resolve_names(monkeypatch)
    with cluster_envs.metadata_server({"tpu-env": "ACCELERATOR_TYPE: 'v5litepod-16'\n"}) as where:
        monkeypatch.setenv("GCE_METADATA_IP", where)
        for slice_id in range(slices):
            # The labels JobSet puts on each pod of Job `slice_id`.
            labels = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(slices),
                "jobset.sigs.k8s.io/job-index": str(slice_id),
            }
            env = _pod_env(container, labels)
            assert env["MEGASCALE_COORDINATOR_ADDRESS"] == host(0, 0)
            for key in (
                "MEGASCALE_NUM_SLICES",
                "MEGASCALE_SLICE_ID",
                "MEGASCALE_COORDINATOR_ADDRESS",
            ):
                monkeypatch.setenv(key, env[key])
            for worker in range(per_slice):
                # What GKE's TPU webhook gives the pod: its slice's pods and its index there.
                hosts = [host(slice_id, w) for w in range(per_slice)]
                monkeypatch.setenv("TPU_WORKER_HOSTNAMES", ",".join(hosts))
                monkeypatch.setenv("TPU_WORKER_ID", str(worker))
                launch = cluster.detect(timeout_seconds=5)
                assert launch.cluster == "GkeTpuCluster"
                assert launch.coordinator_address == f"{host(0, 0)}:8482"
                assert launch.num_processes == slices * per_slice
                assert launch.process_id == slice_id * per_slice + worker


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
