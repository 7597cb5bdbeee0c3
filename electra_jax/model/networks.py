"""ELECTRA's networks in Flax Linen: a shared embedding block, a narrow generator, a discriminator.

Both encoders are BERT's post-LayerNorm Transformer. The generator and the discriminator share the
word, position and type embedding tables and the embedding LayerNorm (the original code puts them
under one variable scope); each network owns its projection from the embedding width E to its
hidden width H, created only where E != H. The generator's output layer is tied to the word
embeddings and has its own bias. Parameters are always float32; `dtype` is the compute type.

Parameter names follow Hugging Face's ElectraModel where they can; attention keeps q, k and v in
one fused [H, 3, heads, head_dim] kernel (one matmul), which export splits into three.

Every matrix carries logical axis names (`embed` for a network's model width, `mlp`, `heads`,
`kv`, `vocab`; `sharding.param_shardings` maps them to the mesh): the parameters themselves stay
plain arrays (`init_params` unboxes them) and `abstract_params` reads the names back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from electra_jax.errors import ConfigError
from electra_jax.model import kernels


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
    # What the backward pass recomputes per layer: 'none', or a policy of _REMAT_POLICIES.
    remat: str = "none"
    # 'einsum' (ours, with dropout on the probabilities), 'pallas' (the same function as a
    # Pallas TPU kernel: flash_attention.py), jax.nn.dot_product_attention's 'xla' / 'cudnn'
    # kernels (fused; they have no dropout on the probabilities), or 'auto': 'pallas' where the
    # step is compiled for TPU devices (`platform`), else 'einsum' (resolved_attention): the
    # schema's default, so that a spec read back from an export equals its run's.
    attention: str = "auto"
    # Where activations live: a jax.sharding.Sharding whose leading axis splits the batch, or
    # None. FSDP runs set it so that the partitioner keeps every [B, ...] activation split over
    # the batch and gathers weights instead (sharding.py); it changes no number.
    activation_sharding: Any = None
    # The platform of the devices the step is compiled for ('cpu', 'gpu', 'tpu'), or None for
    # jax's default backend at trace time. A dry run compiles for TPU devices on a machine whose
    # default backend is the CPU, so the paths tuned for one backend ask this, not jax.
    platform: str | None = None
    # The batch's split over the devices (sharding.batch_sharding of the run's mesh), for the
    # kernels the partitioner cannot split by itself: model.attention='pallas' runs per device
    # under shard_map over it. None on one device; program.build sets it for 'pallas' runs on
    # several. Changes no number.
    batch_sharding: Any = None
    # How the two networks hold embeddings: 'electra' (one shared block), 'gdes' (DeBERTa-v3's
    # gradient-disentangled sharing: the discriminator's tables are stop_gradient(generator's) +
    # its own zero-initialised deltas, so its loss never moves the generator's tables) or 'none'
    # (the generator has its own block, `generator_embeddings`).
    embedding_sharing: str = "electra"
    # An MLM head on the discriminator (`mlm_predictions_*`, output tied to its word table), for
    # the objectives in which the discriminator-sized network predicts tokens.
    mlm_head: bool = False
    # How an encoder's layers are built: True, one layer body under lax.scan over parameters
    # stacked on a leading [num_layers] axis (`layers`), so XLA compiles the body once; False,
    # num_layers unrolled copies (`layer_0` ...), the layout of checkpoints from before the
    # switch. Both compute the same function; `layer_stack` converts between the layouts.
    scan_layers: bool = True
    # A learned baseline on the generator's states (`adversarial_baseline`, one logit per
    # position), for the adversarial objective's policy gradient.
    policy_baseline: bool = False


EMBEDDING_SHARING = ("electra", "gdes", "none")
# The name of an encoder's stacked layers (spec.scan_layers) and of their leading axis.
LAYERS = "layers"


def generator_spec(disc: EncoderSpec, hidden_fraction: float, layers_fraction: float = 1.0):
    """The original's get_generator_config: width = fraction x H, heads = max(1, width // 64)."""
    width = max(1, round(disc.hidden_size * hidden_fraction))
    return EncoderSpec(
        hidden_size=width,
        num_layers=max(1, round(disc.num_layers * layers_fraction)),
        num_heads=max(1, width // 64),
        intermediate_size=4 * width,
    )


def spec_from_config(
    model_cfg: Any,
    generator_cfg: Any,
    vocab_size: int,
    remat: str = "none",
    mlm_head: bool = False,
    policy_baseline: bool = False,
) -> ElectraSpec:
    """Builds the spec from the `model` and `generator` config sections and the tokenizer's size.

    `remat` is `train.remat`: a training choice that changes memory and time, not the numbers.
    `mlm_head`: whether the objective needs the discriminator's MLM head
    (`Objective.needs_mlm_head`); `policy_baseline`, the generator's baseline
    (`Objective.policy_baseline`); objectives/registry.model_heads gives both for a config.
    """
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
            disc, generator_cfg.hidden_fraction, generator_cfg.layers_fraction
        ),
        dropout_rate=model_cfg.dropout_rate,
        attention_dropout_rate=model_cfg.attention_dropout_rate,
        initializer_range=model_cfg.initializer_range,
        layer_norm_eps=model_cfg.layer_norm_eps,
        dtype=model_cfg.dtype,
        remat=remat,
        attention=model_cfg.attention,
        embedding_sharing=model_cfg.embedding_sharing,
        mlm_head=mlm_head,
        policy_baseline=policy_baseline,
        scan_layers=bool(model_cfg.scan_layers),
    )


