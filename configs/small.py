"""ELECTRA-Small, as in the paper (Clark et al., 2020, Table 6) — the base of every other config.

    python -m electra_jax.train --config=configs/small.py --workdir=runs/small \
        --config.data.source='text:/data/wiki/*.txt'

Meant for one accelerator (a GPU) or a TPU v3-8, v4-8 or v5e-8 (the TPU compiler's plans: 0.7 of
a v3 core's 16 GiB, 0.9 of a v4 chip's 32, 0.55 of a v5e chip's 16; benchmarks/RESULTS.md, "The
paper configs compiled for their slices"): 1M steps of 128 x 128 tokens.
The paper reports GLUE dev 79.9 for this model after 1M steps (about 4 days on one V100).
Expect the generator's MLM loss to fall below 3 and the discriminator's accuracy to exceed 95%
within the first few thousand steps; the default `builtin` corpus is far too small for 30,522
pieces, so name a real corpus (text files or TFDS) in data.source.
"""

import ml_collections

from electra_jax.config import pretrain_keys, schema


def get_config() -> ml_collections.ConfigDict:
    # ELECTRA-Small is the schema's defaults: each key's value, doc and range are declared once,
    # in electra_jax/config/pretrain_keys.py (--print_config shows them).
    return schema.defaults(pretrain_keys.KEYS)
