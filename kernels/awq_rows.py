"""y = x @ W.T for 1 to 8 rows of x with W stored as INT4 AWQ (kernels/awq_format.py), on the CUDA cores:
decode steps and keystrokes.

A step of a few rows is a stream of packed weights, and at the H200's rate (about 9e12 INT4 weights/s
against 33e12 lane-operations/s) it is bound by how many loads each SM keeps in flight, not by arithmetic.
So a thread holds few registers: it owns `words` whole words (8 columns each) and every K row of its
tile, so the K sum stays in its registers with no shuffles, and the next tile's loads (weights and x) are
issued before this tile's arithmetic. With ~100 registers an SM holds about twenty such warps, each with a
tile in flight, where the first kernel (four words a thread, 214 registers) held nine.

The unpacking is kernels/awq_gemv.py's: v = 1 + q/16 made with a shift and a LOP3, one FMA per row, and
per group s (16 D - (16 + z) X). Each weight is unpacked once for all rows: a row costs one more FMA.
Split-K shares are whole parts of groups (the group formula is linear in D and X); they add into one fp32
(M, N) workspace with atomics and the last to arrive writes y and zeroes it (graph-safe, no host work).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .awq_format import PACK
from .awq_gemv import ROWS_MAX, AwqWorkspace, finish, unit_f32
from .pdl import launch_options, pdl_release, pdl_wait


@dataclass(frozen=True)
class RowTiles:
    """block_k rows of K a tile (all in each thread); words per thread (1, 2 or 4: a 4-, 8- or 16-byte
    load a row); sub parts a group, split_k K shares of whole parts; prefetch: the next tile is loaded
    before this tile's arithmetic."""

    block_k: int = 16
    words: int = 1
    num_warps: int = 1
    sub: int = 4
    split_k: int = 1
    prefetch: bool = True
    flat: bool = False  # products add up per tile row (FMA chains), summed over K once a part


@triton.jit
def _rows_dot(d, x, w, NIB: tl.constexpr, FLAT: tl.constexpr):
    """d plus x (ROWS, BLOCK_K, BLOCK_W) times nibble NIB's unit values: summed over the tile's K into d
    (ROWS, 1, BLOCK_W), or with FLAT added elementwise into d (ROWS, BLOCK_K, BLOCK_W), summed once a
    part: one FMA a product, where Triton's sum is a tree (a multiply, an FMA and an add for two)."""
    if FLAT:
        d += x * unit_f32(w, NIB)[None, :, :]
    else:
        d += tl.sum(x * unit_f32(w, NIB)[None, :, :], axis=1, keep_dims=True)
    return d


@triton.jit
def _term(d, xs, zw, s, NIB: tl.constexpr):
    """s (16 D - (16 + z) X) for nibble NIB's columns: (ROWS, BLOCK_W)."""
    z = ((zw >> (4 * NIB)) & 0xF).to(tl.float32)
    return s.to(tl.float32)[None, :] * (16.0 * d - (16.0 + z)[None, :] * xs)


