"""Fine-tune a pre-trained ELECTRA on SQuAD 1.1 or 2.0, as the original ELECTRA did.

    python -m electra_jax.finetune --config=configs/squad.py --config.version=1.1 \
        --config.data_dir=squad --config.init_from=runs/small --workdir=runs/small-squad11

data_dir holds the official files (train-v1.1.json and dev-v1.1.json, or train-v2.0.json and
dev-v2.0.json, from https://rajpurkar.github.io/SQuAD-explorer/). Writes
WORKDIR/eval_results.json (exact_match and f1 on the dev set; for 2.0 also HasAns_* and NoAns_*
and the counts) and WORKDIR/dev_predictions.json ({question id: answer}, "" for no answer), which
the official evaluation scripts read as they are.

The workdir also keeps the model (model.json, tokenizer/, model.safetensors) and orbax checkpoints
every checkpoint.every_steps: rerunning the command resumes exactly; electra_jax.load(WORKDIR)
predicts and python -m electra_jax.export --workdir=WORKDIR writes it for transformers.

The recipe is the original's (its configure_finetuning.py and finetune/qa/): 512-token windows
[CLS] question [SEP] context [SEP] with a 128-token stride, questions cut to 64 tokens, 2 epochs,
a start/end head whose end is conditioned on the start (joint prediction), answers decoded from
the 20 best starts and ends and at most 30 tokens long, and for 2.0 an answerability classifier
(loss weight 0.5; "no answer" when its logit exceeds -2.75). The learning rate and layer-wise
decay follow the model's size as the paper's Table 7: Small 3e-4, Base 1e-4, Large 5e-5; decay
0.8, 0.8, 0.9 (see configs/glue.py for how the size is read). On CPU cap the training set with
--config.max_train_examples.

With init_from empty the model starts from random weights (a baseline) shaped by the `model`
section, and the tokenizer is config.tokenizer or a SentencePiece model of config.vocab_size
pieces trained on the training contexts and questions.
"""

import ml_collections

from electra_jax.config import finetune_keys


def get_config() -> ml_collections.ConfigDict:
    # The schema's defaults for SQuAD: each key's value, doc and range are declared once, in
    # electra_jax/config/finetune_keys.py (--print_config shows them).
    return finetune_keys.defaults("squad")
