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


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.family = "glue"  # the task family: picks the runner's data, head and scorer
    config.task = "SST-2"  # CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI
    config.data_dir = ""  # the task's GLUE TSVs (or GLUE's root); '' reads TFDS glue/<task>
    config.tfds_data_dir = ""  # TFDS data_dir when data_dir is ''; '' is TFDS's default
    config.init_from = ""  # a pre-training workdir, an export dir, 'hf:DIR'; '' = random init
    config.seed = 0  # one seed for the head's init, dropout and the data order

    config.learning_rate = 0.0  # peak; 0 = the paper's for the size: 3e-4 S, 1e-4 B, 5e-5 L
    config.layer_decay = 0.0  # 0 = the paper's: 0.8 (Small, Base), 0.9 (Large); 1 = no decay
    # 'electra_jax': lr x decay^(N-i) for layer i of N, x decay^(N+1) the embeddings, the head x1;
    # 'original': one factor more below the head (top layer decay^2), as the original code has it
    # (its issue #51), to reproduce the paper's numbers exactly
    config.layer_decay_exponents = "electra_jax"
    config.warmup_fraction = 0.1  # linear warm-up over this share of the steps, then linear decay
    config.weight_decay = 0.01  # AdamW, not on LayerNorm parameters or biases
    config.adam_eps = 1e-6  # Adam's epsilon (b1 0.9, b2 0.999)
    config.adam_bias_correction = False  # the original optimizer has none
    config.clip_norm = 1.0  # global gradient-norm clipping, as the original
    config.batch_size = 32  # examples per update, split over the local devices
    config.num_epochs = 0.0  # 0 = the task's: 3, or 10 for RTE and STS-B
    config.seq_length = 128  # [CLS] A [SEP] B [SEP], the longer text cut first
    config.max_train_examples = 0  # > 0 caps the training set (a fixed random subset); 0 = all
    config.double_unordered = True  # MRPC and STS-B also train on (B, A): the relation is symmetric
    # STS-B trains on score / 5 in [0, 1] as the original; predictions are reported on 0-5
    config.scale_regression_targets = True
    config.dropout_rate = 0.1  # hidden, attention and classifier dropout
    config.dtype = "float32"  # compute type: 'float32' or 'bfloat16'; params stay float32
    config.eval_batch_size = 128  # dev examples per prediction step
    config.log_every_steps = 50  # a progress line every this many steps
    # Orbax checkpoints (train state and every step's loss) in WORKDIR/checkpoints: rerunning
    # the command resumes from the newest one, bit for bit; the last step always has one.
    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 1000
    config.checkpoint.keep = 2  # the newest this many are kept

    # Random init only (init_from = ''): the tokenizer and the network's shape.
    config.tokenizer = ""  # a SentencePiece model dir or file; '' trains one on the task's text
    config.vocab_size = 4096  # pieces of that trained tokenizer
    config.model = ml_collections.ConfigDict()  # ELECTRA-Small's discriminator (configs/small.py)
    config.model.hidden_size = 256
    config.model.num_layers = 12
    config.model.num_heads = 4
    config.model.intermediate_size = 1024  # feed-forward width
    config.model.embedding_size = 128  # E; projected to hidden_size where they differ
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2
    config.model.initializer_range = 0.02  # truncated-normal std (the head's too)
    config.model.layer_norm_eps = 1e-12
    return config
