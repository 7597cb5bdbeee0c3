"""Every pre-training key, declared once: its default (ELECTRA-Small, as in the paper: the base of
every config in configs/), doc, range or choices, resume rule and meaning when absent
(schema.Key). configs/small.py is these defaults; the other configs override them.

Imports nothing of electra_jax but the schema, and no jax.
"""

from __future__ import annotations

from electra_jax.config.groups import LEARNING_RATE, LEARNING_RATE_WHY, model_shape, shared
from electra_jax.config.schema import ALLOW, FREE, MODEL, Key, table

# Settings that enter float32 arithmetic on the device are held to the range in which that
# arithmetic means something (Key.float32; the shared keys' in config/groups.py).
_STEPS = 2**31 - 1  # optax and the loop count steps in int32
# Sampling divides float32 logits (|logit| up to ~1e3) by the temperature: below 1e-3 they
# overflow to inf and the softmax to NaN; above 1e3 every vocabulary is uniform anyway.
TEMPERATURE = (1e-3, 1e3)
_INT32_STEP = "the step is counted in int32"
_LOSS_WEIGHT = (
    "the loss terms are summed in float32 and clipped by one global gradient norm: a weight "
    "beyond 1e6 drowns the other terms below float32's resolution"
)

# The sections' own docs, shown above their keys by --print_config.
SECTIONS = {
    "model": "the discriminator",
    "eval": (
        "Held-out evaluation, as the original's do_eval (no dropout, no update): disc AUC (also "
        "over frequent pieces only: the reading of context), disc loss beside the prior's "
        "entropy, precision/recall, generator accuracy, and the collapse cosine of the "
        "discriminator's states. Added to the step's row in metrics.jsonl and TensorBoard under "
        "`eval/`, and at the last step."
    ),
}

# The sections a pre-training config file holds itself (every one has since the first); the
# later ones (eval, mesh, compile) are completed with their defaults (cli.check_family).
REQUIRED_SECTIONS = ("model", "generator", "data", "train", "objective", "checkpoint", "log")

