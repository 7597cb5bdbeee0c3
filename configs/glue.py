"""Fine-tune a pre-trained ELECTRA on one GLUE task, as the original ELECTRA did.

    python -m electra_jax.finetune --config=configs/glue.py --config.task=SST-2 \
        --config.data_dir=glue_data/SST-2 --config.init_from=runs/small --workdir=runs/small-sst2

Writes WORKDIR/eval_results.json (the dev metrics: accuracy; F1 too for MRPC and QQP; Matthews
correlation for CoLA; Pearson and Spearman for STS-B; MNLI's matched and mismatched dev sets; the
learning rate and layer decay used) and WORKDIR/dev_predictions.jsonl. The paper's ELECTRA-Small
(configs/small.py, 1M steps) averages 79.9 over the GLUE dev sets with this recipe; a model
pre-trained for minutes (configs/tiny.py) has learned too little to beat random init. On a GPU a
task takes minutes (SST-2: 6.3K steps of 32 x 128 tokens); on CPU cap the set with
--config.max_train_examples.

The workdir also keeps the model (model.json, tokenizer/, model.safetensors) and orbax checkpoints
every checkpoint.every_steps: rerunning the command resumes exactly; electra_jax.load(WORKDIR)
predicts and python -m electra_jax.export --workdir=WORKDIR writes it for transformers.

The learning rate and the layer-wise decay follow the model's size as in the paper's Table 7,
read from the discriminator's hidden size (init_from's, or config.model's for random init):
Small (256) 3e-4 and 0.8, Base (768) 1e-4 and 0.8, Large (1024) 5e-5 and 0.9; another width
takes the nearest size's (by ratio) and the log line says which. A non-zero
--config.learning_rate or --config.layer_decay overrides them. A run whose training loss turns
NaN/Inf stops with one line (exit code 1) and writes no results.

With init_from empty the model starts from random weights (a baseline) shaped by the `model`
section, and the tokenizer is config.tokenizer or, when that is empty too, a SentencePiece model
of config.vocab_size pieces trained on the task's training text.
"""

import ml_collections

from electra_jax.config import finetune_keys


def get_config() -> ml_collections.ConfigDict:
    # The schema's defaults for GLUE: each key's value, doc and range are declared once, in
    # electra_jax/config/finetune_keys.py (--print_config shows them).
    return finetune_keys.defaults("glue")
