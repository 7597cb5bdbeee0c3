"""Every fine-tuning key, declared once (schema.Key): the keys both families have, GLUE's and
SQuAD's own, each family's table in the order configs/glue.py and configs/squad.py show them,
and the resume rule a fine-tuning follows (free_on_resume, allowed_changes).

A key both families have is declared once with GLUE's default and doc; where SQuAD's differ
(_SQUAD_DIFFERS), SQuAD's table holds the key with them replaced. Imports nothing of
electra_jax but the schema, and no jax.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from electra_jax.config import schema
from electra_jax.config.schema import ALLOW, FREE, KEEP, Key

_STRINGS = ("float32", "bfloat16")


def _key(name, default, doc, **rules) -> Key:
    """A fine-tuning key: held to the run's first start on a resume unless `resume` says."""
    return Key(name, default, doc, **{"resume": KEEP, **rules})


_PAPER = "0: the paper's for the model's size"
_DECLARED = schema.table(
    _key("family", "glue", "the task family: picks the runner's data, head and scorer"),
    # GLUE's own: the task (tasks.get_task knows the names), how it is read and trained.
    _key(
        "task",
        "SST-2",
        "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI",
        cross="a GLUE task (finetune/tasks.py)",
    ),
    _key(
        "data_dir",
        "",
        "the task's GLUE TSVs (or GLUE's root); '' reads TFDS glue/<task>",
        resume=ALLOW,
        allows="the task's files (or config.data_dir)",
    ),
    _key("tfds_data_dir", "", "TFDS data_dir when data_dir is ''; '' is TFDS's default"),
    _key(
        "init_from",
        "",
        "a pre-training workdir, an export dir, 'hf:DIR'; '' = random init",
        resume=ALLOW,
        allows="the pre-trained weights (or config.init_from)",
    ),
    _key(
        "seed",
        0,
        "one seed for the head's init, dropout and the data order",
        rule="[0, 4294967296)",
        why="the random key takes 32 bits",
    ),
    _key(
        "learning_rate",
        0.0,
        "peak; 0 = the paper's for the size: 3e-4 S, 1e-4 B, 5e-5 L",
        rule=">= 0",
        why=_PAPER,
        cross="0, or at least 1e-9",
    ),
    _key(
        "layer_decay",
        0.0,
        "0 = the paper's: 0.8 (Small, Base), 0.9 (Large); 1 = no decay",
        rule="[0, 1]",
        why=f"{_PAPER}; 1: no decay",
    ),
    _key(
        "layer_decay_exponents",
        "electra_jax",
        "'electra_jax': lr x decay^(N-i) for layer i of N, x decay^(N+1) the embeddings, the "
        "head x1; 'original': one factor more below the head (top layer decay^2), as the "
        "original code has it (its issue #51), to reproduce the paper's numbers exactly",
        rule=("electra_jax", "original"),
    ),
    _key(
        "warmup_fraction",
        0.1,
        "linear warm-up over this share of the steps, then linear decay",
        rule="[0, 1)",
    ),
    _key("weight_decay", 0.01, "AdamW, not on LayerNorm parameters or biases", rule=">= 0"),
    _key(
        "adam_eps",
        1e-6,
        "Adam's epsilon (b1 0.9, b2 0.999)",
        rule="[1e-30, 1]",
        why="smaller rounds to 0 in float32 and 0/0 is NaN",
    ),
    _key("adam_bias_correction", False, "the original optimizer has none"),
    _key(
        "clip_norm",
        1.0,
        "global gradient-norm clipping, as the original",
        rule="[1e-30, 1e30]",
        why="gradients are scaled by it in float32",
    ),
    _key(
        "batch_size",
        32,
        "examples per update, split over the local devices",
        rule=">= 1",
        cross="divisible by the local devices",
    ),
    _key(
        "num_epochs",
        0.0,
        "0 = the task's: 3, or 10 for RTE and STS-B",
        rule=">= 0",
        why="0: the task's",
    ),
    _key("seq_length", 128, "[CLS] A [SEP] B [SEP], the longer text cut first", rule=">= 8"),
    _key(
        "max_train_examples",
        0,
        "> 0 caps the training set (a fixed random subset); 0 = all",
        rule=">= 0",
        why="0: all",
    ),
    _key(
        "double_unordered",
        True,
        "MRPC and STS-B also train on (B, A): the relation is symmetric",
    ),
    _key(
        "scale_regression_targets",
        True,
        "STS-B trains on score / 5 in [0, 1] as the original; predictions are reported on 0-5",
    ),
    _key(
        "dropout_rate",
        0.1,
        "hidden, attention and classifier dropout",
        rule="[0, 0.999999999]",
        why="the kept units are scaled by 1 / (1 - rate)",
    ),
    _key(
        "dtype",
        "float32",
        "compute type: 'float32' or 'bfloat16'; params stay float32",
        rule=_STRINGS,
    ),
    # SQuAD's own: the version, the windows, the heads and the decoding.
    _key(
        "version",
        "1.1",
        "'1.1' or '2.0' (2.0 adds unanswerable questions)",
        cross="a SQuAD version (finetune/squad_data.py)",
    ),
    _key(
        "doc_stride",
        128,
        "a long context's next window starts this many tokens later",
        rule=">= 1",
    ),
    _key("max_query_length", 64, "longer questions keep their first 64 tokens", rule=">= 1"),
    _key(
        "joint_prediction",
        True,
        "the end conditioned on the start (the original's); False: independent start and end "
        "layers, as BERT",
    ),
    _key(
        "head_size",
        512,
        "hidden width of the joint end layer and of the answerable layer",
        rule=">= 1",
    ),
    _key(
        "n_best_size",
        20,
        "starts, and ends per start, each window keeps; answers ranked",
        rule=">= 1",
        cross="at most seq_length",
    ),
    _key("max_answer_length", 30, "longest answer in tokens", rule=">= 1"),
    _key("answerable_weight", 0.5, "2.0: weight of the answerability loss", rule=">= 0"),
    _key(
        "null_threshold",
        -2.75,
        '2.0: answer "" when the no-answer logit exceeds this',
        rule=">= -1e30",
        why="any finite number",
    ),
    # Both families again.
    _key(
        "eval_batch_size",
        128,
        "dev examples per prediction step",
        rule=">= 1",
        cross="divisible by the local devices",
    ),
    _key(
        "log_every_steps",
        50,
        "a progress line every this many steps",
        rule=">= 1",
        resume=FREE,
    ),
    _key(
        "checkpoint.every_steps",
        1000,
        "steps between checkpoints (the last step always has one)",
        rule=">= 1",
        resume=FREE,
    ),
    _key("checkpoint.keep", 2, "the newest this many are kept", rule=">= 1", resume=FREE),
    # Random init only (init_from = ''): the tokenizer and the network's shape.
    _key(
        "tokenizer",
        "",
        "a SentencePiece model dir or file; '' trains one on the task's text",
        cross="'' unless init_from is '' (a pre-trained model brings its own)",
    ),
    _key(
        "vocab_size",
        4096,
        "pieces of that trained tokenizer",
        rule=">= 6",
        why="the 5 special pieces and at least one more",
    ),
    _key("model.hidden_size", 256, "width of the encoder's states", rule=">= 1"),
    _key("model.num_layers", 12, "transformer layers", rule=">= 1"),
    _key(
        "model.num_heads",
        4,
        "attention heads; they divide hidden_size",
        rule=">= 1",
    ),
    _key("model.intermediate_size", 1024, "feed-forward width", rule=">= 1"),
    _key(
        "model.embedding_size",
        128,
        "E; projected to hidden_size where they differ",
        rule=">= 1",
    ),
    _key(
        "model.max_position_embeddings",
        512,
        "positions the embedding table holds: the longest seq_length",
        rule=">= 8",
    ),
    _key(
        "model.type_vocab_size",
        2,
        "segment embeddings (A and B)",
        rule=">= 2",
        why="segments A and B",
    ),
    _key(
        "model.initializer_range",
        0.02,
        "truncated-normal std (the head's too)",
        rule="[1e-30, 1000]",
        why="squared in LayerNorm's float32 variance",
    ),
    _key(
        "model.layer_norm_eps",
        1e-12,
        "added to LayerNorm's variance",
        rule="[1e-30, 1]",
        why="smaller rounds to 0 in float32",
    ),
)

