"""The name of every file and folder our commands write or read in a workdir or an export.

Each name is spelled here once; the modules that write, read, list or check one import it, so a
renamed file cannot leave a reader, the workdir's ownership checks (workdir.py) or the export's
layout (hf/write.py) behind. A leaf: it imports nothing, so any module may use it.

The names inside a folder of one format stay with the module that owns the format: the
tokenizer's files (data/tokenizer.py, data/wordpiece.py), a checkpoint's items (checkpointing.py),
the prepared shards' manifest (data/shards.py) and transformers' weight files (hf/names.py);
each is spelled there once.

A pre-training workdir holds CONFIG_FILE, TOKENIZER_DIR/, DATA_DIR/ (the prepared shards, unless
data.cache_dir puts them elsewhere), CHECKPOINTS_DIR/, METRICS_FILE, TENSORBOARD_DIR/,
CHANGES_FILE, DATA_RECORD, REMAT_RECORD, EVAL_FILE, COMMANDS_FILE, the W&B files and EXPORT_DIR/
(the export's default place); a fine-tuning workdir holds CONFIG_FILE, MODEL_FILE,
TOKENIZER_DIR/, WEIGHTS_FILE, RESULTS_FILE, its predictions, CHECKPOINTS_DIR/ and CHANGES_FILE.
Both hold MARKER and LOCK.
"""

# ---------------------------------------------------------------------------- every workdir
# The marker that makes a folder a workdir of ours, and the lock that gives it to one run.
MARKER = ".electra_jax"
LOCK = ".lock"
# The run's config (pre-training: its sections; fine-tuning: its flags); in an export,
# transformers' config.json of each model, under the same name.
CONFIG_FILE = "config.json"
# The tokenizer the run trained or copied (SentencePiece's or WordPiece's files).
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"
# What a resume was allowed to find changed, at which step (pre-training and fine-tuning alike).
CHANGES_FILE = "config_changes.jsonl"

# ------------------------------------------------------------------------ pre-training only
# One JSON row per logged step (and the step-time, goodput and evaluation rows).
METRICS_FILE = "metrics.jsonl"
# TensorBoard's event files of the same rows.
TENSORBOARD_DIR = "tensorboard"
# The prepared shards when data.cache_dir is empty.
DATA_DIR = "data"
# What a pre-training run read: its corpus, tokenizer and prepared shards (resume.py writes it).
DATA_RECORD = "data_record.json"
# train.remat='auto''s choice of policy and what it was made for (remat_auto.py writes it).
REMAT_RECORD = "remat_choice.json"
# The rows `evaluate` appends: one per checkpoint evaluated on held-out text.
EVAL_FILE = "eval.jsonl"
# The command line of each start of a pre-training run, at its step: the export's model card
# names the one that started it. W&B's run of a workdir (log.wandb_project): its id, and the
# folder of W&B's own files.
COMMANDS_FILE = "commands.jsonl"
WANDB_FILE, WANDB_DIR = "wandb.json", "wandb"
# jax's persistent compilation cache (compile.cache_dir's default) and log.profile_steps' trace.
COMPILE_CACHE_DIR = "compile_cache"
PROFILE_DIR = "profile"
# `export`'s default OUT inside a workdir, and what the export's reference check logs there.
EXPORT_DIR = "hf"
HF_REFERENCE_METRICS_FILE = "hf_reference_metrics.jsonl"

# ------------------------------------------------------------------------- fine-tuning only
# The fine-tuned model: what it is (family, task, the pre-trained spec) and its weights.
MODEL_FILE = "model.json"
WEIGHTS_FILE = "model.safetensors"
RESULTS_FILE = "eval_results.json"
# The dev set's predictions: GLUE's one JSON row per example, SQuAD's answers by question id,
# and SQuAD 2.0's no-answer odds (the official script's --na-prob-file input).
GLUE_PREDICTIONS_FILE = "dev_predictions.jsonl"
SQUAD_PREDICTIONS_FILE = "dev_predictions.json"
NULL_SCORES_FILE = "dev_null_odds.json"

# ------------------------------------------------------------------------------- an export
# What an export wrote, with each file's sha256 (pre-training's and fine-tuning's exports).
EXPORT_MANIFEST = "export.json"
# A pre-training's export: a folder per network, each a transformers model.
EXPORT_NETWORKS = ("discriminator", "generator")
# The model card.
README_FILE = "README.md"
# transformers' tokenizer files beside the vocabulary.
HF_TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
HF_SPECIAL_TOKENS_FILE = "special_tokens_map.json"