# The names a layer gives its tensors (jax.ad_checkpoint.checkpoint_name), by which the remat
# policies below keep or recompute them: q, k and v [B, heads, L, d] (the fused projection's
# output, its bias added and its heads moved first), the attention core's probabilities
# [B, heads, L, L] float32 (kernels.attention_core, before dropout) and output [B, heads, L, d],
# the attention's output projection [B * L, H], the FFN's intermediate pre-activation [B, L, F]
# and its output [B, L, H] (before dropout).
QKV = "qkv"
ATTENTION_PROBS = kernels.ATTENTION_PROBS
ATTENTION_CONTEXT = "attention_context"
ATTENTION_OUTPUT = "attention_output"
FFN_INTERMEDIATE = "ffn_intermediate"
FFN_OUTPUT = "ffn_output"
PROJECTIONS = (QKV, ATTENTION_OUTPUT, FFN_INTERMEDIATE, FFN_OUTPUT)

_keep = jax.checkpoint_policies.save_only_these_names

# Rematerialisation policies: what each layer keeps from its forward pass for its backward pass;
# the rest is recomputed there from what is kept (at least the layer's input). 'full' keeps only
# the input. 'dots' keeps the outputs of matmuls without batch dimensions (the q/k/v, attention
# output and FFN intermediate projections, before their biases). 'save_matmuls' keeps q/k/v, the
# attention probabilities and output, the output projection and both FFN matmuls' outputs: it
# recomputes the element-wise work (LayerNorms, dropout, GELU), not the attention core.
# 'save_projections' keeps the four projections' outputs (q/k/v, attention output, FFN
# intermediate and output) and recomputes the attention core (scores, softmax, dropout, context)
# too; 'save_qkv_ffn' keeps q/k/v and the FFN intermediate only. 'offload_probs' keeps what
# 'save_matmuls' does, the probabilities in the host's memory instead of the device's.
# benchmarks/notes/remat.md has each one's memory and the TPU compiler's estimate of its time;
# remat_auto.ORDER ranks them by it.
_MATMULS = (*PROJECTIONS, ATTENTION_CONTEXT, ATTENTION_PROBS)
_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_matmuls": _keep(*_MATMULS),
    "save_projections": _keep(*PROJECTIONS),
    "save_qkv_ffn": _keep(QKV, FFN_INTERMEDIATE),
    "offload_probs": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[n for n in _MATMULS if n != ATTENTION_PROBS],
        names_which_can_be_offloaded=[ATTENTION_PROBS],
        offload_src="device",
        offload_dst="pinned_host",
    ),
}
# What train.remat names a layer's policy by ('auto' is chosen among them by the run: remat_auto).
REMAT_CHOICES = ("none", *_REMAT_POLICIES)


def _init(spec: ElectraSpec, axes: tuple[str | None, ...]):
    """The truncated-normal initializer, tagged with the parameter's logical axis names."""
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(spec.initializer_range), axes
    )


class _TokenDense(nn.Module):
    """nn.Dense's parameters ('kernel' [K, N], 'bias' [N]) over a 2-D [tokens, K] matrix.

    On XLA:CPU a contraction over two leading dims (the weight gradient of a dense applied to
    [B, L, K]) copies its operand through a transposing loop fusion that runs ~10x slower than a
    plain transpose; over [B * L, K] the same gradient is one matmul with no copy.
    With `gelu_input`, the layer computes gelu(inputs) @ kernel + bias (see `kernels.gelu_dense`).
    """

    features: int
    dtype: jnp.dtype
    kernel_init: Callable
    gelu_input: bool = False

    @nn.compact
    def __call__(self, inputs):
        kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        lead = inputs.shape[:-1]
        rows = inputs.reshape(-1, inputs.shape[-1]).astype(self.dtype)
        kernel, bias = kernel.astype(self.dtype), bias.astype(self.dtype)
        if self.gelu_input:
            out = kernels.gelu_dense(rows, kernel, bias)
        else:
            out = kernels.add_bias(rows @ kernel, bias)
        return out.reshape(*lead, self.features)


def _dense(
    spec: ElectraSpec,
    features: int,
    name: str,
    axes: tuple[str | None, ...] = ("embed", "mlp"),
    gelu_input: bool = False,
    glorot: bool = False,
) -> _TokenDense:
    """A Dense layer; `axes` names its kernel's (input, output) axes. A matrix whose two axes are
    both model widths names the output `embed_out`, which is never sharded (one mesh axis cannot
    shard two dimensions of one array). `glorot`: a Glorot-uniform kernel instead of the
    truncated normal, for the original's two `tf.layers.dense` calls that give no initializer
    (`embeddings_project` and the discriminator's 1-unit output) and so get TF's default."""
    if glorot:
        kernel_init = nn.with_logical_partitioning(nn.initializers.glorot_uniform(), axes)
    else:
        kernel_init = _init(spec, axes)
    return _TokenDense(
        features, jnp.dtype(spec.dtype), kernel_init, gelu_input=gelu_input, name=name
    )


