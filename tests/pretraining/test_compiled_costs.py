"""compiled_costs: the TPU compiler's estimated cycles of a program, Pallas calls at their
roofline, the clocks that turn cycles into seconds, and the matmul FLOPs of a lowered program."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from electra_jax.pretraining import compiled_costs, dry_run, topology
from tests.pretraining.test_topology import libtpu_env, needs_libtpu  # noqa: F401  (a fixture)

pytestmark = [needs_libtpu, pytest.mark.usefixtures("libtpu_env")]


def _on(name: str):
    device = topology.compile_only_devices(topology.resolve(name))[0]
    return jax.sharding.SingleDeviceSharding(device)


def _compiled_text(fn, *args) -> str:
    with dry_run._without_persistent_cache():  # a compile-only executable is not cached
        return jax.jit(fn).lower(*args).compile().as_text()


@pytest.mark.parametrize("generation", topology.GENERATIONS, ids=lambda g: g.name)
def test_the_clock_puts_the_compilers_large_matmul_just_under_the_peak(generation):
    """A [4096, 4096] x [4096, 4096] bfloat16 matmul is as close to the peak as a program gets:
    at the table's clock the compiler's own estimate of it must be a large share of the
    documented peak and never above it. A clock too high (v6e's 3.5 GHz from its two
    documented MXUs) would put it above; one far too low, well below."""
    on = _on(f"{generation.cloud_names[0]}-8")
    n = 4096
    a = jax.ShapeDtypeStruct((n, n), jnp.bfloat16, sharding=on)
    program = compiled_costs.program_cycles(_compiled_text(lambda x, y: x @ y, a, a), generation)
    seconds = program.cycles / generation.clock_hz
    share = 2 * n**3 / (seconds * generation.bf16_flops_per_device)
    assert 0.6 <= share <= 1.0, share


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _pallas_double(x, cost):
    block = pl.BlockSpec((256, 128), lambda i: (i, 0))
    return pl.pallas_call(
        _double,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // 256,),
        in_specs=[block],
        out_specs=block,
        cost_estimate=cost,
    )(x)


def test_a_pallas_call_is_costed_at_its_own_roofline_never_at_zero():
    """The compiler gives a Pallas call 0 estimated cycles; its stated cost, read back from the
    compiled program, is costed at max(FLOPs / peak, bytes / bandwidth). A call that states no
    cost leaves the program without a count in cycles rather than counting it free."""
    gen = topology.resolve("v4-8").generation
    x = jax.ShapeDtypeStruct((1024, 128), jnp.float32, sharding=_on("v4-8"))
    cost = pl.CostEstimate(flops=10**9, transcendentals=0, bytes_accessed=2 * 1024 * 128 * 4)
    text = _compiled_text(lambda x: _pallas_double(x, cost) + 1.0, x)
    [kernel] = [r for r in compiled_costs.instructions(text) if r["kernel_target"]]
    assert kernel["cycles"] == 0  # what the compiler says of it
    assert kernel["kernel"] == {"flops": 1e9, "transcendentals": 0.0, "bytes_accessed": 1048576.0}
    program = compiled_costs.program_cycles(text, gen)
    # 1 GFLOP at 275 TFLOP/s is 3.6 us; 1 MB at 1.2 TB/s 0.87 us: compute-bound
    assert program.kernel_cycles == pytest.approx(1e9 / gen.bf16_flops_per_device * gen.clock_hz)
    assert program.kernels == 1 and program.uncosted_kernels == 0
    assert program.cycles == program.compiler_cycles + program.kernel_cycles
    assert program.compiler_cycles > 0  # the add after the kernel
    silent = compiled_costs.program_cycles(
        _compiled_text(lambda x: _pallas_double(x, None), x), gen
    )
    assert silent.cycles is None and silent.uncosted_kernels == 1


def test_a_loop_is_counted_per_trip_or_not_at_all():
    """A loop of 7 trips: where the compiled program states its trip count, its body counts 7
    times; where it does not (libtpu 0.0.42 states none), the program's time is not counted
    rather than counted with one trip."""
    gen = topology.resolve("v5e:2x2").generation
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=_on("v5e:2x2"))

    def loop(x):
        return jax.lax.fori_loop(0, 7, lambda i, y: jnp.tanh(y @ x), x)

    text = _compiled_text(loop, x)
    rows = compiled_costs.instructions(text)
    body = [r for r in rows if "while/body" in r["op_name"] and r["cycles"]]
    assert body
    program = compiled_costs.program_cycles(text, gen)
    if all(r["in_unknown_loop"] for r in body):
        assert program.cycles is None and program.unknown_loops >= len(body)
    else:
        assert {r["repeat"] for r in body} == {7} and program.unknown_loops == 0
        assert program.cycles == sum(r["cycles"] * r["repeat"] for r in rows)
    straight = compiled_costs.program_cycles(_compiled_text(lambda x: jnp.tanh(x @ x), x), gen)
    assert straight.unknown_loops == 0 and straight.cycles > 0


def test_matmul_flops_of_a_lowered_program_by_source_name():
    """Every dot_general of the lowered program, each call of a function counted, under the
    name stack of its source."""

    @jax.jit
    def inner(a, b):
        return jnp.einsum("bqd,bkd->bqk", a, b)

    def f(a, b):
        with jax.named_scope("scores"):
            s = inner(a, b) + inner(b, a)
        return s @ jnp.ones((16, 8))

    a = jnp.zeros((2, 16, 32))
    text = jax.jit(f).lower(a, a).as_text(debug_info=True)
    flops = compiled_costs.matmul_flops(text)
    scores = [n for name, n in flops if "scores" in name]
    assert scores == [2 * 2 * 16 * 16 * 32] * 2  # the jitted function's dot, called twice
    assert sum(n for _, n in flops) == 2 * (2 * 2 * 16 * 16 * 32) + 2 * 2 * 16 * 16 * 8
