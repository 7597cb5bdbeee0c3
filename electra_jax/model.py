"""ELECTRA's networks in Flax Linen: a shared embedding block, a narrow generator, a discriminator.

Both encoders are BERT's post-LayerNorm Transformer. The generator and the discriminator share the
word, position and type embedding tables and the embedding LayerNorm (the original code puts them
under one variable scope); each network owns its projection from the embedding width E to its
hidden width H, created only where E != H. The generator's output layer is tied to the word
embeddings and has its own bias. Parameters are always float32; `dtype` is the compute type.

Parameter names follow Hugging Face's ElectraModel where they can, so export stays a renaming.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """One Transformer stack: width, depth, heads and feed-forward width."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int


@dataclasses.dataclass(frozen=True)
class ElectraSpec:
    """Everything that fixes the shapes and the numerics of the two networks (hashable)."""

    vocab_size: int
    embedding_size: int
    max_position_embeddings: int
    type_vocab_size: int
    discriminator: EncoderSpec
    generator: EncoderSpec
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: str = "float32"


def generator_spec(disc: EncoderSpec, hidden_fraction: float, layers_fraction: float = 1.0):
    """The original's get_generator_config: width = fraction x H, heads = max(1, width // 64)."""
    width = max(1, round(disc.hidden_size * hidden_fraction))
    return EncoderSpec(
        hidden_size=width,
        num_layers=max(1, round(disc.num_layers * layers_fraction)),
        num_heads=max(1, width // 64),
        intermediate_size=4 * width,
    )


def spec_from_config(model_cfg: Any, generator_cfg: Any, vocab_size: int) -> ElectraSpec:
    """Builds the spec from the `model` and `generator` config sections and the tokenizer's size."""
    disc = EncoderSpec(
        hidden_size=model_cfg.hidden_size,
        num_layers=model_cfg.num_layers,
        num_heads=model_cfg.num_heads,
        intermediate_size=model_cfg.intermediate_size,
    )
    return ElectraSpec(
        vocab_size=vocab_size,
        embedding_size=model_cfg.embedding_size,
        max_position_embeddings=model_cfg.max_position_embeddings,
        type_vocab_size=model_cfg.type_vocab_size,
        discriminator=disc,
        generator=generator_spec(
            disc, generator_cfg.hidden_fraction, generator_cfg.get("layers_fraction", 1.0)
        ),
        dropout_rate=model_cfg.dropout_rate,
        attention_dropout_rate=model_cfg.attention_dropout_rate,
        initializer_range=model_cfg.initializer_range,
        layer_norm_eps=model_cfg.layer_norm_eps,
        dtype=model_cfg.dtype,
    )


def _init(spec: ElectraSpec):
    return nn.initializers.truncated_normal(spec.initializer_range)


def _dense(spec: ElectraSpec, features: int, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=jnp.dtype(spec.dtype),
        param_dtype=jnp.float32,
        kernel_init=_init(spec),
        name=name,
    )


def _layer_norm(spec: ElectraSpec, name: str) -> nn.LayerNorm:
    # Statistics are computed in float32 whatever the compute type (flax promotes them).
    return nn.LayerNorm(
        epsilon=spec.layer_norm_eps,
        dtype=jnp.dtype(spec.dtype),
        param_dtype=jnp.float32,
        name=name,
    )


def _gelu(x):
    return nn.gelu(x, approximate=False)  # BERT and ELECTRA use the exact erf form


class Embeddings(nn.Module):
    """Word + position + type embeddings, LayerNorm, dropout: [B, L] ids -> [B, L, E]."""

    spec: ElectraSpec

    def setup(self):
        s = self.spec
        self.word_embeddings = nn.Embed(
            s.vocab_size, s.embedding_size, embedding_init=_init(s), name="word_embeddings"
        )
        self.position_embeddings = nn.Embed(
            s.max_position_embeddings,
            s.embedding_size,
            embedding_init=_init(s),
            name="position_embeddings",
        )
        self.token_type_embeddings = nn.Embed(
            s.type_vocab_size,
            s.embedding_size,
            embedding_init=_init(s),
            name="token_type_embeddings",
        )
        self.layer_norm = _layer_norm(s, "LayerNorm")
        self.dropout = nn.Dropout(s.dropout_rate)

    def __call__(self, input_ids, segment_ids, deterministic: bool):
        length = input_ids.shape[1]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(jnp.arange(length))[None]
            + self.token_type_embeddings(segment_ids)
        )
        x = self.layer_norm(x)
        return self.dropout(x, deterministic=deterministic).astype(self.spec.dtype)

    def attend(self, hidden):
        """[..., E] -> [..., V] logits against the word table (the tied output layer)."""
        table = self.word_embeddings.embedding.astype(self.spec.dtype)
        return jnp.einsum("...e,ve->...v", hidden.astype(self.spec.dtype), table)


class SelfAttention(nn.Module):
    """Multi-head self-attention; scores and softmax in float32."""

    spec: ElectraSpec
    encoder: EncoderSpec

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool):
        s, e = self.spec, self.encoder
        head_dim = e.hidden_size // e.num_heads

        def project(name):
            return nn.DenseGeneral(
                (e.num_heads, head_dim),
                dtype=jnp.dtype(s.dtype),
                param_dtype=jnp.float32,
                kernel_init=_init(s),
                name=name,
            )(x)

        q, k, v = project("query"), project("key"), project("value")  # [B, L, heads, head_dim]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        scores = scores / jnp.sqrt(jnp.float32(head_dim)) + attention_bias
        probs = jax.nn.softmax(scores, axis=-1)
        probs = nn.Dropout(s.attention_dropout_rate)(probs, deterministic=deterministic)
        context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(s.dtype), v)
        return nn.DenseGeneral(
            e.hidden_size,
            axis=(-2, -1),
            dtype=jnp.dtype(s.dtype),
            param_dtype=jnp.float32,
            kernel_init=_init(s),
            name="output",
        )(context)