class _LayerNorm(nn.Module):
    """nn.LayerNorm's parameters ('scale', 'bias' [N]) and numbers (statistics in float32),
    with scale and bias gradients as matmuls rather than column reductions
    (`kernels.scale_shift`). In a 16-bit compute dtype, `kernels.layer_norm`, whose backward
    keeps the input in that dtype rather than two float32 copies of it."""

    epsilon: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        width = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones_init(), (width,))
        bias = self.param("bias", nn.initializers.zeros_init(), (width,))
        if self.dtype != jnp.float32:
            return kernels.layer_norm(x, scale, bias, self.epsilon).astype(self.dtype)
        x = x.astype(jnp.float32)
        centered = x - jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
        y = centered * jax.lax.rsqrt(variance + self.epsilon)
        return kernels.scale_shift(y, scale, bias).astype(self.dtype)


def _layer_norm(spec: ElectraSpec, name: str) -> _LayerNorm:
    # Statistics are computed in float32 whatever the compute type.
    return _LayerNorm(spec.layer_norm_eps, jnp.dtype(spec.dtype), name=name)


def platform(spec: ElectraSpec) -> str:
    """The platform the step is compiled for: spec.platform, else jax's default backend."""
    return spec.platform or jax.default_backend()


# 'auto' takes the Pallas kernel from this sequence length and width on: where the TPU
# compiler's estimated cycles of a discriminator layer, forward and backward in bfloat16, put it
# ahead of the XLA core (base and large at 512: 15% and 11% fewer cycles on v4, base 9% on v5e);
# below, the flat projections it reads cost more than the [L, L] arrays it saves (small on v5e:
# 5% more cycles at 128, 16% at 256, 3% at 512). benchmarks/notes/compile.md, "Pallas by default".
PALLAS_FROM_SEQ_LENGTH = 512
PALLAS_FROM_HIDDEN_SIZE = 768
# The TPU generations (topology.GENERATIONS' names) the kernel runs on: those libtpu compiles it
# for in the suite at its default blocks (tests/model/test_flash_attention.py). Mosaic refuses
# v3's bfloat16 matmuls (E2001, "Unsupported matmul RHS type"); v2 is older still; on v6e the
# suite compiles it at 128 x 128 blocks only, not the default 256 x 512 of 512 tokens (and
# libtpu 0.0.42.1 dies compiling large's bfloat16 step for v6e-64 with or without it: the
# cause is not found yet); TPU7x is not compiled yet.
PALLAS_GENERATIONS = ("v4", "v5e", "v5p")


def resolved_attention(
    attention: str, platform_name: str | None, seq_length: int, hidden_size: int
) -> str:
    """model.attention with 'auto' resolved: 'pallas' for a step compiled for TPU devices
    (platform_name 'tpu', known only where the run's mesh is: program.build) at a sequence
    length and width from PALLAS_FROM_* on, else 'einsum'. The two compute the same function
    with the same dropout mask; the choice changes where the [L, L] scores live (VMEM or HBM),
    not the numbers beyond rounding."""
    if attention != "auto":
        return attention
    wide = seq_length >= PALLAS_FROM_SEQ_LENGTH and hidden_size >= PALLAS_FROM_HIDDEN_SIZE
    return "pallas" if platform_name == "tpu" and wide else "einsum"


def check_attention_platform(
    attention: str, platform_name: str, generation: str | None = None
) -> None:
    """ConfigError (one line) when model.attention cannot run on the devices of `platform_name`
    ('cpu', 'gpu', 'tpu') of TPU `generation` (a topology.GENERATIONS name, where known): 'pallas'
    is a TPU kernel (Mosaic) of the generations of PALLAS_GENERATIONS; elsewhere only its
    interpret mode runs, far too slowly for a step."""
    if attention != "pallas":
        return
    if platform_name != "tpu":
        raise ConfigError(
            f"model.attention='pallas' is a TPU kernel and this run's devices are "
            f"{platform_name}; use model.attention='einsum' (the same function) on them"
        )
    if generation is not None and generation not in PALLAS_GENERATIONS:
        raise ConfigError(
            f"model.attention='pallas' runs on TPU {', '.join(PALLAS_GENERATIONS)} and this "
            f"run's devices are TPU {generation}; use model.attention='einsum' (the same "
            "function) or 'auto' on them"
        )


def _constrain(spec: ElectraSpec, x):
    """Pins an activation [B, ...] to the batch split (a no-op without activation_sharding)."""
    if spec.activation_sharding is None:
        return x
    return jax.lax.with_sharding_constraint(x, spec.activation_sharding)


