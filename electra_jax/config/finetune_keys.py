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

from electra_jax.config import groups, schema
from electra_jax.config.schema import ALLOW, FREE, KEEP, Key

_GLUE, _SQUAD = ("glue",), ("squad",)


def _key(name, default, doc, **rules) -> Key:
    """A fine-tuning key: held to the run's first start on a resume unless `resume` says."""
    return Key(name, default, doc, **{"resume": KEEP, **rules})


def _shared(concept, name="", **own) -> Key:
    """A key pre-training has too (config/groups.py: its range), as fine-tuning holds it."""
    return groups.shared(concept, name, **{"resume": KEEP, **own})


_PAPER = "0 is the paper's for the model's size"
# In the order the families' configs show them (a family's table keeps its own keys, in this
# order); `required`: a family's config must hold the key itself.
_DECLARED = schema.table(
    _key("family", "glue", "the task family: picks the runner's data, head and scorer"),
    # The task (tasks.get_task knows GLUE's names; squad_data.py SQuAD's versions).
    _key(
        "task",
        "SST-2",
        "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI",
        cross="a GLUE task (finetune/tasks.py)",
        families=_GLUE,
        required=_GLUE,
    ),
    _key(
        "version",
        "1.1",
        "'1.1' or '2.0' (2.0 adds unanswerable questions)",
        cross="a SQuAD version (finetune/squad_data.py)",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "data_dir",
        "",
        "the task's GLUE TSVs (or GLUE's root); '' reads TFDS glue/<task>",
        resume=ALLOW,
        allows="the task's files (or config.data_dir)",
        required=_SQUAD,
    ),
    _key(
        "tfds_data_dir",
        "",
        "TFDS data_dir when data_dir is ''; '' is TFDS's default",
        families=_GLUE,
    ),
    _key(
        "init_from",
        "",
        "a pre-training workdir, an export dir, 'hf:DIR'; '' = random init",
        resume=ALLOW,
        allows="the pre-trained weights (or config.init_from)",
    ),
    _shared("seed", doc="one seed for the head's init, dropout and the data order"),
    _key(
        "learning_rate",
        0.0,
        "peak; 0 = the paper's for the size: 3e-4 S, 1e-4 B, 5e-5 L",
        rule=">= 0",
        why=_PAPER,
        cross="0, or at least config/groups.LEARNING_RATE's lowest",
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
    _shared("weight_decay", doc="AdamW, not on LayerNorm parameters or biases"),
    _shared("adam_eps", doc="Adam's epsilon (b1 0.9, b2 0.999)"),
    _shared("adam_bias_correction"),
    _shared("clip_norm", doc="global gradient-norm clipping, as the original"),
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
        why="0 is the task's",
        required=_GLUE + _SQUAD,
    ),
    _key(
        "max_train_examples",
        0,
        "> 0 caps the training set (a fixed random subset); 0 = all",
        rule=">= 0",
        why="0 is all",
    ),
    _key(
        "double_unordered",
        True,
        "MRPC and STS-B also train on (B, A): the relation is symmetric",
        families=_GLUE,
    ),
    _key(
        "scale_regression_targets",
        True,
        "STS-B trains on score / 5 in [0, 1] as the original; predictions are reported on 0-5",
        families=_GLUE,
    ),
    _shared("model.dropout_rate", "dropout_rate", doc="hidden, attention and classifier dropout"),
    _shared("model.dtype", "dtype"),
    _shared("seq_length", doc="[CLS] A [SEP] B [SEP], the longer text cut first"),
    # SQuAD's own: the windows, the heads and the decoding.
    _key(
        "doc_stride",
        128,
        "a long context's next window starts this many tokens later",
        rule=">= 1",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "max_query_length",
        64,
        "longer questions keep their first 64 tokens",
        rule=">= 1",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "joint_prediction",
        True,
        "the end conditioned on the start (the original's); False: independent start and end "
        "layers, as BERT",
        families=_SQUAD,
    ),
    _key(
        "head_size",
        512,
        "hidden width of the joint end layer and of the answerable layer",
        rule=">= 1",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "n_best_size",
        20,
        "starts, and ends per start, each window keeps; answers ranked",
        rule=">= 1",
        cross="at most seq_length",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "max_answer_length",
        30,
        "longest answer in tokens",
        rule=">= 1",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "answerable_weight",
        0.5,
        "2.0: weight of the answerability loss",
        rule=">= 0",
        families=_SQUAD,
        required=_SQUAD,
    ),
    _key(
        "null_threshold",
        -2.75,
        '2.0: answer "" when the no-answer logit exceeds this',
        rule=">= -1e30",
        why="any finite number",
        families=_SQUAD,
        required=_SQUAD,
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
    _shared("checkpoint.every_steps", default=1000, resume=FREE),
    _shared("checkpoint.keep", default=2, doc="the newest this many are kept", resume=FREE),
    # Random init only (init_from = ''): the tokenizer and the network's shape.
    _key(
        "tokenizer",
        "",
        "a SentencePiece model dir or file; '' trains one on the task's text",
        cross="'' unless init_from is '' (a pre-trained model brings its own)",
    ),
    _shared("vocab_size", default=4096, doc="pieces of that trained tokenizer"),
    *groups.model_shape(
        resume=KEEP,
        docs={
            "model.hidden_size": "width of the encoder's states",
            "model.num_layers": "transformer layers",
            "model.max_position_embeddings": (
                "positions the embedding table holds: the longest seq_length"
            ),
        },
    ),
    _shared("model.initializer_range", doc="truncated-normal std (the head's too)"),
    _shared("model.layer_norm_eps"),
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


def _family_table(family: str, differs: dict) -> tuple[Key, ...]:
    """The keys `family` has, in the declared order, with `differs`' changes."""
    return schema.table(
        *(
            dataclasses.replace(key, **differs.get(key.name, {}))
            for key in _DECLARED
            if not key.families or family in key.families
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

# The keys a family's config must hold itself (Key.required): another family's config given
# `--config.family` is not converted by filling them in (finetune/checks.py refuses it in one line).
REQUIRED = {
    family: tuple(k.name for k in keys if family in k.required) for family, keys in TABLES.items()
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
