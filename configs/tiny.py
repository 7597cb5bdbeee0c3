"""Tiny ELECTRA on the bundled `builtin` corpus: the default first run, CPU, a few minutes.

    python -m electra_jax.train --config=configs/tiny.py --workdir=runs/tiny

Meant for any laptop or a 2-core CI machine: nothing is downloaded (the corpus is the English
documentation and docstrings that ship inside CPython). Trains a SentencePiece model, packs the
text, then trains a 4-layer, 128-wide discriminator with a 32-wide generator. Expect the whole run
to take about 5 minutes on 2 cores, the generator loss to fall from about 8.3 (ln 4096) to below
6, and the discriminator loss to fall well below its starting value while it learns to spot the
replaced tokens. Starts from small.py and overrides what differs.
"""

import pathlib
import runpy

_small = runpy.run_path(str(pathlib.Path(__file__).with_name("small.py")))


def get_config():
    config = _small["get_config"]()
    config.data.source = "builtin"
    config.data.vocab_size = 4096
    config.data.tokenizer_sample_sentences = 200_000
    config.model.hidden_size = 128
    config.model.num_layers = 4
    config.model.num_heads = 2
    config.model.intermediate_size = 512
    config.model.embedding_size = 128
    config.generator.hidden_fraction = 0.25  # 32 wide, 1 head
    config.train.num_steps = 600
    config.train.batch_size = 32
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 60
    # A few hundred steps cannot absorb the original optimizer's uncorrected first moments (its
    # early updates are 3-6x Adam's); the paper-sized configs keep the original behaviour.
    config.train.adam_bias_correction = True
    config.checkpoint.every_steps = 200
    config.checkpoint.keep = 2
    config.log.every_steps = 20
    return config