class Embeddings(nn.Module):
    """Word + position + type embeddings, LayerNorm, dropout: [B, L] ids -> [B, L, E].

    With `delta` (embedding_sharing 'gdes'), the three tables start at zero and are added to a
    `base` block's tables, passed through stop_gradient; the LayerNorm is this block's own.
    """

    spec: ElectraSpec
    delta: bool = False

    def setup(self):
        s = self.spec

        def init(axes):
            if self.delta:
                return nn.with_logical_partitioning(nn.initializers.zeros, axes)
            return _init(s, axes)

        self.word_embeddings = nn.Embed(
            s.vocab_size,
            s.embedding_size,
            embedding_init=init(("vocab", "embed")),
            name="word_embeddings",
        )
        self.position_embeddings = nn.Embed(
            s.max_position_embeddings,
            s.embedding_size,
            embedding_init=init((None, "embed")),
            name="position_embeddings",
        )
        self.token_type_embeddings = nn.Embed(
            s.type_vocab_size,
            s.embedding_size,
            embedding_init=init((None, "embed")),
            name="token_type_embeddings",
        )
        self.layer_norm = _layer_norm(s, "LayerNorm")
        self.dropout = Dropout(s.dropout_rate)

    def tables(self):
        """(word [V, E], position [P, E], type [T, E]) float32 tables."""
        return (
            self.word_embeddings.embedding,
            self.position_embeddings.embedding,
            self.token_type_embeddings.embedding,
        )

    def __call__(self, input_ids, segment_ids, deterministic: bool, base=None):
        """`base`: another block's `tables()`, added under stop_gradient (for 'gdes')."""
        length = input_ids.shape[1]
        if base is None:
            x = (
                self.word_embeddings(input_ids)
                + self.position_embeddings(jnp.arange(length))[None]
                + self.token_type_embeddings(segment_ids)
            )
        else:
            word, position, kind = (
                own + jax.lax.stop_gradient(b) for own, b in zip(self.tables(), base, strict=True)
            )
            x = (
                jnp.take(word, input_ids, axis=0)
                + position[:length][None]
                + jnp.take(kind, segment_ids, axis=0)
            )
        x = self.layer_norm(x)
        return _constrain(self.spec, self.dropout(x, deterministic).astype(self.spec.dtype))

    def attend(self, hidden, base=None):
        """[..., E] -> [..., V] logits against the word table (the tied output layer)."""
        table = self.word_embeddings.embedding
        if base is not None:
            table = table + jax.lax.stop_gradient(base[0])
        table = table.astype(self.spec.dtype)
        flat = hidden.reshape(-1, hidden.shape[-1]).astype(self.spec.dtype)  # see _TokenDense
        return jnp.einsum("te,ve->tv", flat, table).reshape(*hidden.shape[:-1], -1)


class Dropout(nn.Module):
    """Inverted dropout from one hashed 32-bit word per element (`kernels.dropout_bits`).

    Keys come from the 'dropout' stream, so numbers do not depend on the sharding.
    """

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        # The scale in float32: 1 / 0.9 rounded to bfloat16 is 1.109375, which would shrink
        # every kept activation by 0.16%; in float32 each is rounded once, without a bias.
        keep, scale = kernels.keep_and_scale(
            self.make_rng("dropout"), x.shape, self.rate, jnp.float32
        )
        return jnp.where(keep, (x * scale).astype(x.dtype), jnp.zeros((), x.dtype))


class _flat_projections:  # noqa: N801 (a namespace of two functions)
    """q, k, v and the output projection as 2-D matmuls over [B * L, H] (see _TokenDense): the
    CPU's (and GPU's) path. Heads move between layouts with transposes."""

    @staticmethod
    def qkv(x, kernel, bias, dtype):
        """x [B, L, H], kernel [H, 3, heads, d], bias [3, heads, d] -> q, k, v [B, heads, L, d]."""
        b, length, width = x.shape
        _, _, heads, head_dim = kernel.shape
        # One [B * L, H] x [H, 3 * H] matmul, then the heads-first layout.
        qkv = x.reshape(b * length, width).astype(dtype) @ kernel.reshape(width, -1).astype(dtype)
        qkv = kernels.add_bias(qkv, bias.reshape(-1).astype(dtype))
        qkv = qkv.reshape(b, length, 3, heads, head_dim)
        # split, not indexing: its gradient is one concatenate, where three index gradients are
        # three zero-padded copies added together.
        return tuple(t[0] for t in jnp.split(jnp.transpose(qkv, (2, 0, 3, 1, 4)), 3))

    @staticmethod
    def output(context, kernel, bias):
        """context [B, heads, L, d], kernel [heads, d, H], bias [H] -> [B, L, H]."""
        b, heads, length, head_dim = context.shape
        dtype = context.dtype
        context = jnp.transpose(context, (0, 2, 1, 3)).reshape(b * length, heads * head_dim)
        out = context @ kernel.reshape(heads * head_dim, -1).astype(dtype)
        return kernels.add_bias(out, bias.astype(dtype)).reshape(b, length, -1)


