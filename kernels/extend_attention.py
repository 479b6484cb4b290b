"""Attention of T new tokens over one slot's KV cache: the whole cached prefix plus causal attention among
the new tokens, whose K/V rope_store has already written. Serves both a keystroke (T of 1..16 over a long
prefix: memory-bound, split over the keys) and a cold prefill (T in the thousands: compute-bound).

Rows of a program are (token, query head) pairs of one KV head: the H/KVH query heads sharing a KV head
sit in one tile, so every K/V tile is read once per KV head (GQA) and feeds a tensor-core dot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_tensor, interpreting
from .extend_prefill import launch_prefill
from .online_softmax import LOG2E, causal_mask, load_kv, normalise, softmax_state, softmax_step
from .pdl import pdl_release, pdl_wait
from .prefill_plan import PrefillTiles, prefill_tiles
from .split_kv import (
    check_attention,
    choose_num_splits,
    combine_splits,
    dot_launch_options,
    partials_or_out,
    split_range,
    store_partial,
)


@triton.jit
def _extend_kernel(
    q_ptr,  # (T, H, D)
    k_ptr,  # (KVH, max_ctx, D)
    v_ptr,  # (KVH, max_ctx, D)
    start_ptr,  # (1,) position of the first new token
    out_ptr,  # (T, H, D), written when SPLIT is off
    part_o_ptr,  # (S, T*H, D) fp32, written when SPLIT is on
    part_lse_ptr,  # (S, T*H) fp32
    T,
    max_ctx,
    num_splits,
    qk_scale,
    H: tl.constexpr,
    G: tl.constexpr,  # query heads per KV head
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    # Last row blocks first: under the causal mask they see the most keys, and starting the longest
    # programs first keeps the tail of a prefill launch short.
    row_block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split_id = tl.program_id(2)
    start = tl.load(start_ptr).to(tl.int32)
    # Clamped so that a start past the cache reads no memory outside it (the host cannot see start).
    kv_len = tl.minimum(start + T, max_ctx)
    lo, hi, _ = split_range(kv_len, split_id, num_splits, BLOCK_N)

    r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)  # (M,) row = token * G + head-in-group
    t = r // G
    head = kv_head * G + r % G
    row_ok = t < T
    d = tl.arange(0, D)
    qo_off = (t * H + head).to(tl.int64)[:, None] * D + d[None, :]  # (M, D) into (T, H, D)
    q = tl.load(q_ptr + qo_off, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys below start + first token + 1 are visible to every row of the tile: no causal mask there. The
    # causal edge only touches keys up to start + last token + 1.
    t_first = row_block * BLOCK_M // G
    t_last = tl.minimum((row_block * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    full_end = tl.minimum(hi, start + t_first + 1)
    full_hi = lo + tl.maximum(full_end - lo, 0) // BLOCK_N * BLOCK_N
    kv_hi = tl.minimum(hi, start + t_last + 1)

    kv_base = kv_head.to(tl.int64) * max_ctx * D
    n = tl.arange(0, BLOCK_N)
    m_i, l_i, acc = softmax_state(BLOCK_M, D)
    for j0 in range(lo, full_hi, BLOCK_N):
        kv_off = kv_base + (j0 + n).to(tl.int64)[:, None] * D + d[None, :]  # (N, D)
        k, v = load_kv(k_ptr, v_ptr, kv_off, None, False, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (M, N)
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, v_ptr.dtype.element_ty, PRECISION)
    for j0 in range(full_hi, kv_hi, BLOCK_N):
        j = j0 + n
        kv_ok = j < kv_hi
        kv_off = kv_base + j.to(tl.int64)[:, None] * D + d[None, :]
        k, v = load_kv(k_ptr, v_ptr, kv_off, kv_ok, True, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        qk = causal_mask(qk, j, t, start, kv_ok)
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, v_ptr.dtype.element_ty, PRECISION)

    pdl_release(PDL)  # the KV stream is done: the next kernel may launch
    # A row with no visible key in this split (l = 0) leaves output 0 and log-sum -inf: weight 0 in combine.
    o = normalise(acc, l_i)
    if SPLIT:
        if lo < kv_len:
            part_row = split_id.to(tl.int64) * T * H + (t * H + head)  # (M,)
            store_partial(part_o_ptr, part_lse_ptr, part_row, o, m_i, l_i, row_ok, D)
    else:
        tl.store(out_ptr + qo_off, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def tiles_for(rows: int) -> Tiles:
    """Tile shapes for T * G rows; tl.dot needs at least 16 rows on the GPU."""
    if interpreting():
        # Small tiles so that tests at small shapes cross row blocks, key tiles and split boundaries.
        return Tiles(16, 16, 4, 1)
    if rows <= 16:
        return Tiles(16, 64, 4, 3)
    if rows <= 1024:
        # 64-row tiles up to a line's worth of rows (a 256-token step): twice the row blocks, so fewer key
        # splits are needed; at 256 tokens over 4K, 36-53 us against 55-89 with 128-row tiles (H200).
        return Tiles(64, 64, 4, 3)
    return Tiles(128, 64, 8, 3)


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    pdl: bool = False,
    tiles: Tiles | PrefillTiles | None = None,
) -> torch.Tensor:
    """Causal attention of q (T, H, D) at positions start..start+T-1 over k_cache/v_cache (KVH, max_ctx, D)
    positions [0, start + T); start is a 1-element int32/int64 device tensor. Returns (T, H, D) in q.dtype.
    num_splits: splits of the key range (None: from the shapes and the SM count). tiles: the kernel and
    its tiles (None: prefill_plan's `prefill_tiles` for long steps, run by extend_prefill's kernel, else this
    kernel's `tiles_for`; the tuning sweeps pass others)."""
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    n_tok, n_heads, head_dim = q.shape
    n_kv, max_ctx, out = check_attention(q, k_cache, v_cache, "start", start, out, pdl, n_tok)

    if tiles is None:
        tiles = prefill_tiles(n_tok, n_heads, q.dtype, q.device)
    if isinstance(tiles, PrefillTiles):
        if q.dtype == torch.float32 and q.device.type == "cuda":
            # fp32 tiles are twice the bytes: two stages keep a 128-row tile inside 227 KB of shared memory.
            tiles = dataclasses.replace(tiles, num_stages=min(tiles.num_stages, 2))
        return launch_prefill(q, k_cache, v_cache, start, sm_scale, out, num_splits, pdl, tiles)
    group = n_heads // n_kv
    tiles = tiles or tiles_for(n_tok * group)
    row_blocks = triton.cdiv(n_tok * group, tiles.block_m)
    if num_splits is None and n_tok * group > 64 and q.device.type == "cuda" and not interpreting():
        # Past a keystroke's rows the work is compute, and every split costs a partial row of fp32 per
        # (token, head) written and read again: about one program per SM, no more (H200: 256 tokens over
        # 4K at 1.3B took 36 us with 2 splits, 55 us with the 9 that two programs per SM asked for).
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        num_splits = max(1, min(triton.cdiv(max_ctx, tiles.block_n), round(sms / (row_blocks * n_kv))))
    splits = choose_num_splits(row_blocks * n_kv, max_ctx, tiles.block_n, q.device, num_splits)
    rows = n_tok * n_heads
    part_o, part_lse = partials_or_out(splits, rows, out)
    _extend_kernel[(row_blocks, n_kv, splits)](
        q,
        k_cache,
        v_cache,
        start,
        out,
        part_o,
        part_lse,
        n_tok,
        max_ctx,
        splits,
        sm_scale * LOG2E,
        H=n_heads,
        G=group,
        D=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        SPLIT=splits > 1,
        num_warps=tiles.num_warps,
        # fp32 tiles are twice the bytes: two stages keep a 128-row tile well inside 227 KB of shared memory.
        num_stages=min(tiles.num_stages, 2) if q.dtype == torch.float32 else tiles.num_stages,
        **dot_launch_options(q.dtype, pdl),
    )
    if splits > 1:
        combine_splits(part_o, part_lse, out.view(rows, head_dim), start, n_tok, max_ctx, tiles.block_n, pdl)
    return out


def extend_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """Plain PyTorch in fp32 (the test oracle): softmax(q k^T * scale + causal mask) v."""
    n_tok, n_heads, _ = q.shape
    s = int(start.item())
    kv_len = s + n_tok
    group = n_heads // k_cache.shape[0]
    k = k_cache[:, :kv_len].float().repeat_interleave(group, 0)  # (H, L, D)
    v = v_cache[:, :kv_len].float().repeat_interleave(group, 0)  # (H, L, D)
    scores = q.float().transpose(0, 1) @ k.transpose(1, 2) * sm_scale  # (H, T, L)
    key_pos = torch.arange(kv_len, device=q.device)
    query_pos = s + torch.arange(n_tok, device=q.device)
    scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (H, T, D)
    return out.transpose(0, 1).to(q.dtype)  # (T, H, D)
