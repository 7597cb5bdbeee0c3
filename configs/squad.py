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


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.family = "squad"  # the task family: picks the runner's data, head and scorer
    config.version = "1.1"  # '1.1' or '2.0' (2.0 adds unanswerable questions)
    config.data_dir = ""  # the folder holding train-v{version}.json and dev-v{version}.json
    config.init_from = ""  # a pre-training workdir, an export dir, 'hf:DIR'; '' = random init
    config.seed = 0  # one seed for the heads' init, dropout and the data order

    config.learning_rate = 0.0  # peak; 0 = the paper's for the size: 3e-4 S, 1e-4 B, 5e-5 L
    config.layer_decay = 0.0  # 0 = the paper's: 0.8 (Small, Base), 0.9 (Large); 1 = no decay
    # 'electra_jax' or 'original' (one factor of decay more below the head, the original code's
    # leftover of its removed pooler): see configs/glue.py
    config.layer_decay_exponents = "electra_jax"
    config.warmup_fraction = 0.1  # linear warm-up over this share of the steps, then linear decay
    config.weight_decay = 0.01  # AdamW, not on LayerNorm parameters or biases
    config.adam_eps = 1e-6  # Adam's epsilon (b1 0.9, b2 0.999)
    config.adam_bias_correction = False  # the original optimizer has none
    config.clip_norm = 1.0  # global gradient-norm clipping, as the original
    config.batch_size = 32  # windows per update, split over the local devices
    config.num_epochs = 2.0  # the original's for SQuAD; steps = windows x epochs / batch
    config.max_train_examples = 0  # > 0 trains on a fixed random subset of the questions; 0 = all
    config.dropout_rate = 0.1  # hidden and attention dropout
    config.dtype = "float32"  # compute type: 'float32' or 'bfloat16'; params stay float32

    # Windows: [CLS] question [SEP] context window [SEP], as the original cuts them.
    config.seq_length = 512  # tokens per window
    config.doc_stride = 128  # a long context's next window starts this many tokens later
    config.max_query_length = 64  # longer questions keep their first 64 tokens
    # The head and decoding.
    config.joint_prediction = True  # the end conditioned on the start (the original's); False:
    # independent start and end layers, as BERT
    config.head_size = 512  # hidden width of the joint end layer and of the answerable layer
    config.n_best_size = 20  # starts, and ends per start, each window keeps; answers ranked
    config.max_answer_length = 30  # longest answer in tokens
    config.answerable_weight = 0.5  # 2.0: weight of the answerability loss
    config.null_threshold = -2.75  # 2.0: answer "" when the no-answer logit exceeds this
    config.eval_batch_size = 32  # dev windows per prediction step
    config.log_every_steps = 100  # a progress line every this many steps
    # Orbax checkpoints (train state and every step's loss) in WORKDIR/checkpoints: rerunning
    # the command resumes from the newest one, bit for bit; the last step always has one.
    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 1000
    config.checkpoint.keep = 2  # the newest this many are kept

    # Random init only (init_from = ''): the tokenizer and the network's shape.
    config.tokenizer = ""  # a SentencePiece model dir or file; '' trains one on the training text
    config.vocab_size = 8192  # pieces of that trained tokenizer
    config.model = ml_collections.ConfigDict()  # ELECTRA-Small's discriminator (configs/small.py)
    config.model.hidden_size = 256
    config.model.num_layers = 12
    config.model.num_heads = 4
    config.model.intermediate_size = 1024  # feed-forward width
    config.model.embedding_size = 128  # E; projected to hidden_size where they differ
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2
    config.model.initializer_range = 0.02  # truncated-normal std of the encoder's weights
    config.model.layer_norm_eps = 1e-12
    return config
