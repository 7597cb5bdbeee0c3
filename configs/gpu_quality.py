"""ELECTRA-Small for a few minutes of one GPU: the recipe benchmarks/gpu_quality.py runs.

    python benchmarks/gpu_data.py --corpus=DIR --glue=DIR   # CPU machine: tokenizer, shards,
                                                            # GLUE files -> .gpu_data/
    benchmarks/gpu.sh                    # GPU machine: pre-trains with this, fine-tunes GLUE

The paper's ELECTRA-Small recipe (configs/small.py: 256 wide, 12 layers, a generator 1/4 as
wide, learning rate 5e-4, 15% masked, 128 x 128 tokens per step) with 30,522 pieces, computed in
bfloat16, shortened to a budget of steps: 12,000 steps is about 3.2 minutes at 16 ms per step
(~1M tokens/s), 2.4e16 counted FLOPs. benchmarks/gpu_quality.py sets the data paths from
.gpu_data/gpu_data.json and, with --steps, train.num_steps (warm-up and evaluation interval
keep their share of the steps; other step counts here, such as objective.temperature_steps,
are taken as written).

This file is the one place that holds the recipe: change get_config() (e.g.
objective.temperature_start, objective.disc_mlm_weight, train.learning_rate) and FINETUNE
below. The data fields (seed, seq_length, vocab_size, the packing probabilities) are part of the
prepared shards' content key: after changing one, rerun benchmarks/gpu_data.py, or
gpu_quality.py stops with one line saying so instead of tokenizing on the GPU machine.
"""

import pathlib
import runpy

_small = runpy.run_path(str(pathlib.Path(__file__).with_name("small.py")))

# configs/glue.py fields set in every fine-tuning run of gpu_quality.py, and per task: caps on
# the training sets that do not fit the budget (SST-2 in full is 6,314 steps of 32 per epoch x 3).
FINETUNE = {
    "all": {"seed": 0},
    "SST-2": {"max_train_examples": 20_000},
}


def get_config():
    config = _small["get_config"]()
    config.data.vocab_size = 30522
    config.data.source = ""  # set by gpu_quality.py: the staged corpus of .gpu_data/
    config.model.dtype = "bfloat16"
    config.train.num_steps = 12_000
    # The paper warms up over 10,000 of its 1M steps; a run of minutes warms up over 10% of its
    # steps instead (the paper's 10,000 would leave almost no time at the peak rate).
    config.train.warmup_steps = 1_200
    config.checkpoint.every_steps = 4_000
    config.checkpoint.keep = 1
    config.eval.every_steps = 1_200  # ten held-out readings
    return config
