"""ELECTRA-Base, as in the paper (Table 6): 110M discriminator, 766K steps of 256 x 512 tokens.

    python -m electra_jax.train --config=configs/base.py --workdir=gs://BUCKET/runs/base \
        --config.data.source=tfds:wikipedia/20230601.en

The workdir is storage every host sees: gs://BUCKET/PATH written directly (the [gcs] extra; no
gcsfuse mount, docs/scaling.md says why) or NFS. Process 0 prepares the data there while the
others wait; every host writes its part of each checkpoint.

Meant for a TPU v3-16 or v4-16 slice (the TPU compiler's plan on v4-16 without remat: 7.6 of a
chip's 32 GiB; benchmarks/RESULTS.md, "The paper configs compiled for their slices";
compile for another slice with --dry_run --topology=SLICE) or 8+ GPUs of 40 GB or more.
train.remat='auto' compiles the step for the run's devices and takes the fastest remat policy that
fits them ('none' on those slices; remat changes memory and time, not the numbers). It computes in
bfloat16 (parameters, Adam's moments, LayerNorm and softmax statistics and the losses stay float32):
a tiny model's loss curves in bfloat16 stay within the seed spread, by an order of magnitude, and it
cuts a base layer's HBM traffic by 37% (benchmarks/notes/compile.md, "bfloat16 that pays");
--config.model.dtype=float32 computes in float32. model.attention='auto' runs the Pallas attention
kernel on TPU (benchmarks/notes/compile.md, "Pallas by default").
The paper reports GLUE dev 85.1 for this model. Starts from small.py and overrides what differs.

Saves every 30 minutes as well as every 10,000 steps (checkpoint.every_minutes): 10,000 of this
model's steps are hours of the slice's time, all lost to a preemption that sends no SIGTERM (a host
failure, a maintenance event); 30 minutes bounds that loss for one asynchronous save each half hour
(its blocking part a fraction of a second at tiny's size, benchmarks/RESULTS.md; seconds at most
here), as Levanter's 15-minute default does. 0 saves by steps only.
"""

import pathlib
import runpy

_small = runpy.run_path(str(pathlib.Path(__file__).with_name("small.py")))


def get_config():
    config = _small["get_config"]()
    config.data.seq_length = 512
    config.model.hidden_size = 768
    config.model.num_layers = 12
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.embedding_size = 768
    config.generator.hidden_fraction = 1 / 3  # 256 wide
    config.train.num_steps = 766_000
    config.train.batch_size = 256
    config.train.learning_rate = 2e-4
    config.train.remat = "auto"
    config.model.dtype = "bfloat16"
    config.checkpoint.every_minutes = 30
    return config
