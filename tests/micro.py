"""The micro config: configs/tiny.py shrunk until a step compiles and runs in moments.

A module of its own, importing no jax, so that config files written by the tests (and by
tests/hostile_inputs.py) can build on it without slowing a command that fails at its settings.
"""

import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def micro_config():
    """The tiny config shrunk further: 2 layers, 64 wide, 32 tokens, vocab 300."""
    config = runpy.run_path(str(ROOT / "configs" / "tiny.py"))["get_config"]()
    config.data.vocab_size = 300
    config.data.seq_length = 32
    config.data.tokenizer_sample_sentences = 20_000
    config.model.hidden_size = 64
    config.model.num_layers = 2
    config.model.num_heads = 2
    config.model.intermediate_size = 128
    config.model.embedding_size = 32
    config.train.batch_size = 8
    config.train.num_steps = 6
    config.train.warmup_steps = 2
    config.checkpoint.every_steps = 3
    config.log.every_steps = 1
    # The paper's rate and zero bias: the tests' numbers are about mechanics, set before tiny.py
    # took the small-compute recipe.
    config.train.learning_rate = 1e-3
    config.train.rtd_prior_init = False
    # The held-out rows stay out of training, but the evaluation (a compile of its own) runs
    # only in the tests that ask for it.
    config.eval.every_steps = 0
    return config
