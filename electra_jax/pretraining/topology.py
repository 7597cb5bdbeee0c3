"""TPU slices by name: Cloud accelerator names (v4-128, v5litepod-16) and jax topology names
(v4:4x4x4), each chip generation's HBM and bfloat16 peak, and the compile-only devices of a
slice that is not there (for `--dry_run --topology`, which compiles with the TPU compiler on a
machine without a TPU).

Imports no jax at module level: a bad name is answered before jax starts.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import re

from electra_jax.errors import ConfigError

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU chip generation.

    name: jax's topology prefix ('v4'); cloud_names: the prefixes of Cloud accelerator types
    ('v4' in v4-128); cloud_counts: what a Cloud name's number counts ('cores' or 'chips');
    megacore: the chip's two TensorCores run as one jax device (else one device per core);
    dims: 2 (a torus of X x Y chips) or 3; per chip: HBM bytes, dense bfloat16 FLOP/s and HBM
    bytes/s; device_kinds: jax's Device.device_kind for it; source: where those figures are
    published. clock_hz: the TensorCore clock, which turns the compiler's estimated cycles into
    seconds (compiled_costs), with clock_source.
    """

    name: str
    cloud_names: tuple[str, ...]
    cloud_counts: str
    cores_per_chip: int
    megacore: bool
    dims: int
    hbm_bytes_per_chip: int
    bf16_flops_per_chip: float
    hbm_bytes_per_second_per_chip: float
    device_kinds: tuple[str, ...]
    source: str
    clock_hz: float
    clock_source: str

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.cores_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes_per_chip // self.devices_per_chip

    @property
    def bf16_flops_per_device(self) -> float:
        return self.bf16_flops_per_chip / self.devices_per_chip

    @property
    def hbm_bytes_per_second_per_device(self) -> float:
        return self.hbm_bytes_per_second_per_chip / self.devices_per_chip


# HBM, dense bfloat16 peak and HBM bandwidth per chip, from each generation's "System
# architecture" page of the Cloud TPU documentation (the URL in `source`), as of 2025.
# Clocks: v2, v3 and v4 as their papers publish them; Google publishes none for v5e, v5p and
# v6e, whose clock is the documented peak over what their documented MXUs do in a cycle (2 FLOPs
# per multiply-add of each MXU's cells). For v2-v4 that rule gives the published clocks within 2%
# (687, 938 and 1049 MHz). For v6e it gives 3.5 GHz from "two 256x256 MXUs", at which the
# compiler's own estimate for a large bfloat16 matmul would run at 141% of the peak: not
# credible; 1.75 GHz (four such MXUs' worth) is taken instead, the lower and so the more
# cautious of the two (a lower clock gives a lower ceiling), and tests/pretraining/
# test_compiled_costs.py holds every generation's compiler-estimated matmul between 60% and 100%
# of its peak at these clocks (v6e: 70%; the others 88-98%). TPU7x (Ironwood): its page publishes
# two TensorCores a chip, each a jax device of half the chip's figures (its "dual-chiplet"
# programming model; libtpu describes tpu7x:2x2x1 as 8 devices), and no MXU count or clock; the
# v6e rule (4 256x256 MXUs' worth per TensorCore) gives 2.2 GHz, at which the compiler's large
# matmul runs at 83% of the peak (libtpu 0.0.42.1).
_MXU_RULE = "the documented peak / (MXUs x 2 x MXU cells) FLOPs a cycle; "
_PAPERS = {
    "v2/v3": "Jouppi et al., A Domain-Specific Supercomputer for Training Deep Neural Networks, "
    "CACM 63(7), 2020",
    "v4": "Jouppi et al., TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning, "
    "ISCA 2023",
}
GENERATIONS = (
    Generation(
        "v2", ("v2",), "cores", 2, False, 2, 16 * GIB, 45e12, 700e9, ("TPU v2",),
        "https://cloud.google.com/tpu/docs/v2", 700e6, _PAPERS["v2/v3"],
    ),
    Generation(
        "v3", ("v3",), "cores", 2, False, 2, 32 * GIB, 123e12, 900e9, ("TPU v3",),
        "https://cloud.google.com/tpu/docs/v3", 940e6, _PAPERS["v2/v3"],
    ),
    Generation(
        "v4", ("v4",), "cores", 2, True, 3, 32 * GIB, 275e12, 1200e9, ("TPU v4",),
        "https://cloud.google.com/tpu/docs/v4", 1050e6, _PAPERS["v4"],
    ),
    Generation(
        "v5e", ("v5litepod", "v5e"), "chips", 1, False, 2, 16 * GIB, 197e12, 819e9,
        ("TPU v5 lite", "TPU v5e"),
        "https://cloud.google.com/tpu/docs/v5e", 197e12 / (4 * 2 * 128**2),
        _MXU_RULE + "1 TensorCore of 4 128x128 MXUs (the source's page)",
    ),
    Generation(
        "v5p", ("v5p",), "cores", 2, True, 3, 95 * GIB, 459e12, 2765e9, ("TPU v5p", "TPU v5"),
        "https://cloud.google.com/tpu/docs/v5p", 459e12 / (2 * 4 * 2 * 128**2),
        _MXU_RULE + "2 TensorCores of 4 128x128 MXUs (the source's page)",
    ),
    Generation(
        "v6e", ("v6e",), "chips", 1, False, 2, 32 * GIB, 918e12, 1640e9, ("TPU v6 lite", "TPU v6e"),
        "https://cloud.google.com/tpu/docs/v6e", 918e12 / (4 * 2 * 256**2),
        _MXU_RULE + "4 256x256 MXUs' worth: the page's two would need 3.5 GHz, see above",
    ),
    Generation(
        "tpu7x", ("tpu7x",), "cores", 2, False, 3, 192 * GIB, 2307e12, 7380e9, ("TPU7x",),
        "https://cloud.google.com/tpu/docs/tpu7x", 2307e12 / (2 * 4 * 2 * 256**2),
        _MXU_RULE + "per TensorCore 4 256x256 MXUs' worth, as v6e's (none published)",
    ),
)  # fmt: skip