@triton.jit
def _rows_kernel(
    x_ptr,  # (M, K)
    qw_ptr,  # (K, words) int32
    qz_ptr,  # (K / GROUP, words) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (M, N)
    acc_ptr,  # (M, N) fp32, zero between launches, when SPLIT_K > 1
    count_ptr,  # (column blocks,) int32, zero between launches, when SPLIT_K > 1
    M,
    parts_per_split,
    N: tl.constexpr,  # the shape is compiled in: row offsets within a tile become load immediates
    K: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    ROWS: tl.constexpr,
    WPT: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    FLAT: tl.constexpr,
    PDL: tl.constexpr,
):
    PART: tl.constexpr = GROUP // SUB
    DK: tl.constexpr = BLOCK_K if FLAT else 1  # K extent of the nibble accumulators
    WORDS: tl.constexpr = N // 8  # the row stride of qweight
    parts: tl.constexpr = K // PART
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # Without the hint Triton would spread K over lanes to make 16-byte loads, and shuffle every sum.
    rw = tl.max_contiguous(pid_n * BLOCK_W + tl.arange(0, BLOCK_W), WPT)
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, ROWS)
    w_ok = rw < WORDS
    # Offsets within a tile, in int64 so that each row's offset folds into its load as an immediate.
    w_off = rk.to(tl.int64)[:, None] * WORDS + rw[None, :]  # (BLOCK_K, BLOCK_W)
    # x broadcast along the tile's words: every thread loads the values it multiplies, in the weights'
    # layout (no shared-memory exchange, no shuffles in its sum).
    x_off = rm[:, None, None] * K + tl.max_contiguous(rk, 1)[None, :, None]  # (ROWS, BLOCK_K, 1)
    x_off += tl.zeros((1, 1, BLOCK_W), tl.int32)  # (ROWS, BLOCK_K, BLOCK_W)
    x_ok = (rm < M)[:, None, None]
    p_lo = pid_k * parts_per_split
    p_hi = tl.minimum(p_lo + parts_per_split, parts)
    if PREFETCH:  # weights are no kernel's output: the first tile may load before the wait
        w_next = tl.load(qw_ptr + p_lo * PART * WORDS + w_off, mask=w_ok[None, :], other=0)
    pdl_release(PDL)
    pdl_wait(PDL)  # x is the previous kernel's output
    if PREFETCH:
        x_next = tl.load(x_ptr + p_lo * PART + x_off, mask=x_ok, other=0.0)
    a0 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a1 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a2 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a3 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a4 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a5 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a6 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    a7 = tl.zeros((ROWS, BLOCK_W), tl.float32)
    for p in range(p_lo, p_hi):
        g = p // SUB
        # Zeros and scales of the part are loaded before its tiles, so their latency hides behind them.
        zw = tl.load(qz_ptr + g * WORDS + rw, mask=w_ok, other=0)  # (BLOCK_W,)
        srow = s_ptr + g * N + rw * 8  # scales of the words' first columns; nibble i is column ORDER[i]
        s0 = tl.load(srow + 0, mask=w_ok, other=0.0)
        s1 = tl.load(srow + 2, mask=w_ok, other=0.0)
        s2 = tl.load(srow + 4, mask=w_ok, other=0.0)
        s3 = tl.load(srow + 6, mask=w_ok, other=0.0)
        s4 = tl.load(srow + 1, mask=w_ok, other=0.0)
        s5 = tl.load(srow + 3, mask=w_ok, other=0.0)
        s6 = tl.load(srow + 5, mask=w_ok, other=0.0)
        s7 = tl.load(srow + 7, mask=w_ok, other=0.0)
        d0 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d1 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d2 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d3 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d4 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d5 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d6 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        d7 = tl.zeros((ROWS, DK, BLOCK_W), tl.float32)
        xs = tl.zeros((ROWS, BLOCK_W), tl.float32)
        for kt in range(0, PART, BLOCK_K):
            k0 = p * PART + kt  # first row of the tile
            if PREFETCH:
                w = w_next
                x = x_next
                # The last tile of the matrix stands in for the one past it (loaded, never used).
                nk = tl.minimum(k0 + BLOCK_K, K - BLOCK_K)
                w_next = tl.load(qw_ptr + nk * WORDS + w_off, mask=w_ok[None, :], other=0)
                x_next = tl.load(x_ptr + nk + x_off, mask=x_ok, other=0.0)
            else:
                w = tl.load(qw_ptr + k0 * WORDS + w_off, mask=w_ok[None, :], other=0)
                x = tl.load(x_ptr + k0 + x_off, mask=x_ok, other=0.0)
            xf = x.to(tl.float32)  # (ROWS, BLOCK_K, BLOCK_W)
            xs += tl.sum(xf, axis=1)  # (ROWS, BLOCK_W): each thread's own copy
            d0 = _rows_dot(d0, xf, w, 0, FLAT)
            d1 = _rows_dot(d1, xf, w, 1, FLAT)
            d2 = _rows_dot(d2, xf, w, 2, FLAT)
            d3 = _rows_dot(d3, xf, w, 3, FLAT)
            d4 = _rows_dot(d4, xf, w, 4, FLAT)
            d5 = _rows_dot(d5, xf, w, 5, FLAT)
            d6 = _rows_dot(d6, xf, w, 6, FLAT)
            d7 = _rows_dot(d7, xf, w, 7, FLAT)
        a0 += _term(tl.sum(d0, axis=1), xs, zw, s0, 0)
        a1 += _term(tl.sum(d1, axis=1), xs, zw, s1, 1)
        a2 += _term(tl.sum(d2, axis=1), xs, zw, s2, 2)
        a3 += _term(tl.sum(d3, axis=1), xs, zw, s3, 3)
        a4 += _term(tl.sum(d4, axis=1), xs, zw, s4, 4)
        a5 += _term(tl.sum(d5, axis=1), xs, zw, s5, 5)
        a6 += _term(tl.sum(d6, axis=1), xs, zw, s6, 6)
        a7 += _term(tl.sum(d7, axis=1), xs, zw, s7, 7)
    finish(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, acc_ptr, count_ptr, pid_n, pid_k, rm, M, N,
           ROWS, BLOCK_W, SPLIT_K, True)  # fmt: skip