class _tpu_projections:  # noqa: N801 (a namespace of two functions)
    """q, k, v and the output projection as dots between [B, L, H] and [B, heads, L, d], with
    no reshape between them: the TPU's path.

    The flat path's [B * L, 3H] result went heads-first through three relayout copies of the
    whole q/k/v array (0.97M estimated cycles of a base layer's 12.5M, bfloat16, 32 x 512 on
    v4) and the context back through two more (0.27M); here each dot writes its result where
    its reader takes it (benchmarks/notes/compile.md, "Projections without copies"). Three q,
    k, v dots rather than one into [3, B, heads, L, d]: the one's result was split by a copy and
    its bias gradient summed by a pass of its own (0.26M cycles), where the three's are summed
    inside the attention core's gradient fusions. The dots are written with x as their left
    operand, not as jnp.einsum, which puts the kernel first: from a [heads, d, B, L] product the
    compiler lays q, k, v out [heads, B, d, L], and then no longer fuses the softmax into the
    scores' matmul (1.3M cycles more a base layer); from [B, L, heads, d] it writes them
    [B, heads, d, L], the layout the core's fusions read.
    """

    @staticmethod
    def qkv(x, kernel, bias, dtype):
        """x [B, L, H], kernel [H, 3, heads, d], bias [3, heads, d] -> q, k, v [B, heads, L, d]."""
        x = x.astype(dtype)
        kernels_ = jnp.split(kernel.astype(dtype), 3, axis=1)  # [H, 1, heads, d] each
        biases = jnp.split(bias.astype(dtype), 3)  # [1, heads, d] each
        contract_width = (((2,), (0,)), ((), ()))
        return tuple(
            jnp.transpose(jax.lax.dot_general(x, w[:, 0], contract_width), (0, 2, 1, 3))
            + c[0][None, :, None, :]
            for w, c in zip(kernels_, biases, strict=True)
        )

    @staticmethod
    def output(context, kernel, bias):
        """context [B, heads, L, d], kernel [heads, d, H], bias [H] -> [B, L, H]."""
        dtype = context.dtype
        contract_heads = (((1, 3), (0, 1)), ((), ()))  # -> [B, L, H]
        return jax.lax.dot_general(context, kernel.astype(dtype), contract_heads) + bias.astype(
            dtype
        )


class SelfAttention(nn.Module):
    """Multi-head self-attention; scores and softmax in float32.

    Heads lead the layout ([B, heads, L, head_dim]) so every contraction is a batched matmul with
    batch dimensions first. How q, k, v and the output are projected depends on the platform
    (`platform(spec)`): on TPU with the einsum core, one dot per tensor straight between
    x [B, L, H] and the heads-first layout (`_tpu_projections`); elsewhere, and for the Pallas
    kernels, one fused [B * L, H] x [H, 3 * H] matmul and a transpose (`_flat_projections`).
    Both compute the same function of the same parameters (qkv_kernel [H, 3, heads, head_dim],
    output_kernel [heads, head_dim, H]).
    """

    spec: ElectraSpec
    encoder: EncoderSpec

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool):
        s, e = self.spec, self.encoder
        heads, head_dim = e.num_heads, e.hidden_size // e.num_heads
        qkv_kernel = self.param(
            "qkv_kernel",
            _init(s, ("embed", None, "heads", "kv")),
            (e.hidden_size, 3, heads, head_dim),
            jnp.float32,
        )
        qkv_bias = self.param("qkv_bias", nn.initializers.zeros, (3, heads, head_dim), jnp.float32)
        out_kernel = self.param(
            "output_kernel",
            _init(s, ("heads", "kv", "embed")),
            (heads, head_dim, e.hidden_size),
            jnp.float32,
        )
        out_bias = self.param("output_bias", nn.initializers.zeros, (e.hidden_size,), jnp.float32)
        tpu = platform(s) == "tpu"
        attention = resolved_attention(s.attention, s.platform, x.shape[1], x.shape[2])
        # The Pallas kernels read and write the flat projection's own token-major layout
        # (flash_attention: its moves to and from heads-first cancel against the flat ones'),
        # so they keep the flat projections on TPU too.
        flat = not tpu or attention == "pallas"
        projections = _flat_projections if flat else _tpu_projections
        # Named in the heads-first layout the attention core reads, for the remat policies: a
        # policy that keeps them recomputes neither the projection nor the moves of heads.
        q, k, v = (
            checkpoint_name(t, QKV)
            for t in projections.qkv(x, qkv_kernel, qkv_bias, jnp.dtype(s.dtype))
        )
        if attention == "einsum":
            context = self._einsum(q, k, v, attention_bias, deterministic)
        elif attention == "pallas":
            context = self._pallas(q, k, v, attention_bias, deterministic)
        else:
            context = self._fused(q, k, v, attention_bias, deterministic)
        context = checkpoint_name(context, ATTENTION_CONTEXT)
        return checkpoint_name(projections.output(context, out_kernel, out_bias), ATTENTION_OUTPUT)

    def _einsum(self, q, k, v, attention_bias, deterministic):
        rate = 0.0 if deterministic else self.spec.attention_dropout_rate
        key = self.make_rng("dropout") if rate else jax.random.key(0)
        return kernels.attention_core(q, k, v, attention_bias, key, rate)

    def _pallas(self, q, k, v, attention_bias, deterministic):
        """attention_core's function (its dropout mask too) as Pallas TPU kernels that keep the
        [L, L] scores in VMEM; q, k, v [B, heads, L, head_dim] -> the same, in q's dtype."""
        if self.spec.platform is not None:
            # Where the step's devices are known (program.build, the layer benchmark). A
            # shape-only trace without them (abstract_params, for a dry run's parameter counts
            # before its mesh exists) compiles nothing and runs on any platform; a run's mesh
            # of non-TPU devices was refused before either (program.checked_mesh).
            check_attention_platform(self.spec.attention, self.spec.platform)
        # Imported here: Pallas loads only in the runs that use it.
        from electra_jax.model.flash_attention import flash_attention

        rate = 0.0 if deterministic else self.spec.attention_dropout_rate
        key = self.make_rng("dropout") if rate else jax.random.key(0)
        return flash_attention(
            q, k, v, attention_bias, key, rate, batch_sharding=self.spec.batch_sharding
        )

    def _fused(self, q, k, v, attention_bias, deterministic):
        """jax.nn.dot_product_attention ('xla' or 'cudnn') on q, k, v [B, heads, L, head_dim]
        and attention_bias [B, 1, 1, L]; returns [B, heads, L, head_dim] in q's dtype."""
        s = self.spec
        if s.attention not in ("xla", "cudnn"):
            raise ValueError(
                f"model.attention={s.attention!r}: use 'einsum', 'pallas', 'xla' or 'cudnn'"
            )
        if s.attention_dropout_rate and not deterministic:
            # jax.nn.dot_product_attention has no dropout. cuDNN's kernel has one, reachable only
            # through the private jax._src.cudnn.fused_attention_stablehlo.dot_product_attention
            # (dropout_rate=, seed=), but its mask does not come from our PRNG keys: the seed is
            # a Python int fixed at trace time (42 unless given), and XLA's runtime keeps one
            # offset per compiled kernel, 0 at load and advanced on each execution. So every
            # layer would draw the same masks, a resumed run would replay them from step 0, and
            # the backward kernel regenerates the forward's mask only while its own counter
            # stays in step with the forward kernel's. None of that can be checked without a
            # GPU, so it stays off and the paper's 0.1 needs model.attention='einsum'.
            raise ValueError(
                f"model.attention={s.attention!r} has no dropout on attention probabilities; "
                "set model.attention_dropout_rate=0 or use model.attention='einsum'"
            )
        if s.attention == "cudnn" and q.dtype not in (jnp.bfloat16, jnp.float16):
            # jax raises NotImplementedError("Q must be fp16/bf16/...") deep inside; say which
            # setting to change instead.
            raise ValueError(
                f"model.attention='cudnn' computes in 16 bits and model.dtype={s.dtype!r}; set "
                "model.dtype='bfloat16' or use model.attention='einsum' (or 'xla')"
            )
        out = jax.nn.dot_product_attention(
            **kernels.fused_attention_args(q, k, v, attention_bias, s.attention)
        )
        return jnp.swapaxes(out, 1, 2)


