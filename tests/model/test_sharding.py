import json
import sys

import numpy as np
import pytest

from electra_jax.pretraining import topology
from tests import command_server
from tests.conftest import ROOT, subprocess_env
from tests.pretraining.test_topology import libtpu_env, needs_libtpu  # noqa: F401  (a fixture)

# One subprocess with 8 simulated devices (the device count is fixed when jax starts).
_EIGHT_DEVICES = """
import json, jax
jax.config.update("jax_disable_most_optimizations", True)
from electra_jax.model import sharding
from electra_jax.pretraining import program
from tests.conftest import micro_config
from tests.pretraining.test_optimizer_step import run_steps
cfg = micro_config()
assert jax.device_count() == 8
out = {"one": run_steps(cfg, jax.devices()[:1], 10)}
cfg.mesh.fsdp = -1
out["fsdp"] = run_steps(cfg, jax.devices(), 10)
setup = program.setup_step(cfg, cfg.data.vocab_size, sharding.make_mesh(cfg.mesh))
layer = setup.state_sharding.params["discriminator"]["layers"]
mu = setup.state_sharding.opt_state[1].mu["discriminator"]["layers"]
out["specs"] = {
    "qkv_kernel": str(layer["attention"]["qkv_kernel"].spec),
    "intermediate": str(layer["intermediate"]["kernel"].spec),
    "intermediate_mu": str(mu["intermediate"]["kernel"].spec),
    "bias": str(layer["intermediate"]["bias"].spec),
    "word_embeddings": str(
        setup.state_sharding.params["embeddings"]["word_embeddings"]["embedding"].spec
    ),
}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_fsdp_on_eight_devices_matches_one_device():
    out = command_server.run(
        [sys.executable, "-c", _EIGHT_DEVICES], ROOT, subprocess_env(devices=8), timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for other in ("fsdp",):
        for a, b in zip(res["one"], res[other], strict=True):
            for k in ("loss", "gen_loss", "disc_loss", "grad_norm", "replaced_fraction"):
                np.testing.assert_allclose(a[k], b[k], rtol=2e-5, err_msg=f"{other} {k}")
    # FSDP splits the model width of every matrix (and Adam's moments with it) over 8 devices;
    # vectors stay whole, and so does the leading axis of the stacked layers.
    specs = res["specs"]
    assert specs["qkv_kernel"] == "P(None, 'fsdp', None, None, None)"
    assert specs["intermediate"] == specs["intermediate_mu"] == "P(None, 'fsdp', None)"
    assert specs["word_embeddings"] == "P(None, 'fsdp')"
    assert specs["bias"] == "P(None, None)"


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
@pytest.mark.parametrize("fsdp", [2, -1])
def test_fsdp_rows_stay_within_one_slice(fsdp):
    import ml_collections

    from electra_jax.model import sharding

    devices = topology.compile_only_devices(topology.resolve("v5e:2x2", num_slices=2))
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"fsdp": fsdp}), devices)
    assert mesh.shape["fsdp"] == (2 if fsdp == 2 else 4) and mesh.size == len(devices)
    grid = mesh.devices  # [data, fsdp]
    for row in grid:
        assert len({d.slice_index for d in row}) == 1
    # 'data' spans the slices: only the gradients' all-reduce crosses between them.
    assert {d.slice_index for d in grid[:, 0]} == {0, 1}


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_an_fsdp_wider_than_a_slice_is_refused():
    import ml_collections

    from electra_jax.model import sharding

    devices = topology.compile_only_devices(topology.resolve("v5e:2x2", num_slices=2))
    with pytest.raises(ValueError, match="the 4 devices of each of the 2 slices"):
        sharding.make_mesh(ml_collections.ConfigDict({"fsdp": 8}), devices)
