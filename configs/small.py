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


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # one seed for initialisation, data order and every step's randomness

    config.data = ml_collections.ConfigDict()
    # 'builtin' | 'text:GLOB' | 'parquet:GLOB[:COLUMN]' | 'jsonl:GLOB[:FIELD]' | 'tfds:NAME[:SPLIT]'
    config.data.source = "builtin"
    config.data.seq_length = 128  # tokens per example, [CLS] and [SEP]s included
    config.data.vocab_size = 30522  # SentencePiece pieces, the five specials included (BERT's size)
    config.data.cache_dir = ""  # prepared shards; '' keeps them in WORKDIR/data
    config.data.tokenizer = ""  # an existing SentencePiece model; '' trains one on the corpus
    config.data.tokenizer_sample_sentences = 1_000_000  # sentences sampled to train SentencePiece
    config.data.character_coverage = 0.9995  # SentencePiece: share of characters given a piece
    config.data.single_segment_prob = 0.1  # examples with only segment A, as in fine-tuning
    config.data.short_seq_prob = 0.05  # examples packed to a random shorter length
    config.data.examples_per_shard = 100_000  # rows per ArrayRecord shard
    config.data.tfds_text_field = "text"  # tfds sources: the feature holding a document's text
    config.data.tfds_data_dir = ""  # tfds sources: TFDS data_dir; '' is TFDS's default
    # Rows never trained on, read by the held-out evaluation (`eval`): blocks of 16 consecutive
    # rows spread evenly over the corpus, the same for every seed; a multiple of the evaluation
    # batch. 0 trains on every row (and leaves nothing to evaluate on)
    config.data.heldout_examples = 1024

    config.model = ml_collections.ConfigDict()  # the discriminator
    config.model.hidden_size = 256
    config.model.num_layers = 12
    config.model.num_heads = 4
    config.model.intermediate_size = 1024  # feed-forward width
    config.model.embedding_size = 128  # E; projected to hidden_size where they differ
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2
    config.model.dropout_rate = 0.1
    config.model.attention_dropout_rate = 0.1
    config.model.initializer_range = 0.02  # truncated-normal std
    config.model.layer_norm_eps = 1e-12
    config.model.dtype = "float32"  # compute type: 'float32' or 'bfloat16'; params stay float32
    # 'einsum' (dropout on attention probabilities, as the paper) or jax.nn.dot_product_attention
    # kernels 'xla' / 'cudnn' (fused, GPU-fast, need attention_dropout_rate = 0)
    config.model.attention = "einsum"
    # Embeddings of generator and discriminator: 'electra' (shared), 'gdes' (DeBERTa-v3: the
    # discriminator adds its own zero-initialised deltas to the generator's tables, under
    # stop_gradient) or 'none' (separate tables)
    config.model.embedding_sharing = "electra"
    # One layer body compiled once and scanned over parameters stacked on a leading layer axis
    # (compiles several times faster); False unrolls the layers, the layout of runs started
    # before this option, which resume in their own layout whatever this says
    config.model.scan_layers = True

    config.generator = ml_collections.ConfigDict()
    config.generator.hidden_fraction = 0.25  # width = 1/4 of the discriminator's, same depth
    config.generator.layers_fraction = 1.0

    config.objective = ml_collections.ConfigDict()
    # 'electra' (replaced token detection) or the paper's ablations: 'electra_15' (RTD loss on the
    # masked 15% only), 'mlm' (BERT: 80% [MASK], 10% random, 10% kept; no generator),
    # 'replaced_mlm' (MLM on generator-replaced tokens), 'all_tokens_mlm' (predict every token,
    # with a copy mechanism), 'two_stage' (the generator alone, then the discriminator started
    # from it with the generator frozen; needs generator.hidden_fraction = 1), 'adversarial'
    # (the generator maximises the discriminator's loss by REINFORCE with a learned baseline),
    # 'electra_mlm' (ELECTRA plus BERT's MLM on the discriminator: a second pass over the
    # masked ids, weighted by disc_mlm_weight)
    config.objective.name = "electra"
    config.objective.two_stage_steps = 0  # 'two_stage': the generator-only steps before the switch
    # 'adversarial': steps of maximum-likelihood training before the policy gradient takes over
    # (the paper states no warm start: 0)
    config.objective.mle_warmup_steps = 0
    config.objective.mask_prob = 0.15  # share of tokens the generator fills
    config.objective.mask_token_prob = 0.85  # of those, share shown as [MASK] (the rest kept)
    config.objective.gen_weight = 1.0  # weight of the generator's MLM loss
    config.objective.disc_weight = 50.0  # weight of the discriminator's RTD loss
    config.objective.temperature = 1.0  # sampling temperature of the generator's softmax
    # A temperature schedule: start at temperature_start and come down linearly to temperature
    # over temperature_steps steps (0: the temperature throughout, as the paper)
    config.objective.temperature_start = 0.0
    config.objective.temperature_steps = 0
    # The discriminator's own MLM term: on 'electra' it also predicts the original tokens at
    # the masked slots from the corrupted text it reads ('electra_mlm': from the masked ids, in
    # a second pass), with this weight, fading linearly to 0 over disc_mlm_steps steps (0:
    # constant); 0 leaves it out, as the paper ('electra_mlm' needs it above 0)
    config.objective.disc_mlm_weight = 0.0
    config.objective.disc_mlm_steps = 0
    # A unigram floor ('electra' only): this share of the masked slots gets a piece drawn from
    # the corpus's unigram distribution instead of the generator's sample (a replacement only
    # context tells apart), fading linearly to 0 over unigram_share_steps steps (0: constant);
    # 0 leaves it out, as the paper
    config.objective.unigram_share = 0.0
    config.objective.unigram_share_steps = 0
    # How replacements are drawn from the softmax: 'inverse_cdf' (one uniform per slot) or
    # 'gumbel' (jax.random.categorical, B x N x V uniforms); the same distribution.
    config.objective.sampler = "inverse_cdf"

    config.train = ml_collections.ConfigDict()
    config.train.num_steps = 1_000_000
    config.train.batch_size = 128  # global, over all devices and hosts
    config.train.learning_rate = 5e-4  # peak
    config.train.warmup_steps = 10_000
    config.train.weight_decay = 0.01
    config.train.clip_norm = 1.0
    config.train.adam_b1 = 0.9
    config.train.adam_b2 = 0.999
    config.train.adam_eps = 1e-6
    config.train.adam_bias_correction = False  # the original optimizer has none
    # The generator's learning rate as a multiple of train.learning_rate (its encoder and heads;
    # the shared embeddings take the discriminator's); 1: one learning rate, as the paper
    config.train.generator_lr_scale = 1.0
    # Start the replaced-token head's bias at the logit of objective.mask_prob (the share of
    # tokens a fresh generator replaces) instead of 0, as the original: a head that starts
    # calibrated; False keeps the original's initialisation
    config.train.rtd_prior_init = False
    # Start from pre-trained weights instead of random ones (a fresh run only; a resumed run
    # uses its checkpoint): a pre-training workdir, an export, or 'hf:DIR' (transformers ELECTRA
    # discriminator + generator: one of our exports, or a WordPiece pair such as Google's). The
    # model and generator sections must describe the same shapes; the tokenizer comes with it.
    config.train.init_from = ""
    # Run each batch as k micro-batches whose gradients are summed: activation memory of B / k
    # rows, the same update as B rows. train.batch_size stays the global batch.
    config.train.grad_accum_steps = 1
    # Optimizer steps per compiled call (a lax.scan over that many batches): per-call costs
    # (dispatch; on CPU, page-faulting in fresh temporaries) are paid once for all of them; the
    # numbers are those of single steps. Calls end early at log and checkpoint steps.
    config.train.steps_per_call = 4
    config.train.remat = "none"  # recompute in backward: 'none', 'full' or 'dots' (less memory)
    config.train.nan_policy = "stop"  # on a NaN/Inf loss or grad norm: 'stop' the run or 'skip'
    config.train.debug_nan_at_step = -1  # test hook: poison the update made at this step; -1 off

    config.mesh = ml_collections.ConfigDict()
    config.mesh.fsdp = 1  # 1 replicates parameters; N or -1 shards them over N or all devices

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every_steps = 10_000
    config.checkpoint.keep = 3  # newest checkpoints kept
    # Also keep every checkpoint whose step is a multiple of this (a multiple of every_steps),
    # never deleted, for downstream evaluation along the run; 0 keeps only the newest `keep`
    config.checkpoint.keep_every_steps = 0

    # Held-out evaluation, as the original's do_eval (no dropout, no update): disc AUC (also over
    # frequent pieces only: the reading of context), disc loss beside the prior's entropy,
    # precision/recall, generator accuracy, and the collapse cosine of the discriminator's states.
    # Added to the step's row in metrics.jsonl and TensorBoard under `eval/`, and at the last step.
    config.eval = ml_collections.ConfigDict()
    config.eval.every_steps = 10_000  # 0: no evaluation
    config.eval.batch_size = 0  # rows per held-out batch; 0: train.batch_size

    config.log = ml_collections.ConfigDict()
    config.log.every_steps = 100
    config.log.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0 looks it up by device kind
    # A W&B project to mirror the metrics rows and the config to ('' for none); needs the [wandb]
    # extra. WANDB_MODE=offline keeps it on this machine.
    config.log.wandb_project = ""
    # A trace of the steps profile_steps .. profile_steps + profile_num_steps - 1 (compiled
    # before it starts), in WORKDIR/profile/ for TensorBoard's profile plugin and Perfetto
    # (docs/performance.md); 0: no trace
    config.log.profile_steps = 0
    config.log.profile_num_steps = 3

    config.compile = ml_collections.ConfigDict()
    # jax's persistent compilation cache, where a restart finds the compiled step: a folder or
    # gs:// path; '' is $JAX_COMPILATION_CACHE_DIR where set, else WORKDIR/compile_cache;
    # 'off' compiles every start afresh
    config.compile.cache_dir = ""
    return config
