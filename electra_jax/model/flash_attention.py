"""A Pallas TPU attention kernel with FlashAttention's tiling and ELECTRA's attention dropout.

`flash_attention(q, k, v, bias, key, rate)` computes the function `kernels.attention_core`
computes (softmax(q k^T / sqrt(d) + bias), dropped out with the same mask, times v), but keeps
the [L, L] scores and probabilities of each (batch, head) in VMEM, a block of query rows at a
time: on TPU attention_core's [B, heads, L, L] float32 arrays go through HBM, which the TPU
compiler counted as ~30% of a base layer's cycles (benchmarks/notes/compile.md).

- Layout: the kernels read q, k, v and write the output token-major, [B, L, heads x d], the
  layout one dot from x [B, L, H] writes (the model's projections on this path:
  `flash_attention_tokens`; `flash_attention` takes attention_core's heads-first arguments and
  moves them), a block holding `heads_per_block` heads' lanes side by side:
  two heads of ELECTRA's 64 fill the TPU's 128 lanes, where one heads-first [L, 64] block
  would be padded to 128 in HBM and VMEM (twice the bytes) and cost relayout copies.
- Forward: one `pallas_call` over (batch, head groups, query blocks, key blocks). With one key
  block (the default up to L = 1024) each query block's softmax is taken whole, in
  attention_core's order of operations; with several, online (running max and sum,
  FlashAttention). It writes the output and, per query row, the softmax's max and sum
  ([B, heads, 2, L] float32).
- Dropout happens inside the kernel: element (b, h, i, j) is kept iff
  `kernels.dropout_bits(key, (B, heads, L, L))[b, h, i, j] < kernels.dropout_threshold(rate)`,
  the bits computed in the kernel by `kernels.index_hash` from iotas plus the block's offsets and
  the two seed words of `key` (an SMEM scalar-prefetch input): attention_core's mask, bit for bit
  (on several devices, under shard_map, with each shard's batch offset).
- Backward (FlashAttention-2's): the kernels recompute the scores, the probabilities (from the
  saved max and sum) and the dropout mask per block, take attention_core's row term
  D = rowsum(dO * O) from the output, and accumulate dK and dV over the query blocks. With one
  key block dQ is complete per query block and the same kernel writes it; with several a second
  kernel accumulates dQ over the key blocks (the scores recomputed once more).

Why the max and sum rather than FlashAttention's logsumexp: a row whose keys are all padding
has scores near -1e9, where float32's spacing is 64, so max + log(sum) rounds back to the max
and exp(s - logsumexp) would give 1 where the forward had 1/L. exp(s - max) / sum recomputes the
forward's probabilities exactly.

The TPU compiler gives a Pallas call no estimated cycles and XLA counts none of its FLOPs, so
each call carries a `pl.CostEstimate` from `call_costs` (the same numbers, in pure Python).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from electra_jax.model import kernels

_LANES = 128  # a TPU vector's lanes: a block's last dimension is a multiple of it or whole
_NT = (((1,), (1,)), ((), ()))  # a @ b^T: contract the last dimensions
_TN = (((0,), (0,)), ((), ()))  # a^T @ b: contract the first dimensions
_STATS = 2  # per query row: the softmax's max and its sum

# The forward's pallas_call, and the backward's: one kernel with one key block, else two.
FORWARD, BACKWARD, BACKWARD_DKV, BACKWARD_DQ = (
    "electra_flash_forward",
    "electra_flash_backward",
    "electra_flash_backward_dkv",
    "electra_flash_backward_dq",
)


def default_blocks(length: int) -> tuple[int, int]:
    """(block_q, block_k) for a sequence length: 256 query rows (or L, if smaller or not a
    multiple of 128), and every key in one block up to L = 1024 (no online softmax), else 512.

    ELECTRA's L = 128 (small) and 512 (base, large) with head_dim 64: at 256 x 512 a float32
    score block is 512 KB and the backward holds about eight such per head (two heads a step),
    inside the 16 MiB of VMEM a TPU v4 / v5e kernel gets by default (libtpu compiles these
    blocks for every generation up to L = 1024 in float32); 256 rows halve the grid steps (each
    ~0.35 us of overhead) against 128. Not timed on a TPU (none was available): a first
    choice, not a measured optimum.
    """
    block_q = length if length <= 256 or length % _LANES else (256 if length % 256 == 0 else 128)
    if length <= 1024 or length % _LANES:
        block_k = length
    else:
        block_k = 512 if length % 512 == 0 else (256 if length % 256 == 0 else 128)
    return block_q, block_k


def heads_per_block(heads: int, head_dim: int) -> int:
    """How many heads one kernel step takes: the kernels read q, k, v token-major, [B, L,
    heads x head_dim] (the projections' layout), a block being some heads' lanes side by side.
    TPU arrays pad their last dimension to 128 lanes, so a head of 64 alone would move and hold
    twice its bytes: 128 / head_dim heads (2 for ELECTRA's 64), or 1 for a head_dim that is a
    multiple of 128, else all of them (the whole last dimension, as the TPU allows)."""
    if head_dim % _LANES == 0:
        return 1
    if _LANES % head_dim == 0 and heads % (_LANES // head_dim) == 0:
        return _LANES // head_dim
    return heads


def _checked_blocks(length: int, block_q: int | None, block_k: int | None) -> tuple[int, int]:
    default_q, default_k = default_blocks(length)
    blocks = (block_q or default_q, block_k or default_k)
    for name, block in zip(("block_q", "block_k"), blocks, strict=True):
        # A query block is the last dimension of the saved statistics' blocks, a key block that
        # of the bias's: TPU blocks are whole along it or a multiple of 128 lanes.
        if block <= 0 or length % block or (block != length and block % _LANES):
            raise ValueError(
                f"flash_attention: {name}={block} must divide the sequence length {length} and "
                f"be a multiple of {_LANES} or the length itself; leave it None for the default"
            )
    return blocks


@dataclasses.dataclass(frozen=True)
class _Operand:
    """One input or output of a pallas_call: its block (None: a squeezed dimension of 1), an
    index map from the grid's indices (and the scalar-prefetch ref, unused) to the block's
    index, and its element size in bytes. The index map is plain arithmetic on its arguments,
    so that `_fetches` can evaluate it on numpy arrays of the whole grid."""

    block: tuple[int | None, ...]
    index_map: Callable
    itemsize: int

    def spec(self) -> pl.BlockSpec:
        return pl.BlockSpec(self.block, self.index_map)

    def block_bytes(self) -> int:
        """The bytes of one block in HBM: its last dimension padded to whole 128-lane tiles,
        as a TPU array lays it out (the second-to-last is whole sublane tiles in the blocks of
        ELECTRA's shapes: rows in multiples of 16, the statistics' 2 in (2, 128) tiles)."""
        *rest, last = (1 if n is None else n for n in self.block)
        return math.prod(rest) * -(-last // _LANES) * _LANES * self.itemsize


def _fetches(grid: tuple[int, ...], index_map: Callable) -> int:
    """How many times a block moves between HBM and VMEM over the grid: the TPU pipeline fetches
    an input's block (or writes an output's back) at the first step and whenever its block index
    differs from the previous step's (the grid runs in row-major order, the last axis fastest)."""
    ids = np.indices(grid).reshape(len(grid), -1)
    index = np.stack(np.broadcast_arrays(*index_map(*ids, None)))
    return 1 + int(np.count_nonzero(np.any(index[:, 1:] != index[:, :-1], axis=0)))


@dataclasses.dataclass(frozen=True)
class _Call:
    """One pallas_call's grid, operands and cost (flops and transcendentals, counted by the
    builders below from the kernel's operations; bytes from the blocks that move)."""

    name: str
    grid: tuple[int, ...]
    inputs: tuple[_Operand, ...]
    outputs: tuple[_Operand, ...]
    flops: int
    transcendentals: int

    def bytes_accessed(self) -> int:
        prefetch = 3 * 4  # the uint32 seed words and batch offset, read into SMEM once
        blocks = sum(op.block_bytes() * _fetches(self.grid, op.index_map)
                     for op in (*self.inputs, *self.outputs))  # fmt: skip
        return prefetch + blocks

    def costs(self) -> dict[str, int]:
        return {
            "flops": self.flops,
            "transcendentals": self.transcendentals,
            "bytes_accessed": self.bytes_accessed(),
        }

    def cost_estimate(self) -> pl.CostEstimate:
        return pl.CostEstimate(**self.costs())


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What fixes the kernels: the arrays' shape and dtype, the blocks and the dropout rate."""

    batch: int
    heads: int
    length: int
    head_dim: int
    itemsize: int
    rate: float
    block_q: int
    block_k: int

    @property
    def group(self) -> int:
        """Heads per block: `heads_per_block`."""
        return heads_per_block(self.heads, self.head_dim)

    @property
    def lanes(self) -> int:
        """A q / k / v block's last dimension: its heads' head_dim lanes side by side."""
        return self.group * self.head_dim

    @property
    def n_q(self) -> int:
        return self.length // self.block_q

    @property
    def n_k(self) -> int:
        return self.length // self.block_k

    @property
    def scores(self) -> int:
        """Score elements of one call's pass over every (query, key) pair: B x heads x L x L."""
        return self.batch * self.heads * self.length * self.length

    @property
    def rows(self) -> int:
        """Query rows, B x heads x L."""
        return self.batch * self.heads * self.length


# Floating-point operations per score element, as the kernels below write them (matmuls are
# counted apart, 2 x M x N x K each). The dropout's integer work (~25 VPU operations per
# element: the index arithmetic, kernels.index_hash's 21 and the compare) is not floating-point
# and is not counted: see call_costs.
_SCORE_FLOPS = 2  # s * scale + bias
_SOFTMAX_FLOPS = 4  # max, s - max, the sum of exp, e / sum (the exp is a transcendental)
_ONLINE_FLOPS = 3  # max, s - running max, the sum of exp (divided at the end, per row)
_DROPOUT_FLOPS = 2  # x * (1 / keep probability), the select
_GRAD_FLOPS = 5  # s - max, e / sum (exp: a transcendental), dP - D, p * that, * scale


def _forward_call(s: _Shape) -> _Call:
    bq, bk, n_k, g = s.block_q, s.block_k, s.n_k, s.group
    # Grid (b, head group, query block i, key block j); q, k, v, o token-major [B, L, heads x d].
    q = _Operand((None, bq, s.lanes), lambda b, hg, i, j, _: (b, i, hg), s.itemsize)
    kv = _Operand((None, bk, s.lanes), lambda b, hg, i, j, _: (b, j, hg), s.itemsize)
    bias = _Operand((None, None, 1, bk), lambda b, hg, i, j, _: (b, 0, 0, j), 4)
    out = _Operand((None, bq, s.lanes), lambda b, hg, i, j, _: (b, i, hg), s.itemsize)
    stats = _Operand((None, g, _STATS, bq), lambda b, hg, i, j, _: (b, hg, 0, i), 4)
    d = s.head_dim
    dropout = _DROPOUT_FLOPS if s.rate else 0
    if n_k == 1:
        per_score = _SCORE_FLOPS + _SOFTMAX_FLOPS + dropout
        per_row = 0  # the statistics are written as they are
        transcendentals = s.scores  # exp
    else:
        per_score = _SCORE_FLOPS + _ONLINE_FLOPS + dropout
        # Per row and key block: the new max, the old max minus it, the sum's rescale and add;
        # the accumulator's rescale and add (2 d). At the end: acc / sum (d).
        per_row = n_k * (4 + 2 * d) + d
        transcendentals = s.scores + s.rows * n_k  # exp of the scores and of each rescale
    matmuls = 2 * (2 * s.scores * d)  # q k^T and p v
    return _Call(
        FORWARD,
        (s.batch, s.heads // g, s.n_q, n_k),
        (q, kv, kv, bias),
        (out, stats),
        flops=matmuls + per_score * s.scores + per_row * s.rows,
        transcendentals=transcendentals,
    )


def _backward_calls(s: _Shape) -> tuple[_Call, ...]:
    """The backward's pallas_calls: one (dq, dk, dv) with one key block, else (dk, dv), (dq)."""
    bq, bk, d, g = s.block_q, s.block_k, s.head_dim, s.group
    fused = s.n_k == 1
    # dk, dv: grid (b, head group, key block j, query block i), the query blocks innermost.
    q_rows = _Operand((None, bq, s.lanes), lambda b, hg, j, i, _: (b, i, hg), s.itemsize)
    keys = _Operand((None, bk, s.lanes), lambda b, hg, j, i, _: (b, j, hg), s.itemsize)
    bias = _Operand((None, None, 1, bk), lambda b, hg, j, i, _: (b, 0, 0, j), 4)
    stats = _Operand((None, g, _STATS, bq), lambda b, hg, j, i, _: (b, hg, 0, i), 4)
    dropout = _DROPOUT_FLOPS if s.rate else 0  # on dP; in the dk / dv kernel on p too
    per_score = _SCORE_FLOPS + _GRAD_FLOPS + dropout
    per_row = 2 * d  # D = sum(dO * O): d products and d sums
    inputs = (q_rows, keys, keys, bias, q_rows, q_rows, stats)  # q k v bias o do stats
    grad_matmuls = 2 * s.scores * d  # one [bq, bk, d] matmul over the whole pass
    dkv = _Call(
        BACKWARD if fused else BACKWARD_DKV,
        (s.batch, s.heads // g, s.n_k, s.n_q),
        inputs,
        ((q_rows,) if fused else ()) + (keys, keys),  # (dq,) dk, dv
        # s = q k^T, dP = dO v^T, dv, dk (and dq)
        flops=(5 if fused else 4) * grad_matmuls
        + (per_score + dropout) * s.scores
        + per_row * s.rows * s.n_k,
        transcendentals=s.scores,
    )
    if fused:
        return (dkv,)
    # dq: grid (b, head group, query block i, key block j), the key blocks innermost.
    q_rows = _Operand((None, bq, s.lanes), lambda b, hg, i, j, _: (b, i, hg), s.itemsize)
    keys = _Operand((None, bk, s.lanes), lambda b, hg, i, j, _: (b, j, hg), s.itemsize)
    bias = _Operand((None, None, 1, bk), lambda b, hg, i, j, _: (b, 0, 0, j), 4)
    stats = _Operand((None, g, _STATS, bq), lambda b, hg, i, j, _: (b, hg, 0, i), 4)
    dq = _Call(
        BACKWARD_DQ,
        (s.batch, s.heads // g, s.n_q, s.n_k),
        (q_rows, keys, keys, bias, q_rows, q_rows, stats),
        (q_rows,),
        flops=3 * grad_matmuls + per_score * s.scores + per_row * s.rows * s.n_k,  # s, dP, dq
        transcendentals=s.scores,
    )
    return dkv, dq


def call_costs(
    batch: int,
    heads: int,
    length: int,
    head_dim: int,
    dtype,
    *,
    rate: float = 0.0,
    block_q: int | None = None,
    block_k: int | None = None,
) -> dict[str, dict[str, int]]:
    """The cost estimates the kernels' pallas_calls carry, without building them.

    Args:
      batch, heads, length, head_dim: q, k and v are [batch, heads, length, head_dim].
      dtype: their dtype (the compute dtype).
      rate: the attention dropout rate (its multiply and select are counted when > 0).
      block_q, block_k: as `flash_attention` takes them (None: `default_blocks`).

    Returns:
      {call name: {"flops", "transcendentals", "bytes_accessed"}} for the forward call
      (FORWARD) and the backward's: BACKWARD with one key block, else BACKWARD_DKV and
      BACKWARD_DQ. flops: every matmul's 2 x M x N x K, the backward's recomputation of the
      scores included, plus the floating-point elementwise operations on the score blocks and
      rows; the dropout hash's integer operations are not counted (on a TPU they and the exps
      are VPU / EUP work that a roofline of FLOPs and bytes does not see). transcendentals: the
      exps (and the online softmax's rescales). bytes_accessed: the HBM bytes the blocks move,
      each block counted at every grid step whose block index differs from the previous step's,
      its last dimension padded to 128 lanes as HBM holds it.
    """
    block_q, block_k = _checked_blocks(length, block_q, block_k)
    shape = _Shape(batch, heads, length, head_dim, jnp.dtype(dtype).itemsize, float(rate),
                   block_q, block_k)  # fmt: skip
    return {c.name: c.costs() for c in (_forward_call(shape), *_backward_calls(shape))}


# The kernels. Refs are blocks: q, k, v, o, dO [rows, group x head_dim] (a head group's lanes),
# bias [1, block_k], the statistics [group, 2, block_q] (each head's max and sum). Program ids:
# (b, head group, i, j) in the forward and the dq kernel, (b, head group, j, i) in the dk / dv
# one (i: query block, j: key block). Each head of the group is a static slice of the lanes.


def _head(x, t: int, head_dim: int):
    """Head t's [rows, head_dim] of a group's [rows, group x head_dim] block."""
    return x[:, t * head_dim : (t + 1) * head_dim]


def _scores(q, k, bias, scale):
    """[bq, bk] float32: q k^T * scale + bias, in attention_core's order."""
    s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)
    return s * scale + bias


def _keep(prefetch_ref, shape: _Shape, b, h, i, j):
    """bool [bq, bk]: the dropout mask of block (i, j) of head (b, h); element (r, c) is
    kernels.dropout_bits(key, (B, heads, L, L))[b', h, i * bq + r, j * bk + c] < threshold,
    where b' = b plus the shard's first batch row (prefetch_ref[2]; 0 on one device)."""
    bq, bk = shape.block_q, shape.block_k
    # The row-major index over (B, heads, L) of the block's first row within the shard, and
    # its first column, in int32 (a program id's type; exact for B x heads x L < 2^31). The
    # shard's offset is added in uint32, as dropout_bits' indices wrap.
    row0 = (b * shape.heads + h) * shape.length + i * bq
    rows = jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0) + row0
    rows = rows.astype(jnp.uint32) + prefetch_ref[2] * jnp.uint32(shape.heads * shape.length)
    cols = (jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1) + j * bk).astype(jnp.uint32)
    bits = kernels.index_hash(rows, cols, prefetch_ref[0], prefetch_ref[1])
    return bits < jnp.uint32(kernels.dropout_threshold(shape.rate))


def _dropped(x, keep, shape: _Shape):
    """x where kept, times 1 / keep probability (attention_core's `_dropped`); x at rate 0."""
    if keep is None:
        return x
    scale = np.float32(2**32 / kernels.dropout_threshold(shape.rate))
    return jnp.where(keep, x * scale, 0.0)


def _forward_kernel(prefetch_ref, q_ref, k_ref, v_ref, bias_ref, o_ref, stats_ref, *scratch,
                    shape):  # fmt: skip
    b, hg, i, j = (pl.program_id(a) for a in range(4))
    d, g = shape.head_dim, shape.group
    scale = np.float32(1.0 / np.sqrt(d))
    q_all, k_all, v_all, bias = q_ref[...], k_ref[...], v_ref[...], bias_ref[...]
    outs = []
    for t in range(g):
        s = _scores(_head(q_all, t, d), _head(k_all, t, d), bias, scale)
        keep = _keep(prefetch_ref, shape, b, hg * g + t, i, j) if shape.rate else None
        v = _head(v_all, t, d)
        if shape.n_k == 1:  # the whole row at once: jax.nn.softmax's operations
            m = jnp.max(s, axis=1, keepdims=True)
            e = jnp.exp(s - m)
            total = jnp.sum(e, axis=1, keepdims=True)
            p = _dropped(e / total, keep, shape)
            outs.append(jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32))
            stats_ref[t] = jnp.concatenate([m, total], axis=1).T
            continue
        m_ref, sum_ref, acc_ref = scratch[3 * t : 3 * t + 3]

        @pl.when(j == 0)
        def _(m_ref=m_ref, sum_ref=sum_ref, acc_ref=acc_ref):
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
            sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        m_old = m_ref[...]
        m = jnp.maximum(m_old, jnp.max(s, axis=1, keepdims=True))
        rescale = jnp.exp(m_old - m)  # 0 at the first block: exp(-inf)
        e = jnp.exp(s - m)
        sum_ref[...] = rescale * sum_ref[...] + jnp.sum(e, axis=1, keepdims=True)
        pv = jnp.dot(_dropped(e, keep, shape).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)  # fmt: skip
        acc_ref[...] = rescale * acc_ref[...] + pv
        m_ref[...] = m
    if shape.n_k == 1:
        o_ref[...] = jnp.concatenate(outs, axis=1).astype(o_ref.dtype)
        return

    @pl.when(j == shape.n_k - 1)
    def _():
        for t in range(g):
            m_ref, sum_ref, acc_ref = scratch[3 * t : 3 * t + 3]
            total = sum_ref[...]
            outs.append(acc_ref[...] / total)
            stats_ref[t] = jnp.concatenate([m_ref[...], total], axis=1).T
        o_ref[...] = jnp.concatenate(outs, axis=1).astype(o_ref.dtype)