KEYS = table(
    shared("seed"),
    Key(
        "data.source",
        "builtin",
        (
            "'builtin' | 'text:GLOB' | 'parquet:GLOB[:COLUMN]' | 'jsonl:GLOB[:FIELD]' | "
            "'tfds:NAME[:SPLIT]'"
        ),
        cross="its form: data.sources.parse (validate.check_config)",
    ),
    Key(
        "data.mixture",
        "",
        (
            "several sources drawn by weight, 'SOURCE:WEIGHT;SOURCE:WEIGHT' (each a data.source "
            "form, optionally NAME=SOURCE:WEIGHT); '' reads data.source alone"
        ),
        cross=(
            "two or more sources, each once, weights > 0; data.source left at its default "
            "(data.mixture.check, in validate.check_config)"
        ),
    ),
    shared(
        "seq_length",
        "data.seq_length",
        resume=MODEL,
        cross="at most model.max_position_embeddings",
        memory=True,
    ),
    shared("vocab_size", "data.vocab_size", resume=MODEL),
    Key(
        "data.cache_dir",
        "",
        "prepared shards; '' keeps them in WORKDIR/data",
        resume=FREE,
        path=True,
        cross="a folder; a URI only gs:// (validate.check_config)",
    ),
    Key(
        "data.tokenizer",
        "",
        "an existing SentencePiece model; '' trains one on the corpus",
        resume=FREE,  # a resumed run keeps its own; another file is refused by fingerprint
    ),
    Key(
        "data.tokenizer_sample_sentences",
        1000000,
        "sentences sampled to train SentencePiece",
        rule=">= 1",
    ),
    Key(
        "data.character_coverage",
        0.9995,
        "SentencePiece: share of characters given a piece",
        rule="(0, 1]",
    ),
    Key(
        "data.single_segment_prob",
        0.1,
        "examples with only segment A, as in fine-tuning",
        rule="[0, 1]",
    ),
    Key(
        "data.short_seq_prob",
        0.05,
        "examples packed to a random shorter length",
        rule="[0, 1]",
    ),
    Key(
        "data.examples_per_shard",
        100000,
        "rows per ArrayRecord shard",
        rule=">= 1",
        resume=FREE,
    ),
    Key(
        "data.tfds_text_field",
        "text",
        "tfds sources: the feature holding a document's text",
    ),
    Key(
        "data.tfds_data_dir",
        "",
        "tfds sources: TFDS data_dir; '' is TFDS's default",
        resume=FREE,
    ),
    Key(
        "data.heldout_examples",
        1024,
        (
            "Rows never trained on, read by the held-out evaluation (`eval`): blocks of 16 "
            "consecutive rows spread evenly over the corpus, the same for every seed; a multiple "
            "of the evaluation batch. 0 trains on every row (and leaves nothing to evaluate on)"
        ),
        rule=">= 0",
        why="0 trains on every row",
        absent=0,  # a run started before the held-out slice trained on every row
        cross="a multiple of the evaluation batch when eval.every_steps > 0",
    ),
    *model_shape(resume=MODEL),
    shared("model.dropout_rate", resume=MODEL),
    shared(
        "model.attention_dropout_rate",
        resume=MODEL,
        cross="0 for model.attention 'xla' and 'cudnn'",
    ),
    shared("model.initializer_range", resume=MODEL),
    shared("model.layer_norm_eps", resume=MODEL),
    # The compute type only: the parameters stay float32.
    shared("model.dtype", resume=ALLOW, memory=True),
    Key(
        "model.attention",
        "auto",
        (
            "'auto' ('pallas' on TPU devices, 'einsum' elsewhere), 'einsum' (dropout on "
            "attention probabilities, as the paper), 'pallas' (the same function and dropout as "
            "a Pallas TPU kernel, FlashAttention's tiling: TPU devices only) or "
            "jax.nn.dot_product_attention kernels 'xla' / 'cudnn' (fused, GPU-fast, need "
            "attention_dropout_rate = 0)"
        ),
        rule=("auto", "einsum", "pallas", "xla", "cudnn"),
        resume=MODEL,
        cross="'cudnn' needs model.dtype 'bfloat16' and a GPU; 'pallas' TPU devices",
        memory=True,
    ),
    Key(
        "model.embedding_sharing",
        "electra",
        (
            "Embeddings of generator and discriminator: 'electra' (shared), 'gdes' (DeBERTa-v3: "
            "the discriminator adds its own zero-initialised deltas to the generator's tables, "
            "under stop_gradient) or 'none' (separate tables)"
        ),
        rule=("electra", "gdes", "none"),
        resume=MODEL,
        absent="electra",  # the one mode before the option
    ),
    Key(
        "model.scan_layers",
        True,
        (
            "One layer body compiled once and scanned over parameters stacked on a leading layer "
            "axis (compiles several times faster); False unrolls the layers, the layout of runs "
            "started before this option, which resume in their own layout whatever this says"
        ),
        rule=(True, False),
        resume=MODEL,
        absent=False,  # a run started before the option holds its layers unrolled
        memory=True,
    ),
    Key(
        "generator.hidden_fraction",
        0.25,
        "width = 1/4 of the discriminator's, same depth",
        rule="> 0",
        resume=MODEL,
        cross="a width of at least 1 that its heads of 64 divide",
    ),
    Key(
        "generator.layers_fraction",
        1.0,
        "the generator's depth as a share of model.num_layers",
        rule="(0, 1]",
        resume=MODEL,
    ),
    Key(
        "objective.name",
        "electra",
        (
            "'electra' (replaced token detection) or the paper's ablations: 'electra_15' (RTD "
            "loss on the masked 15% only), 'mlm' (BERT: 80% [MASK], 10% random, 10% kept; no "
            "generator), 'replaced_mlm' (MLM on generator-replaced tokens), 'all_tokens_mlm' "
            "(predict every token, with a copy mechanism), 'two_stage' (the generator alone, then"
            " the discriminator started from it with the generator frozen; needs "
            "generator.hidden_fraction = 1), 'adversarial' (the generator maximises the "
            "discriminator's loss by REINFORCE with a learned baseline), 'electra_mlm' (ELECTRA "
            "plus BERT's MLM on the discriminator: a second pass over the masked ids, weighted by"
            " disc_mlm_weight)"
        ),
        resume=MODEL,
        cross="an objective of objectives/names.py (validate.check_config)",
    ),
    Key(
        "objective.two_stage_steps",
        0,
        "'two_stage': the generator-only steps before the switch",
        cross="'two_stage': from 1 to train.num_steps - 1",
    ),
    Key(
        "objective.mle_warmup_steps",
        0,
        (
            "'adversarial': steps of maximum-likelihood training before the policy gradient takes"
            " over (the paper states no warm start: 0)"
        ),
        rule=">= 0",
        cross="at most train.num_steps - 1",
    ),
    Key(
        "objective.mask_prob",
        0.15,
        "share of tokens the generator fills",
        rule="(0, 1)",
    ),
    Key(
        "objective.mask_token_prob",
        0.85,
        "of those, share shown as [MASK] (the rest kept)",
        rule="[0, 1]",
    ),
    Key(
        "objective.gen_weight",
        1.0,
        "weight of the generator's MLM loss",
        rule=">= 0",
        float32=(0.0, 1e6),
        why=_LOSS_WEIGHT,
    ),
    Key(
        "objective.disc_weight",
        50.0,
        "weight of the discriminator's RTD loss",
        rule=">= 0",
        float32=(0.0, 1e6),
        why=_LOSS_WEIGHT,
    ),
    Key(
        "objective.temperature",
        1.0,
        "sampling temperature of the generator's softmax",
        float32=TEMPERATURE,
        why="float32 logits divided by it must stay finite",
    ),
    Key(
        "objective.temperature_start",
        0.0,
        (
            "A temperature schedule: start at temperature_start and come down linearly to "
            "temperature over temperature_steps steps (0: the temperature throughout, as the "
            "paper)"
        ),
        cross="0, or in [0.001, 1000] with objective.temperature_steps > 0",
    ),
    Key(
        "objective.temperature_steps",
        0,
        "steps the temperature comes down over from temperature_start; 0: no schedule",
        rule=">= 0",
        cross="at most train.num_steps",
    ),
    Key(
        "objective.disc_mlm_weight",
        0.0,
        (
            "The discriminator's own MLM term: on 'electra' it also predicts the original tokens "
            "at the masked slots from the corrupted text it reads ('electra_mlm': from the masked"
            " ids, in a second pass), with this weight, fading linearly to 0 over disc_mlm_steps "
            "steps (0: constant); 0 leaves it out, as the paper ('electra_mlm' needs it above 0)"
        ),
        rule=">= 0",
        float32=(0.0, 1e6),
        why=_LOSS_WEIGHT,
        cross="0 but for 'electra' and 'electra_mlm', which needs it above 0",
    ),
    Key(
        "objective.disc_mlm_steps",
        0,
        "steps disc_mlm_weight fades to 0 over; 0: constant",
        rule=">= 0",
        cross="at most train.num_steps",
    ),
    Key(
        "objective.unigram_share",
        0.0,
        (
            "A unigram floor ('electra' only): this share of the masked slots gets a piece drawn "
            "from the corpus's unigram distribution instead of the generator's sample (a "
            "replacement only context tells apart), fading linearly to 0 over unigram_share_steps"
            " steps (0: constant); 0 leaves it out, as the paper"
        ),
        rule="[0, 1]",
        why="the share of masked slots filled from the corpus's unigram distribution",
        cross="0 but for 'electra'",
    ),
    Key(
        "objective.unigram_share_steps",
        0,
        "steps unigram_share fades to 0 over; 0: constant",
        rule=">= 0",
        cross="at most train.num_steps; 0 unless unigram_share > 0",
    ),
    Key(
        "objective.sampler",
        "inverse_cdf",
        (
            "How replacements are drawn from the softmax: 'inverse_cdf' (one uniform per slot) or"
            " 'gumbel' (jax.random.categorical, B x N x V uniforms); the same distribution."
        ),
        rule=("inverse_cdf", "gumbel"),
    ),
    Key(
        "train.num_steps",
        1000000,
        "optimizer steps of the run",
        rule=">= 1",
        float32=(1, _STEPS),
        why=_INT32_STEP,
        resume=FREE,
    ),
    Key(
        "train.batch_size",
        128,
        "global, over all devices and hosts",
        rule=">= 1",
        cross="divisible by the data-parallel devices and the processes",
        memory=True,
    ),
    Key(
        "train.learning_rate",
        0.0005,
        "peak",
        rule="> 0",
        float32=LEARNING_RATE,
        why=LEARNING_RATE_WHY,
    ),
    Key(
        "train.warmup_steps",
        10000,
        "linear warm-up to the peak learning rate, then linear decay to 0",
        rule=">= 0",
        float32=(0, _STEPS),
        why=_INT32_STEP,
    ),
    shared("weight_decay", "train.weight_decay", cross="weight_decay x learning_rate < 1"),
    shared("clip_norm", "train.clip_norm"),
    shared("adam_b1", "train.adam_b1"),
    shared("adam_b2", "train.adam_b2"),
    shared("adam_eps", "train.adam_eps"),
    shared("adam_bias_correction", "train.adam_bias_correction"),
    Key(
        "train.generator_lr_scale",
        1.0,
        (
            "The generator's learning rate as a multiple of train.learning_rate (its encoder and "
            "heads; the shared embeddings take the discriminator's); 1: one learning rate, as the"
            " paper"
        ),
        rule="> 0",
        cross="learning_rate x generator_lr_scale in [1e-09, 10]",
    ),
    Key(
        "train.rtd_prior_init",
        False,
        (
            "Start the replaced-token head's bias at the logit of objective.mask_prob (the share "
            "of tokens a fresh generator replaces) instead of 0, as the original: a head that "
            "starts calibrated; False keeps the original's initialisation"
        ),
        rule=(False, True),
    ),
    Key(
        "train.init_from",
        "",
        (
            "Start from pre-trained weights instead of random ones (a fresh run only; a resumed "
            "run uses its checkpoint): a pre-training workdir, an export, or 'hf:DIR' "
            "(transformers ELECTRA discriminator + generator: one of our exports, or a WordPiece "
            "pair such as Google's). The model and generator sections must describe the same "
            "shapes; the tokenizer comes with it."
        ),
        resume=FREE,  # read by a fresh run only
        cross="a URI only gs://",
        path=True,
    ),
    Key(
        "train.grad_accum_steps",
        1,
        (
            "Run each batch as k micro-batches whose gradients are summed: activation memory of B"
            " / k rows, the same update as B rows. train.batch_size stays the global batch."
        ),
        resume=FREE,
        cross=">= 1 and divides train.batch_size",
        memory=True,
    ),
    Key(
        "train.steps_per_call",
        4,
        (
            "Optimizer steps per compiled call (a lax.scan over that many batches): per-call "
            "costs (dispatch; on CPU, page-faulting in fresh temporaries) are paid once for all "
            "of them; the numbers are those of single steps. Calls end early at log and "
            "checkpoint steps."
        ),
        rule=">= 1",
        resume=FREE,
        absent=1,  # one step per call before the option
        memory=True,
    ),
    Key(
        "train.remat",
        "none",
        (
            "What each layer's backward pass recomputes instead of keeping (less memory, more "
            "time; the same numbers): 'none'; 'save_matmuls' (keeps the matmul outputs, the "
            "attention probabilities among them); 'save_projections' (also recomputes the "
            "attention core); 'save_qkv_ffn' (keeps q/k/v and the FFN's intermediate only); "
            "'full' (keeps the layer's input only); 'dots', 'offload_probs' (save_matmuls with "
            "the probabilities in host memory); or 'auto': the first of none, save_matmuls, "
            "save_projections, save_qkv_ffn, full whose step fits the devices' memory, found by "
            "compiling it, and kept in the workdir (remat_choice.json) for a resume on the same "
            "devices."
        ),
        rule=(
            "none",
            "save_matmuls",
            "save_projections",
            "save_qkv_ffn",
            "full",
            "dots",
            "offload_probs",
            "auto",
        ),
        resume=FREE,
    ),
    Key(
        "train.nan_policy",
        "stop",
        "on a NaN/Inf loss or grad norm: 'stop' the run or 'skip'",
        rule=("stop", "skip"),
        resume=FREE,
    ),
    Key(
        "train.debug_nan_at_step",
        -1,
        "test hook: poison the update made at this step; -1 off",
        resume=FREE,
    ),
    Key(
        "mesh.fsdp",
        1,
        "1 replicates parameters; N or -1 shards them over N or all devices",
        resume=FREE,
        cross=">= 1, or -1 for all devices",
        memory=True,
    ),
    shared("checkpoint.every_steps"),
    Key(
        "checkpoint.every_minutes",
        0.0,
        (
            "Also a checkpoint at the first metrics row (log.every_steps) this many minutes after "
            "the last checkpoint or the start, by process 0's clock for every process; 0: by "
            "steps only. By the clock alone: checkpoint.every_steps above train.num_steps"
        ),
        rule=">= 0",
        resume=FREE,
    ),
    shared("checkpoint.keep"),
    Key(
        "checkpoint.keep_every_steps",
        0,
        (
            "Also keep every checkpoint whose step is a multiple of this (a multiple of "
            "every_steps), never deleted, for downstream evaluation along the run; 0 keeps only "
            "the newest `keep`"
        ),
        rule=">= 0",
        why="0 keeps only the newest checkpoint.keep",
        resume=FREE,
        cross="a multiple of checkpoint.every_steps",
    ),
    Key(
        "eval.every_steps",
        10000,
        "0: no evaluation",
        rule=">= 0",
        resume=FREE,
        absent=0,  # no evaluation before the option
    ),
    Key(
        "eval.batch_size",
        0,
        "rows per held-out batch; 0: train.batch_size",
        resume=FREE,
        cross=">= 1, or 0; divides data.heldout_examples",
    ),
    Key(
        "log.every_steps",
        100,
        "steps between metrics rows and progress lines",
        rule=">= 1",
        resume=FREE,
    ),
    Key(
        "log.peak_flops",
        0.0,
        "per-device peak FLOP/s for MFU; 0 looks it up by device kind",
        rule=">= 0",
        resume=FREE,
    ),
    Key(
        "log.wandb_project",
        "",
        (
            "A W&B project to mirror the metrics rows and the config to ('' for none); needs the "
            "[wandb] extra. WANDB_MODE=offline keeps it on this machine."
        ),
        resume=FREE,
        cross="needs wandb installed",
    ),
    Key(
        "log.profile_steps",
        0,
        (
            "A trace of the steps profile_steps .. profile_steps + profile_num_steps - 1 "
            "(compiled before it starts), in WORKDIR/profile/ for TensorBoard's profile plugin "
            "and Perfetto (docs/performance.md); 0: no trace"
        ),
        rule=">= 0",
        resume=FREE,
    ),
    Key(
        "log.profile_num_steps",
        3,
        "steps the trace covers",
        rule=">= 1",
        resume=FREE,
    ),
    Key(
        "compile.cache_dir",
        "",
        (
            "jax's persistent compilation cache, where a restart finds the compiled step: a "
            "folder or gs:// path; '' is $JAX_COMPILATION_CACHE_DIR where set, else "
            "WORKDIR/compile_cache; 'off' compiles every start afresh"
        ),
        resume=FREE,
        cross="a folder; a URI only gs://; 'off' for none",
        path=True,
    ),
    Key(
        "export.license",
        "",
        (
            "The license the model card of an export states, as a Hugging Face Hub license id "
            "('apache-2.0', 'mit', 'cc-by-4.0', 'other', ...), in its metadata and its text; "
            "'' states none (nothing is guessed, not even from the corpus)"
        ),
        # Recorded in config.json with the change, where the export reads it: a license chosen
        # after the run is set by running it again with --allow_change=export.license.
        allows="the license the next export's card states",
        cross="a Hub license id: lowercase letters, digits, '.', '-' and '+'",
    ),
)