ACCEPTED = (
    "a Cloud accelerator name (v3-512, v4-128, v5litepod-16 or v5e-16, v5p-128, v6e-64, "
    "tpu7x-8) or a jax topology name (v4:4x4x4, v5e:2x2, v6e:8x8, tpu7x:2x2x1); generations "
    + ", ".join(g.name for g in GENERATIONS)
)
INSTALL = "pip install -e '.[tpu]'"


def generation_for_kind(device_kind: str) -> Generation | None:
    """The generation whose jax device_kind this is ('TPU v5 lite' -> v5e), else None."""
    kind = device_kind.lower()
    # Longest names first: 'TPU v5' is also the start of 'TPU v5 lite'.
    pairs = sorted(
        ((k.lower(), g) for g in GENERATIONS for k in g.device_kinds), key=lambda p: -len(p[0])
    )
    for name, gen in pairs:
        if name in kind:
            return gen
    return None


@dataclasses.dataclass(frozen=True)
class Target:
    """A slice to compile for: `num_slices` slices of `chips` chips each of `generation`.

    topology_name: jax's name ('v4:4x4x4'); asked_as: the name the user gave.
    """

    generation: Generation
    topology_name: str
    chips: int
    num_slices: int
    asked_as: str

    @property
    def devices(self) -> int:
        return self.chips * self.generation.devices_per_chip * self.num_slices

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology_name.split(":")[1].split("x"))

    def host_bounds(self) -> tuple[int, int, int]:
        """The chips of one host of this slice, as libtpu needs them: 2x2 (x1), a v5e / v6e
        slice of one 8-chip host 2x4, and a slice smaller than a host (v5litepod-1, v5e-2)
        all of it, which libtpu otherwise refuses as "not divisible" by 2x2."""
        shape = (*self.shape, 1, 1)[:3]
        if self.generation.name in ("v5e", "v6e") and shape == (2, 4, 1):
            return (2, 4, 1)  # v5litepod-8 / v6e-8: one 8-chip host
        return tuple(min(b, d) for b, d in zip(_HOST, shape, strict=True))

    def topology_kwargs(self) -> dict:
        """get_topology_desc's keyword arguments for this slice as it runs."""
        kwargs = {"num_slices": self.num_slices}
        if self.generation.megacore:
            # One jax device per chip, 4 chips per host, as a v4 / v5p slice runs; without
            # these libtpu describes one device per core.
            kwargs.update(chip_config_name="megacore", wrap=(False, False, False))
        if self.generation.megacore or self.host_bounds() != _HOST:
            kwargs["chips_per_host_bounds"] = self.host_bounds()
        return kwargs


# The chips of one host of a TPU slice, libtpu's default (x, y, z).
_HOST = (2, 2, 1)


def _shape(chips: int, dims: int) -> tuple[int, ...]:
    """A power-of-two chip count as the slice's torus shape, as Cloud lays it: in 3-D 4 chips
    -> (2, 2, 1), 16 -> (2, 2, 4), 64 -> (4, 4, 4); in 2-D 8 -> (2, 4), 256 -> (16, 16)."""
    shape = [2, 2, 1] if dims == 3 else [1, 1]
    while math.prod(shape) < chips:
        smallest = min(shape)
        shape[max(i for i, d in enumerate(shape) if d == smallest)] *= 2
    return tuple(shape)