def _gradients(prefetch_ref, blocks, stats_ref, shape: _Shape, b, h, t, i, j):
    """Head t of the group (head h): block (i, j)'s probabilities [bq, bk] float32, its dropout
    mask (None at rate 0) and its d_scores [bq, bk] in q's dtype, recomputed as
    attention_core's backward computes them. blocks: the group's q, k, v, o, dO values."""
    d = shape.head_dim
    q, k, v, o, do = (_head(x, t, d) for x in blocks[:5])
    scale = np.float32(1.0 / np.sqrt(d))
    s = _scores(q, k, blocks[5], scale)
    stats = stats_ref[t].T  # [bq, 2]
    p = jnp.exp(s - stats[:, 0:1]) / stats[:, 1:2]  # the forward's probabilities
    d_dropped = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
    keep = _keep(prefetch_ref, shape, b, h, i, j) if shape.rate else None
    # sum_k dP[q, k] P[q, k] = dO[q] . O[q], as attention_core takes it
    rows = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=1, keepdims=True)
    d_scores = p * (_dropped(d_dropped, keep, shape) - rows) * scale
    return p, keep, d_scores.astype(q.dtype)


def _values(refs):
    """The q, k, v, o, dO and bias blocks' values, from the refs (q, k, v, bias, o, dO)."""
    q_ref, k_ref, v_ref, bias_ref, o_ref, do_ref = refs
    return q_ref[...], k_ref[...], v_ref[...], o_ref[...], do_ref[...], bias_ref[...]


