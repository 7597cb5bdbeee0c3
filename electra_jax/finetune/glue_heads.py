"""The fine-tuning network: ELECTRA's discriminator encoder and a linear layer on [CLS].

As the original ELECTRA's classification tasks: the final hidden state of the first token
([CLS]), dropout, one dense layer to the class logits (or to one score for regression). There is
no pooler (no dense + tanh); the generator is not part of the network.

Parameter names are those of model.Electra (`embeddings`, `discriminator`), so the subtrees of a
pre-trained parameter tree drop in as they are; the head is `classifier`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from electra_jax.model.networks import Dropout, ElectraSpec, Embeddings, Encoder

PRETRAINED_SUBTREES = ("embeddings", "discriminator")


class Classifier(nn.Module):
    """[B, L] ids, segments, mask -> [B, num_outputs] float32 logits (or scores)."""

    spec: ElectraSpec
    num_outputs: int

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        s = self.spec
        x = Embeddings(s, name="embeddings")(input_ids, segment_ids, deterministic)
        h = Encoder(s, s.discriminator, name="discriminator")(x, input_mask, deterministic)
        cls = Dropout(s.dropout_rate, name="classifier_dropout")(h[:, 0], deterministic)
        head = nn.Dense(
            self.num_outputs,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            # BERT's and ELECTRA's classifier initialisation: truncated normal, std 0.02.
            kernel_init=nn.initializers.truncated_normal(s.initializer_range),
            name="classifier",
        )
        return head(cls.astype(jnp.float32))


def init_params(model: Classifier, rng, seq_length: int = 8) -> dict:
    """Random float32 parameters of the whole network (encoder and head), as plain arrays."""
    ids = jnp.zeros((1, seq_length), jnp.int32)
    # model/networks.py tags its matrices with logical axis names (boxed values); drop the boxes.
    return nn.meta.unbox(model.init({"params": rng}, ids, ids, jnp.ones_like(ids))["params"])


def with_pretrained(params: dict, pretrained: dict) -> dict:
    """`params` with its encoder subtrees replaced by those of a pre-trained model.Electra tree.

    Only shapes of `params` are read (it may be abstract, from jax.eval_shape). Raises
    ValueError naming the first parameter whose place or shape differs.
    """
    out = dict(params)
    for name in PRETRAINED_SUBTREES:
        mine = jax.tree_util.tree_leaves_with_path(params[name])
        theirs = jax.tree_util.tree_leaves_with_path(pretrained[name])
        if [p for p, _ in mine] != [p for p, _ in theirs]:
            raise ValueError(f"the pre-trained '{name}' parameters do not match this model's")
        for (path, a), (_, b) in zip(mine, theirs, strict=True):
            if tuple(a.shape) != tuple(b.shape):
                where = name + jax.tree_util.keystr(path)
                raise ValueError(f"pre-trained {where} has shape {b.shape}, expected {a.shape}")
        out[name] = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), pretrained[name])
    return out


def task_loss(outputs, labels, regression: bool):
    """Sum of the per-example losses and the example count.

    outputs [B, C] float32; labels [B] int32 classes (softmax cross-entropy) or float32 scores
    (squared error against outputs[:, 0]).
    """
    if regression:
        per_example = jnp.square(outputs[:, 0] - labels)
    else:
        logp = jax.nn.log_softmax(outputs, axis=-1)
        per_example = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    return jnp.sum(per_example), jnp.asarray(labels.shape[0], jnp.float32)


def predictions(outputs, regression: bool):
    """[B, C] outputs -> [B] predicted classes (int32) or scores (float32)."""
    return outputs[:, 0] if regression else jnp.argmax(outputs, axis=-1).astype(jnp.int32)
