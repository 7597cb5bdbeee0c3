"""Multi-process launches found by jax's own cluster detection (electra_jax/pretraining/cluster.py)
and train.py's start of jax.distributed with what each cluster gives; a single process never starts
it. jax.distributed.initialize is replaced by a recorder: nothing connects anywhere."""

import jax
import pytest
from absl import flags
from absl.testing import flagsaver
from jax._src import clusters

from electra_jax.pretraining import cluster
from tests import cluster_envs


@pytest.fixture
def start(monkeypatch):
    """Runs train.py's _maybe_initialize_distributed with the given flags; returns the kwargs of
    each jax.distributed.initialize call."""
    from electra_jax import train

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    before = jax.config.jax_cpu_collectives_implementation
    cluster_envs.scrub(monkeypatch)

    def run(*args):
        with flagsaver.flagsaver():
            flags.FLAGS(["train", "--peer_timeout_seconds=2", *args], known_only=True)
            train._maybe_initialize_distributed()
        return calls

    yield run
    jax.config.update("jax_cpu_collectives_implementation", before)


def _set(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _detected_by_jax():
    """What jax.distributed.initialize() would fill in by itself here."""
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 5)


def test_no_cluster_starts_nothing(start):
    assert cluster.present_cluster() is None
    assert start() == []


def test_slurm_of_one_task_starts_nothing(start, monkeypatch):
    _set(monkeypatch, cluster_envs.slurm(ntasks=1, procid=0, localid=0, nodelist="gpu001"))
    assert cluster.present_cluster() is clusters.SlurmCluster
    assert start() == []


def test_slurm_tasks_join_the_first_node(start, monkeypatch):
    env = cluster_envs.slurm(ntasks=16, procid=11, localid=3, nodelist="gpu[003-004],gpu009")
    _set(monkeypatch, env)
    [call] = start()
    address, n, i, ids = _detected_by_jax()
    assert address.startswith("gpu003:") and (n, i, ids) == (16, 11, [3])
    assert call == dict(
        coordinator_address=address,
        num_processes=16,
        process_id=11,
        local_device_ids=[3],  # SLURM_LOCALID: one GPU per task
        cluster_detection_method="deactivate",
        heartbeat_timeout_seconds=2,
        initialization_timeout=40,
    )
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "23456")  # jax's override of the port
    assert start()[-1]["coordinator_address"] == "gpu003:23456"