# Where SQuAD's default or doc differs from GLUE's (or its rule: SQuAD has no task's epochs).
_SQUAD_DIFFERS = {
    "family": {"default": "squad"},
    "data_dir": {"doc": "the folder holding train-v{version}.json and dev-v{version}.json"},
    "seed": {"doc": "one seed for the heads' init, dropout and the data order"},
    "layer_decay_exponents": {
        "doc": "'electra_jax' or 'original' (one factor of decay more below the head, the "
        "original code's leftover of its removed pooler): see configs/glue.py"
    },
    "batch_size": {"doc": "windows per update, split over the local devices"},
    "num_epochs": {
        "default": 2.0,
        "doc": "the original's for SQuAD; steps = windows x epochs / batch",
        "rule": "> 0",
        "why": "",
    },
    "seq_length": {"default": 512, "doc": "tokens per window"},
    "max_train_examples": {"doc": "> 0 trains on a fixed random subset of the questions; 0 = all"},
    "dropout_rate": {"doc": "hidden and attention dropout"},
    "eval_batch_size": {"default": 32, "doc": "dev windows per prediction step"},
    "log_every_steps": {"default": 100},
    "tokenizer": {"doc": "a SentencePiece model dir or file; '' trains one on the training text"},
    "vocab_size": {"default": 8192},
    "model.initializer_range": {"doc": "truncated-normal std of the encoder's weights"},
}