def resolve(name: str, num_slices: int = 1) -> Target:
    """The slice a name describes; ConfigError (one line listing the accepted forms) if none.

    'v4-128' (128 TensorCores: 64 chips) -> v4:4x4x4; 'v5litepod-16' (16 chips) -> v5e:4x4;
    'v4:4x4x4' is taken as it is.
    """
    if num_slices < 1:
        raise ConfigError(f"--num_slices={num_slices} must be >= 1")
    text = name.strip().lower()
    by_prefix = {p: g for g in GENERATIONS for p in (g.name, *g.cloud_names)}
    jax_form = re.fullmatch(r"([a-z]\w*?):(\d+(?:x\d+)*)", text)
    cloud_form = re.fullmatch(r"([a-z]\w*?)-(\d+)", text)
    if jax_form and jax_form.group(1) in by_prefix:
        gen = by_prefix[jax_form.group(1)]
        shape = tuple(int(d) for d in jax_form.group(2).split("x"))
        if len(shape) != gen.dims or 0 in shape:
            raise ConfigError(
                f"--topology={name}: {gen.name} slices are {gen.dims}-D chip grids such as "
                f"{gen.name}:{'x'.join(map(str, _shape(16, gen.dims)))}; accepted: {ACCEPTED}"
            )
        return _whole_hosts(Target(gen, f"{gen.name}:{'x'.join(map(str, shape))}",
                                   math.prod(shape), num_slices, name))  # fmt: skip
    if cloud_form and cloud_form.group(1) in by_prefix:
        gen = by_prefix[cloud_form.group(1)]
        count = int(cloud_form.group(2))
        per_chip = gen.cores_per_chip if gen.cloud_counts == "cores" else 1
        chips, smallest = count // per_chip, 4 if gen.dims == 3 else 1
        if count % per_chip or chips < smallest or chips & (chips - 1):
            raise ConfigError(
                f"--topology={name}: a {gen.name} slice's number counts its {gen.cloud_counts} "
                f"and is a power of two of at least {smallest * per_chip}; accepted: {ACCEPTED}"
            )
        shape = _shape(chips, gen.dims)
        return _whole_hosts(
            Target(gen, f"{gen.name}:{'x'.join(map(str, shape))}", chips, num_slices, name)
        )
    raise ConfigError(f"--topology={name} is not a TPU slice name; accepted: {ACCEPTED}")


def _whole_hosts(target: Target) -> Target:
    """`target` when libtpu can describe it: a slice of several hosts is made of whole hosts
    (v5e:4x3 is not: 3 is no multiple of a host's 2); ConfigError otherwise, naming the form
    that is."""
    bounds = target.host_bounds()
    shape = (*target.shape, 1, 1)[:3]
    if any(d % b for d, b in zip(shape, bounds, strict=True)):
        gen = target.generation
        host = "x".join(map(str, bounds[: len(target.shape)]))
        example = f"{gen.name}:{'x'.join(map(str, _shape(16, gen.dims)))}"
        raise ConfigError(
            f"--topology={target.asked_as} ({target.topology_name}) is no whole number of "
            f"{gen.name} hosts of {host} chips in each dimension; give a slice that is (e.g. "
            f"{example}); accepted: {ACCEPTED}"
        )
    return target


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """ConfigError naming the extra to install when libtpu, the TPU compiler, is absent."""
    if not libtpu_installed():
        raise ConfigError(
            f"--topology needs the TPU compiler (libtpu), which is not installed: {INSTALL}"
        )


def on_tpu_host() -> bool:
    """Whether TPU chips are attached to this machine: a PCI device of Google's vendor id, the
    check jax's own hardware_utils makes (read here without importing jax)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":
                    return True
        except OSError:
            continue
    return False


def quiet_libtpu(target: Target | None = None) -> None:
    """Keeps libtpu's start-up warnings off a machine without TPUs.

    Where libtpu is installed (the [tpu] extra), jax loads it when it starts its backends, and
    libtpu then asks the TPU VM's metadata server for the accelerator type and the worker list;
    on any other machine it prints two warnings, from C++ before anything of ours could catch
    them. Naming both first silences them: the slice compiled for (`target`) or a one-host
    stand-in. Nothing is set where already set, nor on a TPU host, whose metadata server
    answers. Call before jax starts its backends.
    """
    if not libtpu_installed() or on_tpu_host():
        return
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", cloud_name(target) if target else "v4-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def compile_only_devices(target: Target) -> list:
    """The jax devices of `target`, for ahead-of-time compiles only (nothing is allocated on
    them; no TPU needed). ConfigError naming the extra when libtpu, the TPU compiler, is absent.
    """
    require_libtpu()
    # Before libtpu's first load in this process. Compile-only devices touch no chip, so the
    # lock file that keeps two processes off one TPU does not apply (the test suite's two
    # workers both load it).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    quiet_libtpu(target)
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=target.topology_name, **target.topology_kwargs()
        )
    except Exception as e:  # noqa: BLE001 (libtpu's JaxRuntimeError, whose words vary by version)
        # What resolve accepted and libtpu still refuses: one line, not its traceback.
        raise ConfigError(
            f"--topology={target.asked_as}: the TPU compiler cannot describe the slice "
            f"{target.topology_name} ({' '.join(str(e).split())[:200]}); accepted: {ACCEPTED}"
        ) from e
    return list(desc.devices)


def cloud_name(target: Target) -> str:
    """The Cloud accelerator type of one slice of `target` (v4:4x4x4 -> v4-128)."""
    gen = target.generation
    count = target.chips * (gen.cores_per_chip if gen.cloud_counts == "cores" else 1)
    return f"{gen.cloud_names[0]}-{count}"