def test_open_mpi_ranks_join_the_launcher_host(start, monkeypatch):
    _set(
        monkeypatch,
        {
            "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        },
    )
    assert cluster.present_cluster() is clusters.OmpiCluster
    [call] = start()
    assert call["coordinator_address"].startswith("10.96.0.1:")
    assert (call["num_processes"], call["process_id"], call["local_device_ids"]) == (8, 5, [1])
    assert call["coordinator_address"] == _detected_by_jax()[0]


def test_open_mpi_5_ranks_are_one_line(start, monkeypatch, capsys):
    # Open MPI 5 (PRRTE) has no OMPI_MCA_orte_hnp_uri: jax does not see its ranks.
    _set(monkeypatch, {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"})
    with pytest.raises(SystemExit) as e:
        start()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Open MPI" in err and "--coordinator_address" in err


@pytest.mark.parametrize("slices", [1, 2])
def test_gke_tpu_slice_workers_join_worker_0(start, monkeypatch, slices):
    cluster_envs.on_tpu_vm(monkeypatch)
    asked = cluster_envs.resolve_names(monkeypatch)
    hosts = [f"run-slice-0-{i}.run" for i in range(4)]
    # GKE's TPU webhook sets TPU_WORKER_*; the slices' variables come from the JobSet (as in
    # launch/k8s/tpu_jobset.yaml; without them jax asks the metadata server's tpu-env).
    _set(
        monkeypatch,
        {
            "TPU_WORKER_HOSTNAMES": ",".join(hosts),
            "TPU_WORKER_ID": "3",
            "MEGASCALE_COORDINATOR_ADDRESS": hosts[0],
            "MEGASCALE_NUM_SLICES": str(slices),
            "MEGASCALE_SLICE_ID": str(slices - 1),
        },
    )
    assert cluster.present_cluster() is clusters.GkeTpuCluster
    [call] = start()
    # Worker 3 of the last slice is process 4 x (slices - 1) + 3; TPUs get no local_device_ids.
    expected_id = 3 + 4 * (slices - 1)
    assert call["coordinator_address"] == f"{hosts[0]}:8482" == _detected_by_jax()[0]
    assert (call["num_processes"], call["process_id"]) == (4 * slices, expected_id)
    assert call["local_device_ids"] is None
    assert hosts[0] in asked  # waited for worker 0's name to resolve


def test_single_host_tpu_vm_starts_nothing(start, monkeypatch):
    cluster_envs.on_tpu_vm(monkeypatch)
    _set(
        monkeypatch,
        {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0", "MEGASCALE_NUM_SLICES": "1"},
    )
    assert start() == []


def test_gce_tpu_vm_slice_workers_from_the_metadata_server(start, monkeypatch):
    cluster_envs.on_tpu_vm(monkeypatch)
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)  # set by jax here: no TPU chips
    attributes = {
        "agent-worker-number": "1",
        # The old format, name:id:ip; jax takes the ip.
        "worker-network-endpoints": "w:0:10.0.0.2,w:1:10.0.0.3",
        "tpu-env": "ACCELERATOR_TYPE: 'v4-16'\nWORKER_ID: '1'\n",
    }
    with cluster_envs.metadata_server(attributes) as where:
        monkeypatch.setenv("GCE_METADATA_IP", where)
        assert cluster.present_cluster() is clusters.GceTpuCluster
        [call] = start()
    assert call["coordinator_address"] == "10.0.0.2:8482"
    assert (call["num_processes"], call["process_id"], call["local_device_ids"]) == (2, 1, None)


def test_kubernetes_job_pods_join_pod_0(start, monkeypatch):
    asked = cluster_envs.resolve_names(monkeypatch)
    cluster_envs.kubernetes_api(
        monkeypatch,
        job_name="electra-gpu-workers-0",
        parallelism=3,
        labels={"jobset.sigs.k8s.io/jobset-name": "electra-gpu"},
    )
    _set(
        monkeypatch,
        {
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "HOSTNAME": "electra-gpu-workers-0-2",
            "JOB_COMPLETION_INDEX": "2",
        },
    )
    assert cluster.present_cluster() is clusters.K8sCluster
    [call] = start()
    assert call["coordinator_address"] == "electra-gpu-workers-0-0.electra-gpu:55527"
    assert (call["num_processes"], call["process_id"], call["local_device_ids"]) == (3, 2, None)
    assert "electra-gpu-workers-0-0.electra-gpu" in asked


@pytest.mark.parametrize("index", ["0", "2"])
def test_kubernetes_pod_without_the_kubernetes_package(start, monkeypatch, capsys, index):
    """Every pod says so, pod 0 too: it trained alone while the others failed."""
    cluster_envs.kubernetes_missing(monkeypatch)
    _set(monkeypatch, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": index})
    with pytest.raises(SystemExit) as e:
        start()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"pod {index} of a Kubernetes Indexed Job" in err and "jax[k8s]" in err


def test_a_pod_outside_an_indexed_job_trains_alone_without_a_word(start, monkeypatch, capsys):
    cluster_envs.kubernetes_missing(monkeypatch)
    _set(monkeypatch, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert start() == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "env, says",
    [
        ({"SLURM_NTASKS": "2"}, "SLURM needs SLURM_JOB_ID, SLURM_STEP_NODELIST"),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, "SLURM_STEP_NODELIST"),
        ({"TPU_WORKER_HOSTNAMES": "a,b"}, "only on a Cloud TPU VM"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "Open MPI needs OMPI_MCA_orte_hnp_uri"),
    ],
)
def test_a_stray_cluster_variable_is_named_and_the_run_goes_on_alone(
    start, monkeypatch, capsys, env, says
):
    _set(monkeypatch, env)
    assert start() == []
    [line] = capsys.readouterr().err.strip().splitlines()
    name, value = next(iter(env.items()))
    assert line.startswith("cluster: ") and f"{name}={value}" in line
    assert says in line and "this process runs alone" in line


def test_a_found_launch_and_a_cluster_of_one_are_one_line(start, monkeypatch, capsys):
    _set(monkeypatch, cluster_envs.slurm(ntasks=1, procid=0, localid=0, nodelist="gpu001"))
    assert start() == []
    assert "SlurmCluster counts one process here" in capsys.readouterr().err
    _set(monkeypatch, cluster_envs.slurm(ntasks=2, procid=1, localid=1, nodelist="gpu001"))
    [call] = start()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"cluster: SlurmCluster found 2 processes; this is process 1, joining the coordinator "
        f"{call['coordinator_address']}"
    )


@pytest.mark.parametrize(
    "name, value",
    [
        ("OMPI_COMM_WORLD_SIZE", "abc"),
        ("OMPI_COMM_WORLD_RANK", "-1"),
        ("JOB_COMPLETION_INDEX", "1.5"),
        ("TPU_WORKER_ID", "²"),
        ("SLURM_NTASKS", "0"),
    ],
)
def test_a_launchers_number_that_is_none_is_one_line(start, monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        start()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"environment variable {name}={value!r} is not a whole number" in err


def test_a_cluster_that_cannot_say_its_processes_is_one_line(start, monkeypatch, capsys):
    env = cluster_envs.slurm(ntasks=2, procid=0, localid=0, nodelist="gpu001")
    _set(monkeypatch, dict(env, SLURM_NTASKS="two"))
    with pytest.raises(SystemExit) as e:
        start()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "SLURM_NTASKS='two' is not a whole number" in err


def test_explicit_flags_win_over_the_cluster(start, monkeypatch):
    _set(monkeypatch, cluster_envs.slurm(ntasks=16, procid=11, localid=3, nodelist="gpu003"))
    [call] = start("--coordinator_address=10.9.9.9:1234", "--num_processes=2", "--process_id=1")
    assert call["coordinator_address"] == "10.9.9.9:1234"
    assert (call["num_processes"], call["process_id"]) == (2, 1)
    assert "cluster_detection_method" not in call