class TransformerLayer(nn.Module):
    """BERT's post-LayerNorm block: x = LN(x + Attn(x)); x = LN(x + FFN(x)), [B, L, H] -> the same.

    `scanned`: the body of `nn.scan`, which threads x as the carry and so returns (x, None).
    """

    spec: ElectraSpec
    encoder: EncoderSpec
    scanned: bool = False

    @nn.compact
    def __call__(self, x, attention_bias, deterministic: bool):
        s, e = self.spec, self.encoder
        a = _constrain(s, SelfAttention(s, e, name="attention")(x, attention_bias, deterministic))
        a = Dropout(s.dropout_rate, name="attention_dropout")(a, deterministic)
        x = _layer_norm(s, "attention_LayerNorm")(x + a)
        h = _constrain(s, _dense(s, e.intermediate_size, "intermediate")(x))
        h = checkpoint_name(h, FFN_INTERMEDIATE)
        h = _dense(s, e.hidden_size, "output", ("mlp", "embed"), gelu_input=True)(h)
        h = checkpoint_name(h, FFN_OUTPUT)
        h = Dropout(s.dropout_rate, name="output_dropout")(h, deterministic)
        x = _constrain(s, _layer_norm(s, "output_LayerNorm")(x + h))
        return (x, None) if self.scanned else x


def layer_class(spec: ElectraSpec) -> type[TransformerLayer]:
    """TransformerLayer, or its nn.remat under spec.remat's policy (what the backward pass
    keeps of each layer; the same numbers either way). ValueError for a name that is none."""
    if spec.remat == "none":
        return TransformerLayer
    if spec.remat not in _REMAT_POLICIES:
        raise ValueError(f"train.remat={spec.remat!r}: use one of {', '.join(REMAT_CHOICES)}")
    # Argument 3 of __call__ (self counts as 0) is `deterministic`, a Python bool.
    return nn.remat(TransformerLayer, static_argnums=(3,), policy=_REMAT_POLICIES[spec.remat])


class Encoder(nn.Module):
    """[B, L, E] embeddings -> [B, L, H] states: optional E->H projection, then the layers."""

    spec: ElectraSpec
    encoder: EncoderSpec

    @nn.compact
    def __call__(self, embedded, input_mask, deterministic: bool):
        s, e = self.spec, self.encoder
        x = embedded
        if s.embedding_size != e.hidden_size:
            x = _dense(s, e.hidden_size, "embeddings_project", ("embed_out", "embed"), glorot=True)(
                x
            )
        # Padding keys get a large negative bias; queries at padding are computed and ignored.
        bias = jnp.where(input_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
        layer = layer_class(s)
        if not s.scan_layers:
            for i in range(e.num_layers):
                x = layer(s, e, name=f"layer_{i}")(x, bias, deterministic)
            return x
        # One layer body over parameters stacked on a leading axis: every layer's parameters
        # (and, split per layer, its init and dropout keys) are the scan's per-step inputs; the
        # mask bias and `deterministic` are the same for all. The stacked axis is named
        # 'layers' for the partitioner, which never shards it.
        stack = nn.scan(
            layer,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast, nn.broadcast),
            length=e.num_layers,
            metadata_params={nn.PARTITION_NAME: LAYERS},
        )
        x, _ = stack(s, e, scanned=True, name=LAYERS)(x, bias, deterministic)
        return x