def _zeroed_when(first, accumulators) -> None:
    """Sets the float32 accumulators to 0 at the first grid step of what they sum over."""

    @pl.when(first)
    def _():
        for acc in accumulators:
            acc[...] = jnp.zeros(acc.shape, jnp.float32)


def _dkv_kernel(prefetch_ref, *refs, shape, with_dq):
    (*inputs, stats_ref), refs = refs[:7], refs[7:]
    dq_ref, (dk_ref, dv_ref, *accumulators) = (refs[0], refs[1:]) if with_dq else (None, refs)
    b, hg, j, i = (pl.program_id(a) for a in range(4))
    d, g = shape.head_dim, shape.group

    _zeroed_when(i == 0, accumulators)
    blocks = _values(inputs)
    dqs = []
    for t in range(g):
        p, keep, d_scores = _gradients(prefetch_ref, blocks, stats_ref, shape, b, hg * g + t, t,
                                       i, j)  # fmt: skip
        q, k, do = _head(blocks[0], t, d), _head(blocks[1], t, d), _head(blocks[4], t, d)
        dropped = _dropped(p, keep, shape).astype(do.dtype)
        dk_acc, dv_acc = accumulators[2 * t : 2 * t + 2]
        dv_acc[...] += jax.lax.dot_general(dropped, do, _TN, preferred_element_type=jnp.float32)
        dk_acc[...] += jax.lax.dot_general(d_scores, q, _TN,
                                           preferred_element_type=jnp.float32)  # fmt: skip
        if with_dq:  # one key block: this block's dq is the whole of it
            dqs.append(jnp.dot(d_scores, k, preferred_element_type=jnp.float32))
    if with_dq:
        dq_ref[...] = jnp.concatenate(dqs, axis=1).astype(dq_ref.dtype)

    @pl.when(i == shape.n_q - 1)
    def _():
        for ref, accs in ((dk_ref, accumulators[0::2]), (dv_ref, accumulators[1::2])):
            ref[...] = jnp.concatenate([a[...] for a in accs], axis=1).astype(ref.dtype)


