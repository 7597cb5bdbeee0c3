"""topology: slice names, the chip table, and the compile-only devices of a slice."""

import math

import pytest

from electra_jax.errors import ConfigError
from electra_jax.pretraining import topology
from tests.conftest import run_python

needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_installed(),
    reason=f"the TPU compiler (libtpu) is not installed: {topology.INSTALL}",
)


@pytest.fixture
def libtpu_env(monkeypatch):
    """The variables compile_only_devices sets for libtpu, put back as they were afterwards (so
    that no later test, or command it starts, inherits them)."""
    for name in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "ALLOW_MULTIPLE_LIBTPU_LOAD"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "name, jax_name, chips",
    [
        ("v4-128", "v4:4x4x4", 64),  # counts TensorCores: two per chip
        ("v4-8", "v4:2x2x1", 4),
        ("v5p-128", "v5p:4x4x4", 64),
        ("v3-512", "v3:16x16", 256),
        ("v5litepod-16", "v5e:4x4", 16),  # counts chips
        ("v5e-8", "v5e:2x4", 8),
        ("v6e-64", "v6e:8x8", 64),
        ("tpu7x-8", "tpu7x:2x2x1", 4),  # counts TensorCores: two per chip
        ("tpu7x-128", "tpu7x:4x4x4", 64),
        ("v4:4x4x4", "v4:4x4x4", 64),  # jax's own names pass through
        ("V5E:2x2", "v5e:2x2", 4),
    ],
)
def test_cloud_and_jax_names(name, jax_name, chips):
    target = topology.resolve(name)
    assert (target.topology_name, target.chips) == (jax_name, chips)
    # Back to the Cloud name of the same slice.
    assert topology.resolve(topology.cloud_name(target)).topology_name == jax_name


@pytest.mark.parametrize("name", ["v4-6", "v9-8", "v4:2x2", "tpu", "v5p-4", "v5e-0"])
def test_a_bad_name_is_one_line_listing_the_accepted_forms(name):
    with pytest.raises(ConfigError) as e:
        topology.resolve(name)
    assert f"--topology={name}" in str(e.value) and topology.ACCEPTED in str(e.value)
    assert "\n" not in str(e.value)


def test_the_table_per_device():
    for gen in topology.GENERATIONS:
        assert gen.source.startswith("https://cloud.google.com/tpu/docs/")
        # A megacore chip is one device; otherwise each core is one, with half the chip.
        per = 1 if gen.megacore else gen.cores_per_chip
        assert gen.bf16_flops_per_device * per == gen.bf16_flops_per_chip
        assert gen.hbm_bytes_per_device * per == gen.hbm_bytes_per_chip
        for kind in gen.device_kinds:
            assert topology.generation_for_kind(kind) is gen
    assert topology.generation_for_kind("cpu") is None


def test_without_libtpu_the_line_names_the_extra(monkeypatch):
    monkeypatch.setattr(topology.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[tpu\]'"):
        topology.compile_only_devices(topology.resolve("v5e:2x2"))


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_megacore_slices_run_one_device_per_chip():
    target = topology.resolve("v4-128")
    devices = topology.compile_only_devices(target)
    assert len(devices) == target.chips and {d.device_kind for d in devices} == {"TPU v4"}
    assert len({d.process_index for d in devices}) == target.chips // 4  # 4 chips a host
    # v5litepod-8 is one host of 8 chips; larger v5e slices have 4 chips a host.
    assert (
        len({d.process_index for d in topology.compile_only_devices(topology.resolve("v5e-8"))})
        == 1
    )
    assert (
        len({d.process_index for d in topology.compile_only_devices(topology.resolve("v5e-16"))})
        == 4
    )
    # TPU7x: each of a chip's two TensorCores is a device, 4 chips a host.
    target = topology.resolve("tpu7x-16")
    devices = topology.compile_only_devices(target)
    assert len(devices) == target.devices == 2 * target.chips == 16
    assert {d.device_kind for d in devices} == {"TPU7x"}
    assert len({d.process_index for d in devices}) == 2
    two = topology.resolve("v5e:2x2", num_slices=2)
    devices = topology.compile_only_devices(two)
    assert len(devices) == two.devices == 2 * math.prod((2, 2))
    assert sorted({d.slice_index for d in devices}) == [0, 1]


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_libtpu_says_nothing_on_stderr():
    # A fresh process, as a user's: libtpu's first load prints its warnings about the TPU VM's
    # metadata before anything of ours could catch them, unless the variables are set first.
    out = run_python(
        "-c",
        "from electra_jax.pretraining import topology\n"
        "print(len(topology.compile_only_devices(topology.resolve('v4-16'))))",
        timeout=120,
        fresh=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8" and out.stderr == ""


@pytest.mark.usefixtures("libtpu_env")
def test_quiet_libtpu_names_a_stand_in_only_off_a_tpu_host(monkeypatch):
    import os

    monkeypatch.setattr(topology, "libtpu_installed", lambda: True)
    monkeypatch.setattr(topology, "on_tpu_host", lambda: True)
    topology.quiet_libtpu()  # a TPU VM: its metadata server answers libtpu
    assert "TPU_ACCELERATOR_TYPE" not in os.environ
    monkeypatch.setattr(topology, "on_tpu_host", lambda: False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3")  # set by the user: kept
    topology.quiet_libtpu(topology.resolve("v5e:4x4"))
    assert os.environ["TPU_ACCELERATOR_TYPE"] == "v5litepod-16"
    assert os.environ["TPU_WORKER_HOSTNAMES"] == "10.0.0.2,10.0.0.3"


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_a_command_on_a_machine_without_tpus_prints_only_its_line():
    # jax starts its backends (the mesh over this machine's devices) with libtpu installed.
    out = run_python(
        "-m", "electra_jax.train", "--config=configs/tiny.py", "--dry_run",
        "--config.mesh.fsdp=7", timeout=120, fresh=True,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "mesh.fsdp=7 does not divide" in out.stderr


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
@pytest.mark.parametrize("name", ["v5e-1", "v5litepod-1", "v6e-1", "v5e:2x1", "v4:1x1x1"])
def test_a_slice_smaller_than_a_host_is_described(name):
    """What resolve accepts, the compiler's topology describes: a one-chip v5litepod-1 (a real
    Cloud type) was accepted and then ended in libtpu's "not divisible by 2x2x1"."""
    target = topology.resolve(name)
    assert len(topology.compile_only_devices(target)) == target.chips


@pytest.mark.parametrize("name", ["v5e:4x3", "v4:3x4x4", "v6e:3x2"])
def test_a_slice_of_part_hosts_is_one_line(name):
    with pytest.raises(ConfigError, match="is no whole number of .* hosts of 2x2") as e:
        topology.resolve(name)
    assert topology.ACCEPTED in str(e.value) and "\n" not in str(e.value)


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_what_libtpu_still_refuses_is_one_line(monkeypatch):
    from jax.experimental import topologies

    def refuse(**kwargs):
        raise RuntimeError("INVALID_ARGUMENT: no such\nslice")

    monkeypatch.setattr(topologies, "get_topology_desc", refuse)
    with pytest.raises(ConfigError, match=r"cannot describe the slice v5e:2x2 \(.*no such slice\)"):
        topology.compile_only_devices(topology.resolve("v5e-4"))
