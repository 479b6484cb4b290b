"""Extend attention for long steps (a cold prompt, a pasted block: hundreds of new tokens and more), where the
work is FLOPs, not bytes: a FlashAttention-2 forward with one program per (query block, query head).

Against `extend_attention`'s kernel (rows = (token, head) pairs of one KV head, built for keystrokes) this
one keeps a query head's rows in one wgmma-sized tile, feeds the P·V product into the running accumulator,
folds the softmax scale into one multiply-add before exp2, and on Hopper may load its tiles through tensor
descriptors (TMA). GQA maps a query head to its KV head (head // G): the G programs of a group read the same
K/V tiles, which stay in L2. Causal blocks are skipped exactly: keys every row of the block sees run in a
loop without masks, only the diagonal tiles are masked. Short steps that leave SMs idle split the key range
(split_kv.py), with the shares computed from the position on the device, so CUDA graphs replay at any start.
Its tiles and split counts are chosen in prefill_plan.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .online_softmax import LOG2E, causal_mask, normalise, softmax_state
from .pdl import pdl_enter
from .prefill_plan import PrefillTiles, prefill_splits
from .split_kv import (
    choose_num_splits,
    combine_splits,
    dot_launch_options,
    partials_or_out,
    split_range,
    store_partial,
)


@triton.jit
def _kv_tile(src, row, rows_ok, D: tl.constexpr, ROWS: tl.constexpr, TMA: tl.constexpr, MASK: tl.constexpr):
    """(ROWS, D) rows [row, row + ROWS) of a (rows, D) cache: through the descriptor (a whole tile; rows past
    the array read as zeros), or by pointers, masked to rows_ok when MASK."""
    if TMA:
        tile = src.load([row, 0])
    else:
        off = (row + tl.arange(0, ROWS))[:, None] * D + tl.arange(0, D)[None, :]  # int32: one head's rows
        if MASK:  # noqa: SIM108 (a constexpr branch: one load is compiled)
            tile = tl.load(src + off, mask=rows_ok[:, None], other=0.0)
        else:
            tile = tl.load(src + off)
    return tile


@triton.jit
def _extend_long_kernel(
    q,  # (T, H, D) pointer, or a descriptor of (T, H * D) with (BLOCK_M, D) blocks
    k,  # (KVH, max_ctx, D) pointer, or a descriptor of (KVH * max_ctx, D) with (BLOCK_N, D) blocks
    v,  # as k
    start_ptr,  # (1,) position of the first new token
    out,  # as q; written when SPLIT is off
    part_o_ptr,  # (S, T*H, D) fp32, written when SPLIT is on
    part_lse_ptr,  # (S, T*H) fp32
    T,
    H,
    G,  # query heads per KV head
    max_ctx,
    num_splits,
    qk_scale,  # sm_scale * log2(e): scores in log2 units
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    TMA: tl.constexpr,
    LAZY: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # Blocks launch in program-id order, heads fastest: every head of the last query block first. Under the
    # causal mask those see the most keys, and starting the longest programs first keeps the launch's tail
    # short; the G heads of a KV head run side by side and share its tiles in L2.
    head = tl.program_id(0)
    q_block = tl.num_programs(1) - 1 - tl.program_id(1)
    split_id = tl.program_id(2)
    kv_head = head // G
    start = tl.load(start_ptr).to(tl.int32)
    # Clamped so that a start past the cache reads no memory outside it (the host cannot see start).
    kv_len = tl.minimum(start + T, max_ctx)
    lo, hi, _ = split_range(kv_len, split_id, num_splits, BLOCK_N)

    t0 = q_block * BLOCK_M
    t = t0 + tl.arange(0, BLOCK_M)  # (M,) token of each row
    row_ok = t < T
    # q and out as (T * H, D) rows when read by pointers: row t * H + head.
    q_rows = t * H + head
    if TMA:
        qt = q.load([t0, head * D])
    else:
        d = tl.arange(0, D)
        qt = tl.load(q + q_rows.to(tl.int64)[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    p_dtype = qt.dtype  # the cache dtype: what the tensor cores take
    if UPCAST:
        qt = qt.to(tl.float32)

    # Keys up to start + t0 are visible to every row of the block: no mask there, in whole tiles from lo.
    # The last row (t0 + BLOCK_M - 1, or T - 1) sees keys up to start + its token.
    full_end = tl.minimum(hi, start + t0 + 1)
    full_hi = lo + tl.maximum(full_end - lo, 0) // BLOCK_N * BLOCK_N
    kv_hi = tl.minimum(hi, start + tl.minimum(t0 + BLOCK_M, T))
    kv_row0 = kv_head * max_ctx  # this KV head's first row in (KVH * max_ctx, D)
    if not TMA:
        k = k + kv_row0.to(tl.int64) * D
        v = v + kv_row0.to(tl.int64) * D
        kv_row0 = 0
    n = tl.arange(0, BLOCK_N)
    m_i, l_i, acc = softmax_state(BLOCK_M, D)
    for j0 in range(lo, full_hi, BLOCK_N):
        kt = _kv_tile(k, kv_row0 + j0, n, D, BLOCK_N, TMA, False)
        vt = _kv_tile(v, kv_row0 + j0, n, D, BLOCK_N, TMA, False)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        qk = tl.dot(qt, tl.trans(kt), input_precision=PRECISION)  # (M, N), unscaled
        # The scale is positive, so it commutes with the max: one multiply-add per score feeds exp2.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        if LAZY:
            # Rescale only when some row's max rose by more than 2^8: below that the stale max keeps
            # p <= 256 (exact in fp32 sums, bf16's relative precision), and the (M, D) multiply is skipped.
            if tl.max(m_new - m_i, 0) > 8.0:
                alpha = tl.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = tl.exp2(qk * qk_scale - m_i[:, None])
            acc = tl.dot(p.to(p_dtype).to(vt.dtype), vt, acc, input_precision=PRECISION)
            l_i = l_i + tl.sum(p, 1)
        else:
            p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            # p is rounded to the cache dtype as the tensor cores take it (also where the interpreter
            # widened v).
            acc = tl.dot(p.to(p_dtype).to(vt.dtype), vt, acc * alpha[:, None], input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
    for j0 in range(full_hi, kv_hi, BLOCK_N):
        j = j0 + n
        kv_ok = j < kv_hi
        kt = _kv_tile(k, kv_row0 + j0, kv_ok, D, BLOCK_N, TMA, True)
        vt = _kv_tile(v, kv_row0 + j0, kv_ok, D, BLOCK_N, TMA, True)
        if TMA:
            # A whole tile was read: rows past kv_hi may hold anything (the cache is never zeroed) and a
            # NaN there would survive p = 0 in the product.
            vt = tl.where(kv_ok[:, None], vt, 0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        qk = tl.dot(qt, tl.trans(kt), input_precision=PRECISION) * qk_scale
        qk = causal_mask(qk, j, t, start, kv_ok)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        acc = tl.dot(p.to(p_dtype).to(vt.dtype), vt, acc * alpha[:, None], input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    # A row with no visible key in this split (l = 0) leaves output 0 and log-sum -inf: weight 0 in combine.
    o = normalise(acc, l_i)
    if SPLIT:
        if lo < kv_len:
            part_row = split_id.to(tl.int64) * T * H + q_rows  # (M,)
            store_partial(part_o_ptr, part_lse_ptr, part_row, o, m_i, l_i, row_ok, D)
    elif TMA:
        out.store([t0, head * D], o.to(p_dtype))  # rows past T are clipped by the descriptor
    else:
        d = tl.arange(0, D)
        o_off = q_rows.to(tl.int64)[:, None] * D + d[None, :]
        tl.store(out + o_off, o.to(p_dtype), mask=row_ok[:, None])


def launch_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    num_splits: int | None,
    pdl: bool,
    tiles: PrefillTiles,
) -> torch.Tensor:
    """The long-step kernel; `extend_attention` checked the arguments (shapes, dtypes, devices)."""
    n_tok, n_heads, head_dim = q.shape
    n_kv, max_ctx, _ = k_cache.shape
    q_blocks = triton.cdiv(n_tok, tiles.block_m)
    if num_splits is None:
        num_splits = prefill_splits(q_blocks * n_heads, max_ctx, tiles, q.device)
    else:  # checked against the same limit as the other kernels' splits
        num_splits = choose_num_splits(q_blocks * n_heads, max_ctx, tiles.block_n, q.device, num_splits)
    rows = n_tok * n_heads
    part_o, part_lse = partials_or_out(num_splits, rows, out)
    if tiles.tma:
        # Descriptors over 2-D views; the kernel's pointer math uses the same (row, column) coordinates.
        from triton.tools.tensor_descriptor import TensorDescriptor

        width = n_heads * head_dim
        qd = TensorDescriptor(q, [n_tok, width], [width, 1], [tiles.block_m, head_dim])
        od = TensorDescriptor(out, [n_tok, width], [width, 1], [tiles.block_m, head_dim])
        kd = TensorDescriptor(k_cache, [n_kv * max_ctx, head_dim], [head_dim, 1], [tiles.block_n, head_dim])
        vd = TensorDescriptor(v_cache, [n_kv * max_ctx, head_dim], [head_dim, 1], [tiles.block_n, head_dim])
        args: tuple[object, ...] = (qd, kd, vd, start, od)
    else:
        args = (q, k_cache, v_cache, start, out)
    _extend_long_kernel[(n_heads, q_blocks, num_splits)](
        *args,
        part_o,
        part_lse,
        n_tok,
        n_heads,
        n_heads // n_kv,
        max_ctx,
        num_splits,
        sm_scale * LOG2E,
        D=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        SPLIT=num_splits > 1,
        TMA=tiles.tma,
        LAZY=tiles.lazy,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **dot_launch_options(q.dtype, pdl),
        **({"maxnreg": tiles.maxnreg} if tiles.maxnreg else {}),
    )
    if num_splits > 1:
        combine_splits(part_o, part_lse, out.view(rows, head_dim), start, n_tok, max_ctx, tiles.block_n, pdl)
    return out
