"""Attention of the one token being decoded over one slot's KV cache (flash-decoding).

A single query row cannot fill the GPU by itself, so the keys are split across programs (split-KV): each
program takes one KV head and one share of the sequence, runs the online softmax for the H/KVH query heads
of that KV head (one tile, so each K/V tile is read once), and writes a partial (output, log-sum-exp);
split_kv's combine kernel merges them. The split count comes from max_ctx and the SM count and the shares
from seq_len on the device, so the grid is fixed for a CUDA graph that replays at every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import (
    FLOAT_DTYPES,
    check_head_dim,
    check_kv_caches,
    check_out,
    check_position,
    check_tensor,
    interpreting,
)
from .extend_attention import extend_attention_ref
from .pdl import check_pdl, launch_options, pdl_enter
from .split_kv import (
    LOG2E,
    NEG_BIG,
    alloc_partials,
    choose_num_splits,
    combine_splits,
    dot_operands_fp32,
    dot_precision,
    softmax_step,
    split_range,
)


@triton.jit
def _decode_kernel(
    q_ptr,  # (H, D)
    k_ptr,  # (KVH, max_ctx, D)
    v_ptr,  # (KVH, max_ctx, D)
    seq_len_ptr,  # (1,) keys to attend, the current token's included
    out_ptr,  # (H, D), written when SPLIT is off
    part_o_ptr,  # (S, H, D) fp32, written when SPLIT is on
    part_lse_ptr,  # (S, H) fp32
    max_ctx,
    num_splits,
    qk_scale,
    H: tl.constexpr,
    G: tl.constexpr,  # query heads per KV head
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,  # G padded to a tl.dot row count
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    kv_head = tl.program_id(0)
    split_id = tl.program_id(1)
    # Clamped so that a bad seq_len reads no memory outside the cache (the host cannot see it).
    kv_len = tl.minimum(tl.load(seq_len_ptr).to(tl.int32), max_ctx)
    lo, hi, _ = split_range(kv_len, split_id, num_splits, BLOCK_N)

    g = tl.arange(0, BLOCK_H)
    head = kv_head * G + g
    row_ok = g < G
    d = tl.arange(0, D)
    qo_off = head[:, None] * D + d[None, :]  # (BLOCK_H, D)
    q = tl.load(q_ptr + qo_off, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    kv_base = kv_head.to(tl.int64) * max_ctx * D
    n = tl.arange(0, BLOCK_N)
    m_i = tl.full((BLOCK_H,), NEG_BIG, tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, D), tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + n
        kv_ok = j < hi  # only the share's tail tile is partial
        kv_off = kv_base + j.to(tl.int64)[:, None] * D + d[None, :]  # (N, D)
        k = tl.load(k_ptr + kv_off, mask=kv_ok[:, None], other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_ok[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_H, N)
        qk = tl.where(kv_ok[None, :], qk, float("-inf"))
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, v_ptr.dtype.element_ty, PRECISION)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if SPLIT:
        if lo < kv_len:
            part_row = split_id.to(tl.int64) * H + head  # (BLOCK_H,)
            tl.store(part_o_ptr + part_row[:, None] * D + d[None, :], o, mask=row_ok[:, None])
            tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_i), mask=row_ok)
    else:
        tl.store(out_ptr + qo_off, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _block_n() -> int:
    # The interpreter gets small tiles so that tests at small shapes cross tiles and split boundaries.
    return 16 if interpreting() else 64


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Attention of one token q (H, D) or (1, H, D) over k_cache/v_cache (KVH, max_ctx, D) positions
    [0, seq_len); seq_len is a 1-element int32/int64 device tensor, >= 1, counting the current token (already
    stored). Returns q's shape and dtype. num_splits: splits of the key range (None: from max_ctx and SMs)."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES)
    if not (q.dim() == 2 or (q.dim() == 3 and q.shape[0] == 1)):
        raise ValueError(f"q must be (H, D) or (1, H, D), got {tuple(q.shape)}")
    n_heads, head_dim = q.shape[-2:]
    check_head_dim(head_dim)
    n_kv, max_ctx = check_kv_caches(k_cache, v_cache, q, n_heads, head_dim)
    check_position("seq_len", seq_len, q.device)
    out = check_out(out, tuple(q.shape), q.dtype, q.device)
    check_pdl(pdl, q.device)

    group = n_heads // n_kv
    block_n = _block_n()
    splits = choose_num_splits(n_kv, max_ctx, block_n, q.device, num_splits)
    # Without splits the kernel writes `out` directly and never touches the partial pointers.
    part_o, part_lse = alloc_partials(splits, n_heads, head_dim, q.device) if splits > 1 else (out, out)
    _decode_kernel[(n_kv, splits)](
        q,
        k_cache,
        v_cache,
        seq_len,
        out,
        part_o,
        part_lse,
        max_ctx,
        splits,
        sm_scale * LOG2E,
        H=n_heads,
        G=group,
        D=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        SPLIT=splits > 1,
        UPCAST=dot_operands_fp32(q.dtype),
        PRECISION=dot_precision(q.dtype),
        num_warps=4,
        num_stages=3,
        PDL=pdl,
        **launch_options(pdl),
    )
    if splits > 1:
        combine_splits(part_o, part_lse, out.view(n_heads, head_dim), seq_len, 0, max_ctx, block_n, pdl)
    return out


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_len: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """Plain PyTorch in fp32 (the test oracle): the last of seq_len tokens attending to all of them."""
    n_heads, head_dim = q.shape[-2:]
    start = seq_len.reshape(1) - 1
    out = extend_attention_ref(q.reshape(1, n_heads, head_dim), k_cache, v_cache, start, sm_scale)
    return out.reshape(q.shape)