def _dq_kernel(prefetch_ref, *refs, shape):
    (*inputs, stats_ref), (dq_ref, *accumulators) = refs[:7], refs[7:]
    b, hg, i, j = (pl.program_id(a) for a in range(4))
    d, g = shape.head_dim, shape.group

    _zeroed_when(j == 0, accumulators)
    blocks = _values(inputs)
    for t in range(g):
        _, _, d_scores = _gradients(prefetch_ref, blocks, stats_ref, shape, b, hg * g + t, t,
                                    i, j)  # fmt: skip
        k = _head(blocks[1], t, d)
        accumulators[t][...] += jnp.dot(d_scores, k, preferred_element_type=jnp.float32)

    @pl.when(j == shape.n_k - 1)
    def _():
        dq_ref[...] = jnp.concatenate([a[...] for a in accumulators], axis=1).astype(dq_ref.dtype)


def _pallas(call: _Call, kernel, out_shape, scratch, interpret: bool):
    """The pallas_call of `call`: its grid, blocks and cost estimate; the prefetch in SMEM."""
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=call.grid,
            in_specs=[op.spec() for op in call.inputs],
            out_specs=[op.spec() for op in call.outputs],
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            # The innermost axis accumulates (the online softmax, dk / dv, dq) and runs in
            # order; the others are independent (a v4 / v5p megacore splits them).
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        cost_estimate=call.cost_estimate(),
        interpret=interpret,
        name=call.name,
    )