class TransformerLayer(nn.Module):
    """BERT's post-LayerNorm block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    spec: ElectraSpec
    encoder: EncoderSpec

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool):
        s, e = self.spec, self.encoder
        drop = nn.Dropout(s.dropout_rate)
        a = SelfAttention(s, e, name="attention")(x, attention_bias, deterministic)
        x = _layer_norm(s, "attention_LayerNorm")(x + drop(a, deterministic=deterministic))
        h = _gelu(_dense(s, e.intermediate_size, "intermediate")(x))
        h = _dense(s, e.hidden_size, "output")(h)
        return _layer_norm(s, "output_LayerNorm")(x + drop(h, deterministic=deterministic))


class Encoder(nn.Module):
    """[B, L, E] embeddings -> [B, L, H] states: optional E->H projection, then the layers."""

    spec: ElectraSpec
    encoder: EncoderSpec

    @nn.compact
    def __call__(self, embedded, input_mask, deterministic: bool):
        s, e = self.spec, self.encoder
        x = embedded
        if s.embedding_size != e.hidden_size:
            x = _dense(s, e.hidden_size, "embeddings_project")(x)
        # Padding keys get a large negative bias; queries at padding are computed and ignored.
        bias = jnp.where(input_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
        for i in range(e.num_layers):
            x = TransformerLayer(s, e, name=f"layer_{i}")(x, bias, deterministic)
        return x


class Electra(nn.Module):
    """Generator and discriminator over one shared embedding block.

    Methods (call through `model.apply(variables, ..., method=...)`):
      generator_logits:     masked ids [B, L], positions [B, N] -> [B, N, V] float32
      discriminator_logits: ids [B, L] -> [B, L] float32 (> 0 means "replaced")
      discriminator_hidden: ids [B, L] -> [B, L, H]
    `__call__` runs both, for initialisation.
    """

    spec: ElectraSpec

    def setup(self):
        s = self.spec
        self.embeddings = Embeddings(s, name="embeddings")
        self.generator = Encoder(s, s.generator, name="generator")
        self.discriminator = Encoder(s, s.discriminator, name="discriminator")
        self.generator_dense = _dense(s, s.embedding_size, "generator_predictions_dense")
        self.generator_layer_norm = _layer_norm(s, "generator_predictions_LayerNorm")
        self.generator_bias = self.param(
            "generator_lm_head_bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32
        )
        self.discriminator_dense = _dense(
            s, s.discriminator.hidden_size, "discriminator_predictions_dense"
        )
        self.discriminator_out = _dense(s, 1, "discriminator_predictions_dense_prediction")

    def generator_logits(
        self, input_ids, segment_ids, input_mask, positions, deterministic: bool = True
    ):
        """Generator logits at the masked slots only: positions [B, N] -> [B, N, V] float32."""
        x = self.embeddings(input_ids, segment_ids, deterministic)
        h = self.generator(x, input_mask, deterministic)
        h = jnp.take_along_axis(h, positions[..., None], axis=1)  # [B, N, Hg]
        h = self.generator_layer_norm(_gelu(self.generator_dense(h)))
        return self.embeddings.attend(h).astype(jnp.float32) + self.generator_bias

    def discriminator_hidden(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        """Discriminator states: [B, L] -> [B, L, H]."""
        x = self.embeddings(input_ids, segment_ids, deterministic)
        return self.discriminator(x, input_mask, deterministic)

    def discriminator_logits(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        """Replaced-token logits: [B, L] -> [B, L] float32."""
        h = self.discriminator_hidden(input_ids, segment_ids, input_mask, deterministic)
        h = _gelu(self.discriminator_dense(h))
        return self.discriminator_out(h)[..., 0].astype(jnp.float32)

    def __call__(self, input_ids, segment_ids, input_mask, positions, deterministic: bool = True):
        gen = self.generator_logits(input_ids, segment_ids, input_mask, positions, deterministic)
        disc = self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic)
        return gen, disc


def init_params(model: Electra, rng, batch_size: int = 1, seq_length: int = 8):
    """Initial float32 parameters (a nested dict)."""
    ids = jnp.zeros((batch_size, seq_length), jnp.int32)
    positions = jnp.zeros((batch_size, 1), jnp.int32)
    return model.init({"params": rng}, ids, ids, jnp.ones_like(ids), positions)["params"]


def count_params(tree) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))


def network_param_counts(params) -> dict[str, int]:
    """Parameters of each network as it is kept and exported (shared embeddings in both)."""
    shared = count_params(params["embeddings"])
    gen = count_params(params["generator"]) + count_params(params["generator_lm_head_bias"])
    gen += count_params(params["generator_predictions_dense"])
    gen += count_params(params["generator_predictions_LayerNorm"])
    disc = count_params(params["discriminator"])
    disc += count_params(params["discriminator_predictions_dense"])
    disc += count_params(params["discriminator_predictions_dense_prediction"])
    return {
        "discriminator": shared + disc,
        "generator": shared + gen,
        "total": count_params(params),
    }
