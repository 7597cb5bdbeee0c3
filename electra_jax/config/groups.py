"""The keys pre-training and fine-tuning share, declared once: the model's shape, the optimizer's
numbers, dropout, the compute type, sequence and vocabulary, the seed and the checkpoint cadence.

Each shared key's range (rule, float32 range and why) is stated here only; a command's table
includes the key through `shared`, under its own name and with its own default, doc and resume
rule where they differ (fine-tuning names `train.learning_rate`'s neighbours without a section,
and holds every key to a run's first start). Imports nothing of electra_jax but the schema, and
no jax.
"""

from __future__ import annotations

import dataclasses

from electra_jax.config.schema import FREE, Key, table

# Settings that enter float32 arithmetic on the device are held to the range in which that
# arithmetic means something (Key.float32): a value finite in Python can still round to 0, 1 or
# inf there, or drown everything else.
TINY = 1e-30  # well inside float32's normal range (from 1.2e-38): devices flush smaller to 0
_DROPOUT_TOP = 1 - 1e-9  # the dropout mask keeps a unit if 32 random bits fall below (1-rate) 2^32

# The learning rates a run may train at: an Adam step moves each weight by about the learning
# rate; float32 rounds a smaller step away against weights of ~0.02, and a larger one throws them
# past anything trained. Pre-training's train.learning_rate holds it as its float32 range, the
# checks of the rates derived from it (validate.py) and fine-tuning's nonzero rate (0 there is
# the paper's for the size: finetune/checks.py) read it here.
LEARNING_RATE = (1e-9, 10.0)
LEARNING_RATE_WHY = (
    "an Adam step moves each weight by about the learning rate; float32 rounds a smaller step "
    "away against weights of ~0.02, and a larger one throws them past anything trained"
)

_SHARED = table(
    Key(
        "seed",
        0,
        "one seed for initialisation, data order and every step's randomness",
        rule="[0, 2**32)",
        why="jax's random keys and Grain's shuffle take 32 bits",
    ),
    Key("seq_length", 128, "tokens per example, [CLS] and [SEP]s included", rule=">= 8"),
    Key(
        "vocab_size",
        30522,
        "SentencePiece pieces, the five specials included (BERT's size)",
        rule=">= 6",
        why="the 5 special pieces and at least one more",
    ),
    # The model's shape.
    Key(
        "model.hidden_size",
        256,
        "width of the discriminator's states",
        rule=">= 1",
        cross="divisible by model.num_heads",
    ),
    Key(
        "model.num_layers",
        12,
        (
            "transformer layers of the discriminator (the generator's too, times "
            "generator.layers_fraction)"
        ),
        rule=">= 1",
    ),
    Key("model.num_heads", 4, "attention heads; they divide hidden_size", rule=">= 1"),
    Key("model.intermediate_size", 1024, "feed-forward width", rule=">= 1"),
    Key("model.embedding_size", 128, "E; projected to hidden_size where they differ", rule=">= 1"),
    Key(
        "model.max_position_embeddings",
        512,
        "positions the embedding table holds: the longest data.seq_length",
        rule=">= 8",
    ),
    Key(
        "model.type_vocab_size",
        2,
        "segment embeddings (A and B)",
        rule=">= 2",
        why="every example has segments A and B",
    ),
    Key(
        "model.initializer_range",
        0.02,
        "truncated-normal std",
        rule="> 0",
        float32=(TINY, 1e3),
        why="the initial weights' products are squared in LayerNorm's variance, in float32",
    ),
    Key(
        "model.layer_norm_eps",
        1e-12,
        "added to LayerNorm's variance",
        rule="> 0",
        float32=(TINY, 1.0),
        why=(
            "it is added to the variance under a square root: smaller rounds to 0 in float32, and "
            "a constant input divides by 0"
        ),
    ),
    # Dropout and the compute type.
    Key(
        "model.dropout_rate",
        0.1,
        "dropout on the embeddings and every layer's outputs",
        rule="[0, 1)",
        float32=(0.0, _DROPOUT_TOP),
        why="the kept units are scaled by 1 / (1 - rate)",
    ),
    Key(
        "model.attention_dropout_rate",
        0.1,
        "dropout on the attention probabilities ('einsum' and 'pallas')",
        rule="[0, 1)",
        float32=(0.0, _DROPOUT_TOP),
        why="the kept probabilities are scaled by 1 / (1 - rate)",
    ),
    Key(
        "model.dtype",
        "float32",
        "compute type: 'float32' or 'bfloat16'; params stay float32",
        rule=("float32", "bfloat16"),
    ),
    # The optimizer's numbers (the learning rate's range is LEARNING_RATE).
    Key("weight_decay", 0.01, "AdamW's, not on LayerNorm parameters or biases", rule=">= 0"),
    Key(
        "clip_norm",
        1.0,
        "global gradient-norm clipping",
        rule="> 0",
        float32=(TINY, 1e30),
        why="gradients are scaled by it in float32",
    ),
    Key("adam_b1", 0.9, "Adam's first-moment decay", rule="[0, 1)", below_one_in_float32=True),
    Key("adam_b2", 0.999, "Adam's second-moment decay", rule="[0, 1)", below_one_in_float32=True),
    Key(
        "adam_eps",
        1e-06,
        "Adam's epsilon",
        rule="> 0",
        float32=(TINY, 1.0),
        why=(
            "it divides the update of every weight no batch touched yet, whose moments are 0: "
            "smaller rounds to 0 in float32 and 0/0 is NaN"
        ),
    ),
    Key("adam_bias_correction", False, "the original optimizer has none"),
    # The checkpoint cadence: a resume may change it silently.
    Key(
        "checkpoint.every_steps",
        10000,
        "steps between checkpoints (the last step always has one)",
        rule=">= 1",
        resume=FREE,
    ),
    Key("checkpoint.keep", 3, "newest checkpoints kept", rule=">= 1", resume=FREE),
)
_BY_CONCEPT = {k.name: k for k in _SHARED}

# What a command may change of a shared key; its range (rule, float32, why) stays the group's.
_OWN = {"name", "default", "doc", "resume", "absent", "cross", "allows", "families", "required"}
_OWN |= {"path", "memory"}

# The model's shape, in the order both commands show it.
MODEL_SHAPE = (
    "model.hidden_size",
    "model.num_layers",
    "model.num_heads",
    "model.intermediate_size",
    "model.embedding_size",
    "model.max_position_embeddings",
    "model.type_vocab_size",
)


def shared(concept: str, name: str = "", **own) -> Key:
    """The shared key `concept` (its name here) as a command's table holds it: named `name`
    (default: `concept`), with `own`'s default, doc, resume rule ... where the command's differ.
    ValueError for a change to its range, which is stated here once."""
    ranged = sorted(set(own) - _OWN)
    if ranged:
        raise ValueError(f"{concept}: {', '.join(ranged)} is the shared group's (config/groups.py)")
    return dataclasses.replace(_BY_CONCEPT[concept], name=name or concept, **own)


def model_shape(docs: dict[str, str] | None = None, **own) -> tuple[Key, ...]:
    """The model's shape keys (MODEL_SHAPE), each with `own` (a resume rule, ...) and its doc
    from `docs` where the command words it its own way."""
    docs = docs or {}
    return tuple(shared(c, **own, **({"doc": docs[c]} if c in docs else {})) for c in MODEL_SHAPE)