def _prefetch(key, rate, batch_offset):
    """uint32 [3], the kernels' scalar-prefetch (SMEM) input: dropout_bits' two seed words of
    `key` (zeros at rate 0, where no bit is drawn) and the shard's first batch row."""
    seeds = jax.random.bits(key, (2,), jnp.uint32) if rate else jnp.zeros((2,), jnp.uint32)
    return jnp.concatenate([seeds, jnp.asarray(batch_offset, jnp.uint32).reshape(1)])


def _forward(q, k, v, bias, prefetch, shape: _Shape, interpret):
    """q, k, v token-major [B, L, heads x d] -> (the output, alike; stats [B, heads, 2, L])."""
    call = _forward_call(shape)
    scratch = []
    if shape.n_k > 1:  # per head: the running max and sum [bq, 1] and the output's accumulator
        scratch = [pltpu.VMEM((shape.block_q, 1), jnp.float32)] * 2
        scratch = (scratch + [pltpu.VMEM((shape.block_q, shape.head_dim), jnp.float32)]) * (
            shape.group
        )
    stats = (shape.batch, shape.heads, _STATS, shape.length)
    out_shape = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(stats, jnp.float32))
    kernel = functools.partial(_forward_kernel, shape=shape)
    return _pallas(call, kernel, out_shape, scratch, interpret)(prefetch, q, k, v, bias)


