"""step_setup: the mesh checked against the batches, before anything compiles."""

import pytest

from electra_jax import step_setup
from electra_jax.config.schema import ConfigError
from tests.conftest import micro_config


def test_the_batches_must_split_over_the_processes_and_the_mesh_fit_the_devices():
    config = micro_config()
    assert step_setup.checked_mesh(config, process_count=1).shape["data"] >= 1
    with pytest.raises(ConfigError, match="train.batch_size=8 is not divisible by the 3 proc"):
        step_setup.checked_mesh(config, process_count=3)
    # The held-out batch is checked as its own setting, named as such.
    config.train.batch_size = 6
    config.eval.every_steps, config.eval.batch_size, config.data.heldout_examples = 2, 8, 32
    assert step_setup.eval_every(config) == 2 and step_setup.eval_batch_size(config) == 8
    with pytest.raises(ConfigError, match="eval.batch_size=8 is not divisible by the 3 proc"):
        step_setup.checked_mesh(config, process_count=3)
    config.data.heldout_examples = 0  # no held-out rows: no evaluation, nothing to check
    assert step_setup.eval_every(config) == 0
    step_setup.checked_mesh(config, process_count=3)
    config.mesh.fsdp = 1000
    with pytest.raises(ConfigError, match="choose a mesh.fsdp that divides it"):
        step_setup.checked_mesh(config, process_count=1)