class Electra(nn.Module):
    """Generator and discriminator over one shared embedding block (`spec.embedding_sharing`).

    Methods (call through `model.apply(variables, ..., method=...)`):
      generator_logits:     masked ids [B, L], positions [B, N] -> [B, N, V] float32
      discriminator_logits: ids [B, L] -> [B, L] float32 (> 0 means "replaced")
      discriminator_hidden: ids [B, L] -> [B, L, H]
      discriminator_mlm:    ids [B, L], positions [B, N] or None -> ([B, L], [B, N or L, V])
                            (spec.mlm_head only)
      generator_policy:     masked ids [B, L], positions [B, N] -> ([B, N, V] logits,
                            [B, N] baseline logits) (spec.policy_baseline only)
    `__call__` runs all of them, for initialisation.
    """

    spec: ElectraSpec

    def setup(self):
        s = self.spec
        if s.embedding_sharing not in EMBEDDING_SHARING:
            raise ValueError(
                f"model.embedding_sharing={s.embedding_sharing!r}: use 'electra', 'gdes' or 'none'"
            )
        # `embeddings` is always the discriminator's block (or, for 'gdes', its base), so export
        # and fine-tuning find the discriminator's tables where they always were.
        self.embeddings = Embeddings(s, name="embeddings")
        if s.embedding_sharing == "none":
            self.generator_embeddings = Embeddings(s, name="generator_embeddings")
        if s.embedding_sharing == "gdes":
            self.embeddings_delta = Embeddings(s, delta=True, name="embeddings_delta")
        self.generator = Encoder(s, s.generator, name="generator")
        self.discriminator = Encoder(s, s.discriminator, name="discriminator")
        self.generator_dense = _dense(
            s, s.embedding_size, "generator_predictions_dense", ("embed", "embed_out")
        )
        self.generator_layer_norm = _layer_norm(s, "generator_predictions_LayerNorm")
        self.generator_bias = self.param(
            "generator_lm_head_bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32
        )
        self.discriminator_dense = _dense(
            s,
            s.discriminator.hidden_size,
            "discriminator_predictions_dense",
            ("embed", "embed_out"),
        )
        self.discriminator_out = _dense(
            s, 1, "discriminator_predictions_dense_prediction", ("embed", None), glorot=True
        )
        if s.mlm_head:
            self.mlm_dense = _dense(
                s, s.embedding_size, "mlm_predictions_dense", ("embed", "embed_out")
            )
            self.mlm_layer_norm = _layer_norm(s, "mlm_predictions_LayerNorm")
            self.mlm_bias = self.param(
                "mlm_lm_head_bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32
            )
        if s.policy_baseline:
            self.baseline_out = _dense(s, 1, "adversarial_baseline", ("embed", None))

    def _generator_embeddings(self) -> Embeddings:
        if self.spec.embedding_sharing == "none":
            return self.generator_embeddings
        return self.embeddings

    def _discriminator_base(self):
        """The tables the discriminator's deltas add to ('gdes'), else None."""
        if self.spec.embedding_sharing == "gdes":
            return self.embeddings.tables()
        return None

    def _discriminator_embeddings(self) -> Embeddings:
        if self.spec.embedding_sharing == "gdes":
            return self.embeddings_delta
        return self.embeddings

    def generator_logits(
        self, input_ids, segment_ids, input_mask, positions, deterministic: bool = True
    ):
        """Generator logits at the masked slots only: positions [B, N] -> [B, N, V] float32."""
        return self._generator_head(
            self._generator_states(input_ids, segment_ids, input_mask, positions, deterministic)
        )

    def generator_policy(
        self, input_ids, segment_ids, input_mask, positions, deterministic: bool = True
    ):
        """The generator as a policy: its logits [B, N, V] at the masked slots, and the logits
        [B, N] (float32) of its learned baseline on the same encoder states. The baseline reads
        the states under stop_gradient: it learns its own weights only, so the generator learns
        from the policy gradient alone."""
        h = self._generator_states(input_ids, segment_ids, input_mask, positions, deterministic)
        baseline = self.baseline_out(jax.lax.stop_gradient(h))[..., 0].astype(jnp.float32)
        return self._generator_head(h), baseline

    def _generator_states(self, input_ids, segment_ids, input_mask, positions, deterministic):
        """The generator encoder's outputs at the masked slots, [B, N, Hg]."""
        x = self._generator_embeddings()(input_ids, segment_ids, deterministic)
        h = self.generator(x, input_mask, deterministic)
        return jnp.take_along_axis(h, positions[..., None], axis=1)

    def _generator_head(self, h):
        """[B, N, Hg] states -> [B, N, V] float32 logits against the generator's word table."""
        h = self.generator_layer_norm(kernels.gelu(self.generator_dense(h)))
        logits = self._generator_embeddings().attend(h).astype(jnp.float32)
        return kernels.add_bias(logits, self.generator_bias)

    def discriminator_hidden(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        """Discriminator states: [B, L] -> [B, L, H]."""
        base = self._discriminator_base()
        x = self._discriminator_embeddings()(input_ids, segment_ids, deterministic, base=base)
        return self.discriminator(x, input_mask, deterministic)

    def _replaced_logits(self, h):
        h = kernels.gelu(self.discriminator_dense(h))
        return self.discriminator_out(h)[..., 0].astype(jnp.float32)

    def discriminator_logits(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        """Replaced-token logits: [B, L] -> [B, L] float32."""
        h = self.discriminator_hidden(input_ids, segment_ids, input_mask, deterministic)
        return self._replaced_logits(h)

    def discriminator_outputs(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        """One discriminator pass, both readings: [B, L] -> (states [B, L, H], replaced-token
        logits [B, L] float32)."""
        h = self.discriminator_hidden(input_ids, segment_ids, input_mask, deterministic)
        return h, self._replaced_logits(h)

    def discriminator_mlm(
        self, input_ids, segment_ids, input_mask, positions=None, deterministic: bool = True
    ):
        """One discriminator pass, both heads: (replaced-token logits [B, L] float32, MLM logits
        [B, N, V] float32 at positions [B, N], or [B, L, V] at every position when None)."""
        h = self.discriminator_hidden(input_ids, segment_ids, input_mask, deterministic)
        replaced = self._replaced_logits(h)
        if positions is not None:
            h = jnp.take_along_axis(h, positions[..., None], axis=1)  # [B, N, H]
        h = self.mlm_layer_norm(kernels.gelu(self.mlm_dense(h)))
        table = self._discriminator_embeddings()
        logits = table.attend(h, base=self._discriminator_base()).astype(jnp.float32)
        return replaced, kernels.add_bias(logits, self.mlm_bias)

    def __call__(self, input_ids, segment_ids, input_mask, positions, deterministic: bool = True):
        gen = self.generator_logits(input_ids, segment_ids, input_mask, positions, deterministic)
        disc = self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic)
        if self.spec.mlm_head:
            self.discriminator_mlm(input_ids, segment_ids, input_mask, positions, deterministic)
        if self.spec.policy_baseline:
            self.generator_policy(input_ids, segment_ids, input_mask, positions, deterministic)
        return gen, disc


def _boxed_params(model: Electra, rng, batch_size: int = 1, seq_length: int = 8):
    ids = jnp.zeros((batch_size, seq_length), jnp.int32)
    positions = jnp.zeros((batch_size, 1), jnp.int32)
    return model.init({"params": rng}, ids, ids, jnp.ones_like(ids), positions)["params"]


def init_params(model: Electra, rng, batch_size: int = 1, seq_length: int = 8):
    """Initial float32 parameters (a nested dict of plain arrays)."""
    return nn.meta.unbox(_boxed_params(model, rng, batch_size, seq_length))


def abstract_params(model: Electra):
    """(shapes, logical axes) of init_params' tree, from one trace of the model's init (no
    FLOPs): jax.ShapeDtypeStructs, and PartitionSpecs of axis names (PartitionSpec() for the
    unnamed: biases and LayerNorm parameters)."""
    boxed = jax.eval_shape(lambda: _boxed_params(model, jax.random.PRNGKey(0)))
    specs = nn.get_partition_spec(boxed)
    axes = jax.tree_util.tree_map(
        lambda x: x if isinstance(x, jax.sharding.PartitionSpec) else jax.sharding.PartitionSpec(),
        specs,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec) or x is None,
    )
    return nn.meta.unbox(boxed), axes


def count_params(tree) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))


