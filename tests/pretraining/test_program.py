"""program.py: the mesh checked against the batches before anything compiles, and the setup
of a config's step made once per process."""

import collections

import jax
import pytest

from electra_jax.config import pretrain_keys
from electra_jax.errors import ConfigError
from electra_jax.model import sharding
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


def test_a_setup_is_made_once_per_process_for_the_same_config_and_mesh(monkeypatch):
    monkeypatch.setattr(program, "_SETUPS", collections.OrderedDict())
    config = micro_config()
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    first = program.setup_step(config, config.data.vocab_size, mesh)
    # The same settings (another ConfigDict), vocabulary and mesh: the same jitted functions;
    # also when only the host loop's settings differ (how often it logs and checkpoints).
    assert program.setup_step(micro_config(), config.data.vocab_size, mesh) is first
    loop_only = micro_config()
    loop_only.log.every_steps, loop_only.checkpoint.every_steps = 7, 5
    assert program.setup_step(loop_only, config.data.vocab_size, mesh) is first
    # Or only where the data, the tokenizer and the first weights come from, where prepared
    # data and compiled programs are kept, and what an export writes: no program reads them.
    paths = micro_config()
    paths.data.source, paths.data.tokenizer, paths.data.cache_dir = "text:/t/*", "/t/m", "/t/c"
    paths.data.tfds_data_dir, paths.train.init_from = "/t/tfds", "/t/run"
    paths.compile.cache_dir, paths.export.license = "/t/jax", "mit"
    assert program.setup_step(paths, config.data.vocab_size, mesh) is first
    keys = {k.name for k in pretrain_keys.KEYS}
    assert set(program._NOT_COMPILED) <= keys | {name.split(".")[0] for name in keys}
    # Any other setting, vocabulary, mesh or special ids: a setup of its own.
    config.train.learning_rate *= 2
    others = [
        program.setup_step(config, config.data.vocab_size, mesh),
        program.setup_step(micro_config(), config.data.vocab_size + 1, mesh),
        program.setup_step(
            micro_config(), config.data.vocab_size, mesh, program.SpecialTokens(0, 1, 2, 4)
        ),
    ]
    assert all(o is not first for o in others) and len({id(o) for o in others}) == 3
    assert len(program._SETUPS) == 4
    # No more than _SETUPS_KEPT are kept, the least recently asked for dropped first.
    program.setup_step(micro_config(), config.data.vocab_size, mesh)  # `first`, asked again
    program.setup_step(micro_config(), config.data.vocab_size + 2, mesh)
    assert len(program._SETUPS) == program._SETUPS_KEPT
    assert program.setup_step(micro_config(), config.data.vocab_size, mesh) is first
    assert others[0] not in program._SETUPS.values()
