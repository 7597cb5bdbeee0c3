"""flash_attention (Pallas TPU kernels) against kernels.attention_core, whose function it computes:
values and q/k/v gradients in interpret mode on the CPU, the dropout mask element for element,
the kernels compiled by libtpu for each TPU generation (compile-only devices), their cost
numbers against a hand count, and model.attention='pallas' in the model (TPU only)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.errors import ConfigError
from electra_jax.model import flash_attention as fa
from electra_jax.model import kernels
from electra_jax.model.networks import ElectraSpec, EncoderSpec, TransformerLayer
from electra_jax.pretraining import topology
from tests.conftest import micro_config


def _inputs(batch, heads, length, head_dim, dtype):
    """q, k, v, a cotangent g [batch, heads, length, head_dim] and the padding bias: batch row 0
    has its last 37 keys padded, row 1 all of them (a softmax over padding only), the others
    none."""
    q, k, v, g = (jax.random.normal(key, (batch, heads, length, head_dim)).astype(dtype)
                  for key in jax.random.split(jax.random.PRNGKey(0), 4))  # fmt: skip
    real = np.array([length - 37, 0] + [length] * (batch - 2))
    bias = np.where(np.arange(length)[None] < real[:, None], 0.0, -1e9).astype(np.float32)
    return q, k, v, g, jnp.asarray(bias[:, None, None, :])


def _value_and_grads(f, q, k, v, g):
    """f(q, k, v) and the gradients of sum(f(q, k, v) * g) in q, k and v, compiled."""

    def both(q, k, v, g):
        out, pullback = jax.vjp(f, q, k, v)
        return (out, *pullback(g))

    return jax.jit(both)(q, k, v, g)


@pytest.mark.parametrize(
    "heads,length,dtype,rate,block_q,block_k",
    [
        (2, 128, jnp.float32, 0.0, None, None),  # one block each way; both heads in one
        (2, 128, jnp.float32, 0.1, None, None),
        (1, 512, jnp.float32, 0.1, None, None),  # 2 query blocks of 256, one key block
        (2, 512, jnp.float32, 0.1, 128, 128),  # online softmax; the dk / dv and dq kernels
        (2, 128, jnp.bfloat16, 0.1, None, None),
        (1, 512, jnp.bfloat16, 0.1, 128, 256),
    ],
)
def test_matches_attention_core(heads, length, dtype, rate, block_q, block_k):
    """Output and q/k/v gradients equal attention_core's: float32 within 1e-5 (relative where
    values exceed 1), bfloat16 within two roundings of the largest value, dropout on and off,
    with padded keys and a row of padding only; heads of 64 two to a block (128 lanes)."""
    q, k, v, g, bias = _inputs(2, heads, length, 64, dtype)
    key = jax.random.PRNGKey(7)
    ours = _value_and_grads(
        lambda q, k, v: fa.flash_attention(
            q, k, v, bias, key, rate, block_q=block_q, block_k=block_k, interpret=True
        ),
        q, k, v, g,
    )  # fmt: skip
    core = _value_and_grads(
        lambda q, k, v: kernels.attention_core(q, k, v, bias, key, rate), q, k, v, g
    )
    for name, a, b in zip(("output", "dq", "dk", "dv"), ours, core, strict=True):
        assert a.dtype == dtype, name
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        if dtype == jnp.float32:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            atol = 2 * 2.0**-8 * np.max(np.abs(b))
            np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=name)
    # The padding-only row attends to every key alike, as attention_core's does (not NaN).
    assert np.all(np.isfinite(np.asarray(ours[0], np.float32)))


def test_the_dropout_mask_is_attention_cores_element_for_element():
    """With v = identity the output rows are the dropped probabilities themselves, and with
    the cotangent = identity dv is their transpose: the forward kernel's and the backward's
    zeros are exactly where kernels.keep_and_scale drops, over several blocks each way, batch
    rows and heads. A shard's kernel (batch offset 1, as under shard_map) draws the mask of its
    rows of the whole batch."""
    batch, heads, length, rate = 2, 2, 256, 0.25
    q, k, _, _, _ = _inputs(batch, heads, length, length, jnp.float32)
    eye = jnp.broadcast_to(jnp.eye(length), q.shape)
    bias = jnp.zeros((batch, 1, 1, length))
    key = jax.random.PRNGKey(3)
    keep, _ = kernels.keep_and_scale(key, (batch, heads, length, length), rate, jnp.float32)
    keep = np.asarray(keep)
    assert 0.2 < 1 - keep.mean() < 0.3

    def flash(q, k, v, bias, batch_offset):
        shape = fa._shape_of(q, rate, 128, 128)
        return fa._attention(q, k, v, bias, key, batch_offset, shape, True)

    out, dq, dk, dv = _value_and_grads(lambda q, k, v: flash(q, k, v, bias, 0), q, k, eye, eye)
    np.testing.assert_array_equal(np.asarray(out) != 0, keep)
    np.testing.assert_array_equal(np.swapaxes(np.asarray(dv), -1, -2) != 0, keep)
    core = _value_and_grads(
        lambda q, k, v: kernels.attention_core(q, k, v, bias, key, rate), q, k, eye, eye
    )
    for a, b in zip((out, dq, dk, dv), core, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    shard = jax.jit(flash)(q[1:], k[1:], eye[1:], bias[1:], 1)
    np.testing.assert_array_equal(np.asarray(shard) != 0, keep[1:])


def _tpu_device(name):
    return topology.compile_only_devices(topology.resolve(name))[0]


def _custom_call_costs(hlo: str) -> dict[str, dict[str, int]]:
    """{pallas_call name: its cost_estimate} from the tpu_custom_calls of compiled HLO text
    (libtpu writes it into the custom call's backend_config, the numbers as strings)."""
    found = {}
    for line in hlo.splitlines():
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        name = next(n for n in (fa.BACKWARD_DKV, fa.BACKWARD_DQ, fa.BACKWARD, fa.FORWARD)
                    if n in line.split("=")[0])  # fmt: skip
        estimate = re.search(r'"cost_estimate":\{([^}]*)\}', line).group(1)
        found[name] = {k: int(v) for k, v in re.findall(r'"(\w+)":"(\d+)"', estimate)}
        assert found[name].pop("remote_bytes_transferred") == 0
    return found


@pytest.mark.parametrize(
    "generation,block_q,block_k",
    [("v4-8", None, None), ("v5e-4", None, None), ("v5p-8", None, None), ("v6e-4", 128, 128)],
)
def test_compiles_for_each_tpu_generation_with_its_cost_estimates(generation, block_q, block_k):
    """libtpu (Mosaic) compiles the forward and backward kernels (one jit of a grad) for each
    generation, and every custom call carries call_costs' numbers as its cost estimate."""
    on = jax.sharding.SingleDeviceSharding(_tpu_device(generation))
    shape = (2, 2, 256, 64)

    def loss(q, k, v, bias, key):
        out = fa.flash_attention(q, k, v, bias, key, 0.1, block_q=block_q, block_k=block_k)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=on)] * 3 + [
        jax.ShapeDtypeStruct((2, 1, 1, 256), jnp.float32, sharding=on),
        jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=on),
    ]
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    expected = fa.call_costs(*shape, jnp.bfloat16, rate=0.1, block_q=block_q, block_k=block_k)
    assert _custom_call_costs(compiled.as_text()) == expected
    assert len(expected) == (3 if block_q else 2)
    # XLA's cost analysis (the dry run's MFU ceiling) adds the estimates to its totals.
    analysis = compiled.cost_analysis()
    for key, name in (("flops", "flops"), ("bytes_accessed", "bytes accessed")):
        assert analysis[name] >= sum(c[key] for c in expected.values())