def network_param_counts(params) -> dict[str, int]:
    """Parameters of each network as it is kept and exported (shared embeddings in both; for
    'gdes' the discriminator's deltas and LayerNorm replace the base's, same count; the MLM head
    of the mlm objectives counts with the discriminator)."""
    disc_embeddings = count_params(params["embeddings"])
    gen_embeddings = count_params(params.get("generator_embeddings", params["embeddings"]))
    gen = count_params(params["generator"]) + count_params(params["generator_lm_head_bias"])
    gen += count_params(params["generator_predictions_dense"])
    gen += count_params(params["generator_predictions_LayerNorm"])
    gen += count_params(params.get("adversarial_baseline", {}))
    disc = count_params(params["discriminator"])
    disc += count_params(params["discriminator_predictions_dense"])
    disc += count_params(params["discriminator_predictions_dense_prediction"])
    for name in ("mlm_predictions_dense", "mlm_predictions_LayerNorm", "mlm_lm_head_bias"):
        disc += count_params(params.get(name, {}))
    return {
        "discriminator": disc_embeddings + disc,
        "generator": gen_embeddings + gen,
        "total": count_params(params),
    }


def discriminator_embedding_params(params, embedding_sharing: str = "electra"):
    """The discriminator's effective embedding block, in the layout of params["embeddings"]
    (what export and fine-tuning read): for 'gdes' the base tables plus the deltas, with the
    discriminator's own LayerNorm; for 'electra' and 'none' params["embeddings"] itself."""
    if embedding_sharing != "gdes":
        return params["embeddings"]
    base, delta = params["embeddings"], params["embeddings_delta"]
    tables = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    out = {k: {"embedding": base[k]["embedding"] + delta[k]["embedding"]} for k in tables}
    out["LayerNorm"] = delta["LayerNorm"]
    return out