_COMMON_HEAD = (
    "family {} data_dir {}init_from seed learning_rate layer_decay layer_decay_exponents "
)
_COMMON_OPT = "warmup_fraction weight_decay adam_eps adam_bias_correction clip_norm batch_size "
_TAIL = (
    "eval_batch_size log_every_steps checkpoint.every_steps checkpoint.keep tokenizer vocab_size "
    "model.hidden_size model.num_layers model.num_heads model.intermediate_size "
    "model.embedding_size model.max_position_embeddings model.type_vocab_size "
    "model.initializer_range model.layer_norm_eps"
)
_ORDER = {
    "glue": _COMMON_HEAD.format("task", "tfds_data_dir ")
    + _COMMON_OPT
    + "num_epochs seq_length max_train_examples double_unordered scale_regression_targets "
    + "dropout_rate dtype "
    + _TAIL,
    "squad": _COMMON_HEAD.format("version", "")
    + _COMMON_OPT
    + "num_epochs max_train_examples dropout_rate dtype seq_length doc_stride "
    + "max_query_length joint_prediction head_size n_best_size max_answer_length "
    + "answerable_weight null_threshold "
    + _TAIL,
}


def _family_table(family: str, differs: dict) -> tuple[Key, ...]:
    declared = schema.by_name(_DECLARED)
    return schema.table(
        *(
            dataclasses.replace(declared[name], **differs.get(name, {}))
            for name in _ORDER[family].split()
        )
    )


# config.family -> its keys, in the order its config shows them.
TABLES = {"glue": _family_table("glue", {}), "squad": _family_table("squad", _SQUAD_DIFFERS)}

# The sections' own docs, shown above their keys by --print_config.
SECTIONS = {
    "checkpoint": (
        "Orbax checkpoints (train state and every step's loss) in WORKDIR/checkpoints: rerunning "
        "the command resumes from the newest one, bit for bit; the last step always has one."
    ),
    "model": "ELECTRA-Small's discriminator (configs/small.py)",
}

# The keys a family's config must hold itself: another family's config given `--config.family`
# is not converted by filling them in (finetune/checks.py refuses it in one line).
REQUIRED = {
    "glue": ("task", "num_epochs"),
    "squad": (
        "version",
        "data_dir",
        "num_epochs",
        "doc_stride",
        "max_query_length",
        "n_best_size",
        "max_answer_length",
        "answerable_weight",
        "null_threshold",
        "head_size",
    ),
}

# Read by a random init only (init_from = ''): a pre-trained model brings its own.
RANDOM_INIT = ("vocab_size", *(k.name for k in _DECLARED if k.name.startswith("model.")))


def defaults(family: str) -> ml_collections.ConfigDict:
    """The family's config at its defaults: what configs/glue.py and configs/squad.py give."""
    return schema.defaults(TABLES[family])


def _family(config) -> str | None:
    name = getattr(config, "family", None)
    return name if name in TABLES else None


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with the keys of its family it lacks at their defaults (schema.complete), but
    the family's REQUIRED ones; `config` itself when its family is unknown (checks.py says so)."""
    family = _family(config)
    if family is None:
        return config
    return schema.complete(config, [k for k in TABLES[family] if k.name not in REQUIRED[family]])


def checked(config) -> list[Key]:
    """The keys of `config`'s family whose values schema.check_values checks: all but the
    random-init ones when config.init_from names a pre-trained model."""
    keys = TABLES[_family(config) or "glue"]
    skip = RANDOM_INIT if config.init_from else ()
    return [k for k in keys if k.name not in skip]


def free_on_resume() -> tuple[str, ...]:
    """The keys a resumed fine-tuning may find changed without a word (Key.resume FREE)."""
    return tuple(k.name for k in _DECLARED if k.resume == FREE)


def allowed_changes() -> dict[str, str]:
    """{key: what it lets differ}: the keys a fine-tuning's --allow_change takes (Key.resume
    ALLOW)."""
    return {k.name: k.allows for k in _DECLARED if k.resume == ALLOW}
