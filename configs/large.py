"""ELECTRA-Large, as in the paper (Table 6): 335M discriminator, 400K steps of 2048 x 512 tokens.

    python -m electra_jax.train --config=configs/large.py --workdir=gs://BUCKET/runs/large \
        --config.data.source=tfds:wikipedia/20230601.en

The workdir is storage every host sees: gs://BUCKET/PATH written directly (the [gcs] extra; no
gcsfuse mount, docs/scaling.md says why) or NFS. Process 0 prepares the data there while the
others wait; every host writes its part of each checkpoint.

Meant for a TPU v3-512, v5p-128 or v4-128 slice. train.remat='auto' compiles the step for the run's
devices and takes the fastest remat policy whose step fits them (remat changes no number of the run,
only memory and time): on a v4-128 'none', 17.9 of a chip's 32 GiB in bfloat16 (in float32 it takes
'save_projections' at 22.9, where without remat the step needs 37.8 of temporaries alone;
benchmarks/RESULTS.md, "The paper configs compiled for their slices"; benchmarks/notes/remat.md).
It computes in bfloat16, as base.py does and says why (--config.model.dtype=float32 computes in
float32), with the Pallas attention kernel on TPU (model.attention='auto'). Before booking another
slice, compile for it: add --dry_run --topology=SLICE (README, "Will it fit?"); it chooses as the
run does. On GPUs, a multi-node cluster (batch 2048 does not fit one device). This is the paper's
"ELECTRA-400K" (GLUE dev 88.6); the released ELECTRA-Large is the 1.75M-step variant: add
--config.train.num_steps=1750000. Masks 25% of tokens, as the paper found better for Large. Starts
from small.py and overrides what differs.

Saves every 30 minutes as well as every 10,000 steps (checkpoint.every_minutes): on a v4-128 the
compiler's estimated cycles put a step at 0.30 s (benchmarks/RESULTS.md), so 10,000 steps are 50
minutes of the slice at the very least, all lost to a preemption that sends no SIGTERM (a host
failure, a maintenance event); 30 minutes bounds that loss for one asynchronous save each half
hour, as Levanter's 15-minute default does. 0 saves by steps only.
"""

import pathlib
import runpy

_small = runpy.run_path(str(pathlib.Path(__file__).with_name("small.py")))


def get_config():
    config = _small["get_config"]()
    config.data.seq_length = 512
    config.model.hidden_size = 1024
    config.model.num_layers = 24
    config.model.num_heads = 16
    config.model.intermediate_size = 4096
    config.model.embedding_size = 1024
    config.generator.hidden_fraction = 0.25  # 256 wide
    config.objective.mask_prob = 0.25
    config.train.num_steps = 400_000
    config.train.batch_size = 2048
    config.data.heldout_examples = 4096  # two held-out batches of 2048
    config.train.learning_rate = 2e-4
    config.train.remat = "auto"
    config.model.dtype = "bfloat16"
    config.checkpoint.every_minutes = 30
    return config
