"""Attention of the one token being decoded over one slot's KV cache (flash-decoding).

A single query row cannot fill the GPU by itself, so the keys are split across programs (split-KV): each
program takes one KV head and one share of the sequence, runs the online softmax for the H/KVH query heads
of that KV head (one tile, so each K/V tile is read once), and writes a partial (output, log-sum-exp);
split_kv's combine kernel merges them. The split count comes from max_ctx and the SM count and the shares
from seq_len on the device, so the grid is fixed for a CUDA graph that replays at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_tensor, interpreting
from .extend_attention import extend_attention_ref
from .online_softmax import LOG2E, load_kv, normalise, softmax_state, softmax_step
from .pdl import pdl_release, pdl_wait
from .split_kv import (
    check_attention,
    choose_num_splits,
    combine_splits,
    dot_launch_options,
    merge_partials,
    partials_or_out,
    split_range,
    store_partial,
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
    count_ptr,  # (KVH,) int32, zero between launches: arrivals per KV head when FUSED
    max_ctx,
    num_splits,
    qk_scale,
    H: tl.constexpr,
    G: tl.constexpr,  # query heads per KV head
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,  # G padded to a tl.dot row count
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    FUSED: tl.constexpr,  # the split that arrives last merges the partials (no combine launch)
    BLOCK_S: tl.constexpr,  # num_splits padded to a power of two
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
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
    m_i, l_i, acc = softmax_state(BLOCK_H, D)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + n
        kv_ok = j < hi  # only the share's tail tile is partial
        kv_off = kv_base + j.to(tl.int64)[:, None] * D + d[None, :]  # (N, D)
        k, v = load_kv(k_ptr, v_ptr, kv_off, kv_ok, True, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_H, N)
        qk = tl.where(kv_ok[None, :], qk, float("-inf"))
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, v_ptr.dtype.element_ty, PRECISION)

    pdl_release(PDL)  # the KV stream is done: the next kernel may launch
    o = normalise(acc, l_i)
    if SPLIT:
        if lo < kv_len:
            part_row = split_id.to(tl.int64) * H + head  # (BLOCK_H,)
            store_partial(part_o_ptr, part_lse_ptr, part_row, o, m_i, l_i, row_ok, D)
        if FUSED:
            # Every thread's partial is stored before the one release below makes them visible; splits
            # past kv_len count too, so the last arrival knows every partial is in.
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + kv_head, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                _, _, chunk = split_range(kv_len, 0, num_splits, BLOCK_N)
                s_ok = tl.arange(0, BLOCK_S) < tl.cdiv(tl.maximum(kv_len, 1), chunk)
                # One query head at a time: a (splits, D) tile of partials, all loads in flight at once.
                for g_row in tl.static_range(G):
                    row = kv_head * G + g_row
                    # .cg: from L2, where the other splits' stores are, never a stale L1 line.
                    merged = merge_partials(part_o_ptr, part_lse_ptr, row, H, s_ok, D, BLOCK_S, ".cg")  # (D,)
                    tl.store(out_ptr + row * D + d, merged.to(out_ptr.dtype.element_ty))
                tl.atomic_xchg(count_ptr + kv_head, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(out_ptr + qo_off, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@dataclass(frozen=True)
class DecodeTiles:
    """Key tile, warps and pipeline stages of one launch."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def default_tiles() -> DecodeTiles:
    # The interpreter gets small tiles so that tests at small shapes cross tiles and split boundaries.
    return DecodeTiles(16, 4, 1) if interpreting() else DecodeTiles()


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_len: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    pdl: bool = False,
    tiles: DecodeTiles | None = None,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one token q (H, D) or (1, H, D) over k_cache/v_cache (KVH, max_ctx, D) positions
    [0, seq_len); seq_len is a 1-element int32/int64 device tensor, >= 1, counting the current token (already
    stored). Returns q's shape and dtype. num_splits: splits of the key range (None: from max_ctx and SMs);
    tiles: None for `default_tiles` (the tuning sweep passes others). counts: int32 (KVH,) zeros, kept by the
    caller across launches (a CUDA graph needs fixed addresses): with it the last split to finish merges the
    partials and no combine kernel runs; each launch leaves it at zero."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES)
    if not (q.dim() == 2 or (q.dim() == 3 and q.shape[0] == 1)):
        raise ValueError(f"q must be (H, D) or (1, H, D), got {tuple(q.shape)}")
    n_heads, head_dim = q.shape[-2:]
    n_kv, max_ctx, out = check_attention(q, k_cache, v_cache, "seq_len", seq_len, out, pdl)

    group = n_heads // n_kv
    tiles = tiles or default_tiles()
    block_n = tiles.block_n
    splits = choose_num_splits(n_kv, max_ctx, block_n, q.device, num_splits)
    part_o, part_lse = partials_or_out(splits, n_heads, out)
    fused = counts is not None and splits > 1
    if counts is not None:
        check_tensor("counts", counts, ndim=1, dtypes=(torch.int32,), device=q.device)
        if counts.numel() < n_kv:
            raise ValueError(f"counts must hold one counter per KV head ({n_kv}), got {counts.numel()}")
    _decode_kernel[(n_kv, splits)](
        q,
        k_cache,
        v_cache,
        seq_len,
        out,
        part_o,
        part_lse,
        counts if fused else out,  # never touched unless fused
        max_ctx,
        splits,
        sm_scale * LOG2E,
        H=n_heads,
        G=group,
        D=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        SPLIT=splits > 1,
        FUSED=fused,
        BLOCK_S=triton.next_power_of_2(splits),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **dot_launch_options(q.dtype, pdl),
    )
    if splits > 1 and not fused:
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
