"""step_setup: the mesh checked against the batches, before anything compiles."""

import pytest

from electra_jax.config.schema import ConfigError
from electra_jax.pretraining import program
from tests.conftest import micro_config


def test_the_batches_must_split_over_the_processes_and_the_mesh_fit_the_devices():
    config = micro_config()
    assert program.checked_mesh(config, process_count=1).shape["data"] >= 1
    with pytest.raises(ConfigError, match="train.batch_size=8 is not divisible by the 3 proc"):
        program.checked_mesh(config, process_count=3)
    # The held-out batch is checked as its own setting, named as such.
    config.train.batch_size = 6
    config.eval.every_steps, config.eval.batch_size, config.data.heldout_examples = 2, 8, 32
    assert program.eval_every(config) == 2 and program.eval_batch_size(config) == 8
    with pytest.raises(ConfigError, match="eval.batch_size=8 is not divisible by the 3 proc"):
        program.checked_mesh(config, process_count=3)
    config.data.heldout_examples = 0  # no held-out rows: no evaluation, nothing to check
    assert program.eval_every(config) == 0
    program.checked_mesh(config, process_count=3)
    config.mesh.fsdp = 1000
    with pytest.raises(ConfigError, match="choose a mesh.fsdp that divides it"):
        program.checked_mesh(config, process_count=1)