def test_call_costs_against_a_hand_count():
    """B 2, heads 4, L 512, d 64, float32, dropout: with the default blocks (256 query rows,
    all 512 keys, two heads' 128 lanes) every array moves once each way; with 128 x 128 blocks
    the inner axis's operands move once per outer block; a lone head of 64 moves its block
    padded to 128 lanes, as the TPU lays it out in HBM."""
    b, h, n, d = 2, 4, 512, 64
    scores, rows = b * h * n * n, b * h * n
    head = b * h * n * d * 4  # q, k, v, o, dO, dq, dk, dv: bytes of each
    bias, stats, prefetch = b * n * 4, b * h * 2 * n * 4, 3 * 4
    matmul = 2 * scores * d  # one [rows, keys, d] matmul over every (query, key) pair
    costs = fa.call_costs(b, h, n, d, jnp.float32, rate=0.1)
    assert costs == {
        fa.FORWARD: {
            # q k^T, p v; scale, bias, max, -max, sum, /sum, dropout's product and select
            "flops": 2 * matmul + 8 * scores,
            "transcendentals": scores,
            "bytes_accessed": 4 * head + bias + stats + prefetch,  # q k v in, o out
        },
        fa.BACKWARD: {
            # q k^T (again), dO v^T, dv, dk, dq; scale, bias, -max, /sum, dP - D, p * that,
            # * scale, dropout on dP and on p (2 each); D = sum(dO * O): 2 d per row
            "flops": 5 * matmul + 11 * scores + 2 * d * rows,
            "transcendentals": scores,
            "bytes_accessed": 8 * head + bias + stats + prefetch,  # q k v o dO in, dq dk dv out
        },
    }
    tiled = fa.call_costs(b, h, n, d, jnp.float32, rate=0.1, block_q=128, block_k=128)
    blocks, groups = n // 128, h // 2  # the grid's head axis runs over pairs of heads
    assert tiled[fa.FORWARD] == {
        # per score: scale, bias, max, -max, sum, dropout (2); per row and key block: the
        # running max, its change, the sum's rescale and add, the accumulator's (2 d); / sum (d)
        "flops": 2 * matmul + 7 * scores + rows * (blocks * (4 + 2 * d) + d),
        "transcendentals": scores + rows * blocks,
        # k, v and bias again for each query block
        "bytes_accessed": 2 * head + blocks * (2 * head + groups * bias) + stats + prefetch,
    }
    assert tiled[fa.BACKWARD_DKV] == {
        "flops": 4 * matmul + 11 * scores + 2 * d * rows * blocks,
        "transcendentals": scores,
        # q, o, dO and the statistics again for each key block; k, v in and dk, dv out once
        "bytes_accessed": blocks * (3 * head + stats) + 4 * head + groups * bias + prefetch,
    }
    assert tiled[fa.BACKWARD_DQ] == {
        "flops": 3 * matmul + 9 * scores + 2 * d * rows * blocks,  # no dropped p for dv
        "transcendentals": scores,
        # k, v and bias again for each query block; q, o, dO, stats in and dq out once
        "bytes_accessed": blocks * (2 * head + groups * bias) + 4 * head + stats + prefetch,
    }
    lone = fa.call_costs(b, 1, n, d, jnp.float32)[fa.FORWARD]["bytes_accessed"]
    assert lone == 4 * (2 * head // h) + bias + stats // h + prefetch


def test_block_sizes_the_tpu_cannot_tile_are_refused_in_one_line():
    q = jnp.zeros((1, 1, 512, 64))
    bias = jnp.zeros((1, 1, 1, 512))
    with pytest.raises(ValueError, match=r"^flash_attention: block_q=200 must divide") as e:
        fa.flash_attention(q, q, q, bias, jax.random.PRNGKey(0), 0.0, block_q=200)
    assert "\n" not in str(e.value)
    assert fa.default_blocks(128) == (128, 128) and fa.default_blocks(512) == (256, 512)


def _layer_spec(**changes) -> ElectraSpec:
    enc = EncoderSpec(hidden_size=128, num_layers=1, num_heads=2, intermediate_size=256)
    return ElectraSpec(64, 128, 128, 2, enc, enc, **{"attention": "pallas", **changes})


def _layer_grad(spec, batch, on, mesh):
    """The compiled forward and backward of one TransformerLayer of `spec` ([batch, 128, 128]
    inputs split by `on`, or whole on each device of `mesh`), as the layer benchmark compiles
    it."""
    layer = TransformerLayer(spec, spec.discriminator)
    x, bias = jnp.zeros((batch, 128, 128)), jnp.zeros((batch, 1, 1, 128))
    keys = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
    params = jax.eval_shape(lambda: layer.init(keys, x, bias, deterministic=False))

    def loss(params, x, bias, key):
        return jnp.sum(layer.apply(params, x, bias, False, rngs={"dropout": key}) ** 2)

    place = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    on = on or replicated
    args = (jax.tree_util.tree_map(lambda a: place(a, replicated), params), place(x, on),
            place(bias, on), place(jax.ShapeDtypeStruct((2,), jnp.uint32), replicated))  # fmt: skip
    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()


def test_the_model_runs_pallas_attention_per_device_on_a_tpu_slice():
    """model.attention='pallas' in a layer compiled for 4 TPU v5e devices with the batch split
    (batch_sharding set, as program.build sets it): the kernels run under shard_map on each
    device's 2 rows, not on a gathered batch; a batch of 1, which 4 devices do not divide (the
    model's init traces one row), runs whole on each."""
    from electra_jax.model import sharding

    devices = topology.compile_only_devices(topology.resolve("v5e:2x2"))
    mesh = sharding.make_mesh(micro_config().mesh, devices)
    split = sharding.batch_sharding(mesh)
    spec = _layer_spec(platform="tpu", batch_sharding=split)
    for batch, per_device in ((8, 2), (1, 1)):
        hlo = _layer_grad(spec, batch, split if batch == 8 else None, mesh).as_text()
        calls = [line.split("custom-call(")[0] for line in hlo.splitlines()
                 if 'custom_call_target="tpu_custom_call"' in line]  # fmt: skip
        assert len(calls) == 2
        assert all(f"f32[{per_device},128,128]" in call for call in calls), calls  # [B, L, H d]
        assert "all-gather" not in hlo


def test_pallas_attention_is_refused_where_the_devices_are_not_tpus():
    """One line naming the setting, both where the run's mesh is made (before any data is
    prepared) and where the layer is traced; a mesh of TPU devices (a --dry_run --topology
    compile on this CPU machine) is accepted."""
    from electra_jax.pretraining.program import checked_mesh

    config = micro_config()
    with config.unlocked():
        config.model.attention = "pallas"
    with pytest.raises(ConfigError, match=r"^model.attention='pallas' is a TPU kernel") as e:
        checked_mesh(config, process_count=1)
    assert "\n" not in str(e.value) and "devices are cpu" in str(e.value)
    devices = topology.compile_only_devices(topology.resolve("v4-8"))
    assert checked_mesh(config, process_count=1, devices=devices).size == 4
    spec = _layer_spec(platform="cpu")
    layer = TransformerLayer(spec, spec.discriminator)
    with pytest.raises(ConfigError, match=r"^model.attention='pallas' is a TPU kernel"):
        layer.init(jax.random.PRNGKey(0), jnp.zeros((1, 128, 128)), jnp.zeros((1, 1, 1, 128)),
                   deterministic=True)  # fmt: skip


def test_auto_takes_the_kernel_on_tpu_where_it_wins_and_einsum_elsewhere():
    """model.attention='auto': 'pallas' only for TPU devices at a sequence length and width from
    PALLAS_FROM_* on (where the compiler's cycles put it ahead); 'einsum' below that, on other
    platforms and where the platform is not known; a named choice is kept as it is. A narrow
    layer compiled for a TPU under 'auto' holds no Pallas call."""
    from electra_jax.model import networks
    from electra_jax.model.networks import resolved_attention

    long, wide = networks.PALLAS_FROM_SEQ_LENGTH, networks.PALLAS_FROM_HIDDEN_SIZE
    assert resolved_attention("auto", "tpu", long, wide) == "pallas"
    assert resolved_attention("auto", "tpu", 4 * long, 2 * wide) == "pallas"
    assert resolved_attention("auto", "tpu", long // 2, wide) == "einsum"
    assert resolved_attention("auto", "tpu", long, wide // 3) == "einsum"  # base's generator
    for platform in ("cpu", "gpu", None):
        assert resolved_attention("auto", platform, long, wide) == "einsum"
    assert resolved_attention("pallas", "tpu", 128, 128) == "pallas"
    assert resolved_attention("einsum", "tpu", long, wide) == "einsum"
    from electra_jax.model import sharding

    devices = topology.compile_only_devices(topology.resolve("v5e:2x2"))
    mesh = sharding.make_mesh(micro_config().mesh, devices)
    spec = _layer_spec(platform="tpu", attention="auto")
    hlo = _layer_grad(spec, 1, None, mesh).as_text()
    assert 'custom_call_target="tpu_custom_call"' not in hlo


def test_the_kernel_is_chosen_and_accepted_only_on_the_generations_it_compiles_for():
    """PALLAS_GENERATIONS are the generations the compile test above covers at the default
    blocks. On a TPU v3 slice
    (Mosaic refuses its bfloat16 matmuls) 'auto' builds the XLA core and 'pallas' is one line;
    on v4 'auto' at base's size builds the kernel."""
    from electra_jax.model import networks
    from electra_jax.pretraining.program import build, checked_mesh

    # The compile test's generations at the default blocks (v6e's there are 128 x 128).
    compiled = {topology.resolve(name).generation.name for name in ("v4-8", "v5e-4", "v5p-8")}
    assert compiled == set(networks.PALLAS_GENERATIONS)
    config = micro_config()
    with config.unlocked():
        config.data.seq_length = config.model.max_position_embeddings = 512
        config.model.hidden_size = config.model.embedding_size = 768
        config.model.num_heads = 12
    for slice_name, kernel in (("v3-8", False), ("v4-8", True)):
        devices = topology.compile_only_devices(topology.resolve(slice_name))
        mesh = checked_mesh(config, process_count=1, devices=devices)
        spec = build(config, config.data.vocab_size, mesh)[0]
        assert (spec.batch_sharding is not None) == kernel, slice_name
    with config.unlocked():
        config.model.attention = "pallas"
    devices = topology.compile_only_devices(topology.resolve("v3-8"))
    with pytest.raises(ConfigError, match=r"^model.attention='pallas' runs on TPU v4, v5e") as e:
        checked_mesh(config, process_count=1, devices=devices)
    assert "\n" not in str(e.value) and "TPU v3" in str(e.value)