def _backward(q, k, v, bias, prefetch, out, stats, g, shape: _Shape, interpret):
    """The gradients of q, k and v (token-major, as they are) from the output's, g."""
    calls = _backward_calls(shape)
    args = (prefetch, q, k, v, bias, out, g.astype(q.dtype), stats)
    like = jax.ShapeDtypeStruct(q.shape, q.dtype)
    per_head = pltpu.VMEM((shape.block_k, shape.head_dim), jnp.float32)
    accumulators = [per_head] * (2 * shape.group)  # dk, dv of each head of the group
    if len(calls) == 1:
        kernel = functools.partial(_dkv_kernel, shape=shape, with_dq=True)
        return _pallas(calls[0], kernel, (like,) * 3, accumulators, interpret)(*args)
    kernel = functools.partial(_dkv_kernel, shape=shape, with_dq=False)
    dk, dv = _pallas(calls[0], kernel, (like,) * 2, accumulators, interpret)(*args)
    kernel = functools.partial(_dq_kernel, shape=shape)
    scratch = [pltpu.VMEM((shape.block_q, shape.head_dim), jnp.float32)] * shape.group
    (dq,) = _pallas(calls[1], kernel, (like,), scratch, interpret)(*args)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, k, v, bias, prefetch, shape, interpret):
    return _forward(q, k, v, bias, prefetch, shape, interpret)[0]


