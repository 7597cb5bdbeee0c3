"""The SQuAD network: ELECTRA's discriminator encoder, a span head and (2.0) an answerability
classifier, as the original ELECTRA's finetune/qa/qa_tasks.py builds them.

- Start: one dense layer from each final hidden state to a logit.
- End, joint (the original's default): conditioned on the start. The end logit of token j for
  start i is dense(gelu(dense([h_i; h_j]))) with a 512-wide hidden layer; training conditions
  on the gold start, prediction on each of the top-k starts. Not joint: one dense layer, as BERT.
- Answerable (2.0): [h_CLS; sum_i softmax(start)_i h_i] -> dense 512, gelu -> a logit, trained
  with sigmoid cross-entropy to say "unanswerable", weighted by answerable_weight.

Starts and ends may only fall on the window's context tokens or on [CLS] (position 0, the
label of a window without the answer): every other logit gets -1000, as the original does. The
head's layers start from Glorot-uniform weights and zero biases (TF's dense-layer defaults, which
the original uses). Encoder parameter names are model.Electra's (`embeddings`,
`discriminator`), so a pre-trained tree drops in (heads.with_pretrained).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from electra_jax.model.networks import ElectraSpec, Embeddings, Encoder

_MASKED = -1000.0  # the original's additive mask: exp(-1000) is 0 in float32


class SpanModel(nn.Module):
    """[B, L] ids, segments, mask -> span logits; see the module docstring."""

    spec: ElectraSpec
    joint: bool = True
    answerable: bool = False
    head_size: int = 512  # the joint end layer's and the answerability layer's hidden width
    top_k: int = 20  # starts (and ends per start) that predict() keeps

    def setup(self):
        s = self.spec
        self.embeddings = Embeddings(s)
        self.discriminator = Encoder(s, s.discriminator)

        def dense(width, use_bias=True):
            return nn.Dense(
                width,
                use_bias=use_bias,
                dtype=jnp.float32,
                param_dtype=jnp.float32,
                kernel_init=nn.initializers.glorot_uniform(),
            )

        self.start_logit = dense(1)
        if self.joint:
            # dense([h_start; h_end]) as the sum of two products: the start's share is computed
            # once per start, not once per (start, end) pair.
            self.end_hidden_start = dense(self.head_size)
            self.end_hidden_end = dense(self.head_size, use_bias=False)
        self.end_logit = dense(1)
        if self.answerable:
            self.answerable_hidden = dense(self.head_size)
            self.answerable_logit = dense(1)

    def _hidden(self, input_ids, segment_ids, input_mask, deterministic: bool):
        """[B, L, H] float32 final states and the [B, L] float32 mask of allowed positions."""
        x = self.embeddings(input_ids, segment_ids, deterministic)
        h = self.discriminator(x, input_mask, deterministic).astype(jnp.float32)
        # Segment B is the window and its closing [SEP]; the [SEP] (the last real token) is no
        # answer token. [CLS] is allowed: it is the label of "not in this window".
        last = jnp.sum(input_mask, axis=-1, keepdims=True) - 1
        position = jnp.arange(input_ids.shape[1])[None, :]
        allowed = (segment_ids > 0) & (input_mask > 0) & (position != last)
        allowed |= position == 0
        return h, allowed.astype(jnp.float32)

    def _start_logits(self, h, allowed):
        """[B, L, H], [B, L] -> [B, L] masked start logits."""
        return self.start_logit(h)[..., 0] + _MASKED * (1.0 - allowed)

    def _end_logits(self, h, allowed, start_index):
        """[B, L, H], [B, L], [B, K] start positions -> [B, K, L] masked end logits (the same
        for every start when not joint)."""
        if self.joint:
            starts = jnp.take_along_axis(h, start_index[..., None], axis=1)  # [B, K, H]
            hidden = self.end_hidden_start(starts)[:, :, None] + self.end_hidden_end(h)[:, None]
            logits = self.end_logit(jax.nn.gelu(hidden))[..., 0]
        else:
            logits = jnp.broadcast_to(
                self.end_logit(h)[:, None, :, 0], (*start_index.shape, h.shape[1])
            )
        return logits + _MASKED * (1.0 - allowed[:, None])

    def _answerable_logit(self, h, start_logits):
        """[B, L, H], [B, L] -> [B]: the logit of "unanswerable"; zeros without the classifier."""
        if not self.answerable:
            return jnp.zeros(h.shape[:1], jnp.float32)
        attended = jnp.einsum("bl,blh->bh", jax.nn.softmax(start_logits, axis=-1), h)
        hidden = jax.nn.gelu(self.answerable_hidden(jnp.concatenate([h[:, 0], attended], -1)))
        return self.answerable_logit(hidden)[:, 0]

    def __call__(
        self, input_ids, segment_ids, input_mask, start_positions, deterministic: bool = True
    ) -> dict:
        """Training outputs: start_logits [B, L], end_logits [B, L] (given the gold start
        positions [B] when joint), answerable_logit [B]; float32."""
        h, allowed = self._hidden(input_ids, segment_ids, input_mask, deterministic)
        start_logits = self._start_logits(h, allowed)
        end_logits = self._end_logits(h, allowed, start_positions[:, None])[:, 0]
        return {
            "start_logits": start_logits,
            "end_logits": end_logits,
            "answerable_logit": self._answerable_logit(h, start_logits),
        }

    def predict(self, input_ids, segment_ids, input_mask) -> dict:
        """The top_k starts and, per start, the top_k ends, without dropout (K = top_k):
        start_index, start_score [B, K]; end_index, end_score [B, K, K]; answerable_logit [B];
        finite [B] (whether all of the example's scores are finite).

        Scores are log-probabilities when joint (the end's given the start), raw logits when
        not, as in the original; a span scores start_score + end_score.
        """
        h, allowed = self._hidden(input_ids, segment_ids, input_mask, True)
        start_logits = self._start_logits(h, allowed)
        if self.joint:
            start_score, start_index = jax.lax.top_k(jax.nn.log_softmax(start_logits), self.top_k)
            end_logits = self._end_logits(h, allowed, start_index)
            end_score, end_index = jax.lax.top_k(jax.nn.log_softmax(end_logits), self.top_k)
        else:
            start_score, start_index = jax.lax.top_k(start_logits, self.top_k)
            end_logits = self._end_logits(h, allowed, start_index)
            end_score, end_index = jax.lax.top_k(end_logits, self.top_k)
        answerable_logit = self._answerable_logit(h, start_logits)
        finite = jnp.all(jnp.isfinite(start_logits), -1) & jnp.all(jnp.isfinite(end_logits), (1, 2))
        return {
            "start_index": start_index,
            "start_score": start_score,
            "end_index": end_index,
            "end_score": end_score,
            "answerable_logit": answerable_logit,
            "finite": finite & jnp.isfinite(answerable_logit),
        }


def init_params(model: SpanModel, rng, seq_length: int = 8) -> dict:
    """Random float32 parameters of the whole network (encoder and heads), as plain arrays."""
    ids = jnp.zeros((1, seq_length), jnp.int32)
    variables = model.init(
        {"params": rng}, ids, ids, jnp.ones_like(ids), jnp.zeros((1,), jnp.int32)
    )
    return nn.meta.unbox(variables["params"])


def span_loss(outputs: dict, batch: dict, answerable_weight: float):
    """Mean over the batch of (CE(start) + CE(end)) / 2 + answerable_weight x the sigmoid
    cross-entropy of answerable_logit against is_impossible (when the model has the classifier).

    outputs: SpanModel's training outputs; batch: start_positions, end_positions,
    is_impossible [B] int32.
    """

    def cross_entropy(logits, positions):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, positions[:, None], axis=-1)[:, 0]

    per_example = 0.5 * (
        cross_entropy(outputs["start_logits"], batch["start_positions"])
        + cross_entropy(outputs["end_logits"], batch["end_positions"])
    )
    if answerable_weight:
        labels = batch["is_impossible"].astype(jnp.float32)
        logit = outputs["answerable_logit"]
        # log(1 + e^x) - x y, computed stably.
        bce = jnp.logaddexp(0.0, logit) - logit * labels
        per_example = per_example + answerable_weight * bce
    return jnp.mean(per_example)