def row_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> RowTiles:
    """One word a thread, 16-row tiles with the next one prefetched, quarter-group shares, about 24
    one-warp programs per SM (docs/awq.md)."""
    if device.type != "cuda":
        return RowTiles(block_k=16, sub=1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = triton.cdiv(n // PACK, 32)
    sub = 4 if group >= 64 else 2
    split = max(1, min(sub * k // group, triton.cdiv(24 * sms, blocks)))
    return RowTiles(block_k=16, words=1, num_warps=1, sub=sub, split_k=split, prefetch=True)


def launch_rows(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    out: torch.Tensor,
    tiles: RowTiles,
    workspace: AwqWorkspace | None,
    pdl: bool,
) -> torch.Tensor:
    """One launch, arguments already checked by the caller (kernels/awq_gemm.py's awq_skinny)."""
    m, k = x.shape
    n = scales.shape[1]
    words = qweight.shape[1]
    if not 1 <= m <= ROWS_MAX:
        raise ValueError(f"the CUDA-core kernel takes 1..{ROWS_MAX} rows of x, got {m}")
    if tiles.words not in (1, 2, 4):
        raise ValueError(f"words per thread must be 1, 2 or 4, got {tiles.words}")
    part = group // max(1, tiles.sub)
    if tiles.sub < 1 or group % tiles.sub or part % tiles.block_k or tiles.block_k & (tiles.block_k - 1):
        raise ValueError(
            f"block_k {tiles.block_k} must be a power of two dividing group {group} / sub {tiles.sub}"
        )
    if k * words >= 2**31:  # int32 offsets
        raise ValueError(f"qweight ({k}, {words}) has 2**31 words or more")
    parts = k // part
    per_split = triton.cdiv(parts, max(1, tiles.split_k))
    split = triton.cdiv(parts, per_split)  # shares that hold any part at all
    block_w = 32 * tiles.num_warps * tiles.words
    blocks = triton.cdiv(words, block_w)
    acc, counts = out, out  # never touched without split-K
    if split > 1:
        workspace = workspace or AwqWorkspace.allocate(n, x.device)
        if workspace.accum.numel() < m * n or workspace.counts.numel() < blocks:
            raise ValueError(f"workspace too small for M {m}, N {n}")
        acc, counts = workspace.accum, workspace.counts
    _rows_kernel[(blocks, split)](
        x, qweight, qzeros, scales, out, acc, counts, m, per_split, N=n, K=k,
        GROUP=group, SUB=tiles.sub, ROWS=triton.next_power_of_2(m), WPT=tiles.words, BLOCK_W=block_w,
        BLOCK_K=tiles.block_k, SPLIT_K=split, PREFETCH=tiles.prefetch, FLAT=tiles.flat,
        PDL=pdl,
        num_warps=tiles.num_warps, num_stages=1, **launch_options(pdl),
    )  # fmt: skip
    return out