def _flash_fwd(q, k, v, bias, prefetch, shape, interpret):
    out, stats = _forward(q, k, v, bias, prefetch, shape, interpret)
    return out, (q, k, v, bias, prefetch, out, stats)


def _flash_bwd(shape, interpret, residuals, g):
    dq, dk, dv = _backward(*residuals, g, shape, interpret)
    return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _token_major(x):
    """[B, heads, L, d] -> [B, L, heads x d]: the kernels' layout."""
    b, heads, length, d = x.shape
    return jnp.swapaxes(x, 1, 2).reshape(b, length, heads * d)


def _heads_first(x, heads: int):
    """[B, L, heads x d] -> [B, heads, L, d]."""
    b, length, width = x.shape
    return jnp.swapaxes(x.reshape(b, length, heads, width // heads), 1, 2)


def _attention(q, k, v, bias, key, batch_offset, heads: int, rate: float, blocks, interpret):
    """The kernels on token-major q, k, v [B, L, heads x d] of one device (its batch rows from
    `batch_offset` on): the output, alike."""
    batch, length, width = q.shape
    shape = _Shape(batch, heads, length, width // heads, q.dtype.itemsize, float(rate), *blocks)
    prefetch = _prefetch(key, shape.rate, batch_offset)
    return _flash(q, k, v, bias, prefetch, shape, bool(interpret))


def flash_attention_tokens(q, k, v, bias, key, rate: float, *, heads: int, block_q=None,
                           block_k=None, interpret: bool = False, batch_sharding=None):  # fmt: skip
    """`flash_attention` on token-major q, k, v [B, L, heads x d], the kernels' own layout:
    what projections that write each of q, k, v as one [B, L, H] array hand over without a
    move of heads (networks.SelfAttention on the Pallas path). Returns [B, L, heads x d] in
    q's dtype; the other arguments as `flash_attention`'s."""
    b, length, width = q.shape
    if k.shape != q.shape or v.shape != q.shape or bias.shape != (b, 1, 1, length):
        raise ValueError(
            f"flash_attention: q, k, v must be [B, L, heads x d] alike and bias [B, 1, 1, L]; "
            f"got q {q.shape}, k {k.shape}, v {v.shape}, bias {bias.shape}"
        )
    if heads < 1 or width % heads:
        raise ValueError(f"flash_attention: {heads} heads do not divide the width {width}")
    blocks = _checked_blocks(length, block_q, block_k)
    bias = bias.astype(jnp.float32)
    if batch_sharding is None:
        return _attention(q, k, v, bias, key, 0, heads, rate, blocks, interpret)
    mesh, axes = batch_sharding.mesh, batch_sharding.spec[0]
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    whole = jax.sharding.PartitionSpec()
    # A batch the devices do not divide (the model's init traces one row; a run's batches are
    # checked to divide them) runs whole on every device.
    shards = math.prod(mesh.shape[a] for a in names)
    split = whole if b % shards else jax.sharding.PartitionSpec(axes)

    def local(q, k, v, bias, key):
        # The shard's index over the batch's axes, major to minor, as the spec splits it.
        offset = jax.lax.axis_index(axes) * q.shape[0] if split != whole else 0
        return _attention(q, k, v, bias, key, offset, heads, rate, blocks, interpret)

    # check_vma off: a pallas_call's outputs carry no varying-axes types to check.
    return jax.shard_map(local, mesh=mesh, in_specs=(split,) * 4 + (whole,), out_specs=split,
                         check_vma=False)(q, k, v, bias, key)  # fmt: skip


def flash_attention(q, k, v, bias, key, rate: float, *, block_q=None, block_k=None,
                    interpret: bool = False, batch_sharding=None):  # fmt: skip
    """softmax(q k^T / sqrt(d) + bias), dropped out at `rate` with `key`, times v: the function
    `kernels.attention_core` computes, its dropout mask bit for bit, as Pallas TPU kernels.

    Args:
      q, k, v: [B, heads, L, d] in the compute dtype.
      bias: [B, 1, 1, L] float32, 0 at real keys and -1e9 at padding.
      key: a PRNG key (unused at rate 0).
      rate: the dropout rate on the probabilities, a Python float.
      block_q, block_k: query rows and keys per block; each divides L and is L or a multiple
        of 128 (None: `default_blocks`).
      interpret: run the kernels in Pallas's interpret mode (any backend, e.g. a CPU's tests).
      batch_sharding: None on one device; else a NamedSharding whose spec splits the leading
        (batch) dimension over mesh axes (sharding.batch_sharding): the partitioner cannot
        split a Pallas call, so the kernels run per device under shard_map, each shard's
        dropout mask offset by its first batch row (the whole batch's mask, as on one device).

    Returns:
      [B, heads, L, d] in q's dtype; scores and softmax in float32. Differentiable in q, k and v
      (custom_vjp with the kernels above); bias and key get no gradient.
    """
    b, heads, length, d = q.shape
    if k.shape != q.shape or v.shape != q.shape or bias.shape != (b, 1, 1, length):
        raise ValueError(
            f"flash_attention: q, k, v must be [B, heads, L, d] alike and bias [B, 1, 1, L]; "
            f"got q {q.shape}, k {k.shape}, v {v.shape}, bias {bias.shape}"
        )
    out = flash_attention_tokens(
        *map(_token_major, (q, k, v)), bias, key, rate, heads=heads, block_q=block_q,
        block_k=block_k, interpret=interpret, batch_sharding=batch_sharding,
    )  # fmt: skip
    return _heads_first(out, heads)
