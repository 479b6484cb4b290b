"""y = x @ W.T for one row x with W stored as INT4 AWQ (kernels/awq_format.py): a decode step.

At M = 1 the product is a stream of packed weights with a few floating-point operations per weight, so
it runs on the CUDA cores, not the tensor cores: no operand shuffles through shared memory. What bounds it
is the instructions per weight (the H200 issues 128 lane-operations per SM and clock, about 33e12/s, and
streams about 9e12 weights/s), so the unpacking is three operations per weight and no int-to-float
conversion (those run at a quarter rate):

    v = bitcast_f32(0x3F800000 | nibble << 19) = 1 + q/16      one shift (a funnel shift) and one LOP3
    d += x * v                                                  one FMA

and per group of `group` input rows, with X = sum_k x[k] and D = sum_k x[k] v[k]:

    sum_k x[k] (q[k] - z) s = s (16 D - (16 + z) X)

Each thread owns four consecutive words of a row (one 16-byte load) and every K row of the tile, so the sum
over K stays in its registers: the tile's words are BLOCK_W = 128 * num_warps. Programs take a column
block and a share of the groups (split-K); the last share to arrive sums the partials in split order in
the same launch (deterministic, graph-safe), as kernels/skinny_gemm.py does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .awq_format import PACK
from .pdl import launch_options, pdl_release, pdl_wait
from .skinny_gemm import MAX_M

GEMV_MAX_M = 1  # a second row of x doubles the FMAs per weight: the tensor cores take M >= 2
ROWS_MAX = 16  # rows of one fragment-kernel launch (kernels/awq_mma.py): the atomic workspace holds them
MAX_SPLIT = 32  # K shares of a tensor-core launch: a workspace holds MAX_SPLIT partials of (16, N), so
# of one row, 16 * MAX_SPLIT: the CUDA-core kernel's limit


@dataclass(frozen=True)
class AwqWorkspace:
    """Split-K buffers of the AWQ launches, owned by the caller so that CUDA graphs see fixed addresses;
    every launch leaves them as it found them, so one serves any number of launches in stream order.

    partials: the tensor-core kernel's per-share partials, summed by the last share to arrive. accum: the
    CUDA-core kernel's shares add into it atomically (it may have hundreds of shares; one program summing
    that many partials would take longer than the stream), the last one reads it out and zeroes it."""

    partials: torch.Tensor  # (MAX_SPLIT * MAX_M * max_n,) fp32
    counts: torch.Tensor  # (max_n / 128,) int32, zero between launches
    accum: torch.Tensor  # (ROWS_MAX * max_n,) fp32, zero between launches

    @staticmethod
    def allocate(max_n: int, device: torch.device, max_split: int = 32) -> AwqWorkspace:
        return AwqWorkspace(
            torch.empty(max_split * MAX_M * max_n, dtype=torch.float32, device=device),
            torch.zeros(triton.cdiv(max_n, 2 * PACK), dtype=torch.int32, device=device),
            torch.zeros(ROWS_MAX * max_n, dtype=torch.float32, device=device),
        )


@dataclass(frozen=True)
class GemvTiles:
    """block_k rows of K per load; split_k shares of K in parts of groups (`sub` parts a group: the group
    formula is linear in D and X, so parts of a group sum to it); num_warps sets BLOCK_W = 128 * num_warps;
    num_stages > 1 lets Triton prefetch later tiles through shared memory; atomic: shares add into one fp32
    row instead of writing partials for the last share to sum."""

    block_k: int = 8
    split_k: int = 1
    num_warps: int = 1
    sub: int = 1
    num_stages: int = 1
    atomic: bool = True
    prefetch: bool = False  # load the next tile before this one's arithmetic (Triton pipelines only dots)


@triton.jit
def nibble_unit(w, NIB: tl.constexpr, POS: tl.constexpr):
    """Bits of nibble NIB of each word moved to bits POS..POS+3 (everything else zero): one shift."""
    if 4 * NIB >= POS:
        return (w >> (4 * NIB - POS)) & (0xF << POS)
    return (w << (POS - 4 * NIB)) & (0xF << POS)


@triton.jit
def unit_f32(w, NIB: tl.constexpr):
    """1 + q/16 in fp32 for nibble NIB of each word, exact: q under the exponent of 1.0."""
    return (nibble_unit(w, NIB, 19) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def group_term(d, xs, zw, srow, ok, NIB: tl.constexpr):
    """s (16 D - (16 + z) X) for the columns of nibble NIB: (BM, WORDS) fp32 from D (BM, WORDS), X (BM,)."""
    COL: tl.constexpr = (NIB % 4) * 2 + NIB // 4  # ORDER: 0 2 4 6 1 3 5 7
    z = ((zw >> (4 * NIB)) & 0xF).to(tl.float32)  # (WORDS,), once per group
    s = tl.load(srow + COL, mask=ok, other=0.0).to(tl.float32)
    return s[None, :] * (16.0 * d - (16.0 + z)[None, :] * xs[:, None])


@triton.jit
def _group_term1(d, xs, zw, srow, ok, NIB: tl.constexpr):
    """group_term for one row: D (WORDS,), X a scalar."""
    COL: tl.constexpr = (NIB % 4) * 2 + NIB // 4
    z = ((zw >> (4 * NIB)) & 0xF).to(tl.float32)
    s = tl.load(srow + COL, mask=ok, other=0.0).to(tl.float32)
    return s * (16.0 * d - (16.0 + z) * xs)


@triton.jit
def _dot1(x, w, NIB: tl.constexpr):
    return tl.sum(x[:, None] * unit_f32(w, NIB), axis=0)  # (WORDS,): the K sum in each thread's registers


@triton.jit
def finish(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, M, N,
           BLOCK_M: tl.constexpr, WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
           ATOMIC: tl.constexpr = False):  # fmt: skip
    """Put the eight nibble accumulators back in column order and store y, or the split-K partial and,
    for the last share to arrive, the sum of all partials in split order. ATOMIC: part_ptr is one zeroed
    fp32 (M, N) that every share adds into; the last share reads it out and zeroes it again."""
    # Column j = 4 j2 + 2 j1 + j0 of a word is nibble REVERSE_ORDER[j]; joins put j0 innermost, then j1,
    # then j2, so the reshape lays the columns out as 8w + j.
    acc = tl.join(tl.join(tl.join(a0, a2), tl.join(a1, a3)), tl.join(tl.join(a4, a6), tl.join(a5, a7)))
    acc = tl.reshape(acc, (BLOCK_M, WORDS * 8))
    rn = pid_n * WORDS * 8 + tl.arange(0, WORDS * 8)
    out_off = rm[:, None] * N + rn[None, :]
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    elif ATOMIC:
        tl.atomic_add(part_ptr + out_off, acc, mask=out_mask, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # every thread's adds are issued before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.load(part_ptr + out_off, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.store(part_ptr + out_off, tl.zeros_like(total), mask=out_mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(part_ptr + pid_k * M * N + out_off, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, WORDS * 8), tl.float32)
            for sh in range(SPLIT_K):  # in split order: deterministic
                total += tl.load(
                    part_ptr + sh * M * N + out_off, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _gemv_kernel(
    x_ptr,  # (1, K)
    qw_ptr,  # (K, words) int32
    qz_ptr,  # (K / GROUP, words) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (1, N)
    part_ptr,  # (SPLIT_K, 1, N) fp32 partials when SPLIT_K > 1
    count_ptr,  # (column blocks,) int32, zero between launches, when SPLIT_K > 1
    N,
    words,  # N / 8, the row stride of qweight: passed so that Triton sees it divisible by 16 (16-byte loads)
    groups,  # parts of groups: K / (GROUP / SUB)
    groups_per_split,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    ATOMIC: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rw = pid_n * BLOCK_W + tl.arange(0, BLOCK_W)
    rk = tl.arange(0, BLOCK_K)
    w_ok = rw < words
    g_lo = pid_k * groups_per_split
    g_hi = tl.minimum(g_lo + groups_per_split, groups)
    pdl_wait(PDL)  # x is the previous kernel's output
    a0 = tl.zeros((BLOCK_W,), tl.float32)
    a1 = tl.zeros((BLOCK_W,), tl.float32)
    a2 = tl.zeros((BLOCK_W,), tl.float32)
    a3 = tl.zeros((BLOCK_W,), tl.float32)
    a4 = tl.zeros((BLOCK_W,), tl.float32)
    a5 = tl.zeros((BLOCK_W,), tl.float32)
    a6 = tl.zeros((BLOCK_W,), tl.float32)
    a7 = tl.zeros((BLOCK_W,), tl.float32)
    last_row = groups * (GROUP // SUB) - 1
    if PREFETCH:
        k0 = tl.minimum(g_lo * (GROUP // SUB) + rk, last_row)
        w_next = tl.load(qw_ptr + k0.to(tl.int64)[:, None] * words + rw[None, :], mask=w_ok[None, :], other=0)
    for g in range(g_lo, g_hi):
        d0 = tl.zeros((BLOCK_W,), tl.float32)
        d1 = tl.zeros((BLOCK_W,), tl.float32)
        d2 = tl.zeros((BLOCK_W,), tl.float32)
        d3 = tl.zeros((BLOCK_W,), tl.float32)
        d4 = tl.zeros((BLOCK_W,), tl.float32)
        d5 = tl.zeros((BLOCK_W,), tl.float32)
        d6 = tl.zeros((BLOCK_W,), tl.float32)
        d7 = tl.zeros((BLOCK_W,), tl.float32)
        xs = 0.0
        for kt in range(0, GROUP // SUB, BLOCK_K):
            kk = g * (GROUP // SUB) + kt + rk
            if PREFETCH:
                w = w_next
                # The next tile's loads go out before this tile's arithmetic (rows clamped at the end of
                # the matrix: the last program re-reads a tile it never uses).
                nk = tl.minimum(kk + BLOCK_K, last_row)
                w_next = tl.load(
                    qw_ptr + nk.to(tl.int64)[:, None] * words + rw[None, :], mask=w_ok[None, :], other=0
                )
            else:
                w = tl.load(
                    qw_ptr + kk.to(tl.int64)[:, None] * words + rw[None, :], mask=w_ok[None, :], other=0
                )
            x = tl.load(x_ptr + kk).to(tl.float32)  # (BLOCK_K,)
            xs += tl.sum(x, axis=0)
            d0 += _dot1(x, w, 0)
            d1 += _dot1(x, w, 1)
            d2 += _dot1(x, w, 2)
            d3 += _dot1(x, w, 3)
            d4 += _dot1(x, w, 4)
            d5 += _dot1(x, w, 5)
            d6 += _dot1(x, w, 6)
            d7 += _dot1(x, w, 7)
        zw = tl.load(qz_ptr + (g // SUB) * words + rw, mask=w_ok, other=0)  # (BLOCK_W,)
        srow = s_ptr + (g // SUB) * N + rw * 8  # scales of the words' first columns
        a0 += _group_term1(d0, xs, zw, srow, w_ok, 0)
        a1 += _group_term1(d1, xs, zw, srow, w_ok, 1)
        a2 += _group_term1(d2, xs, zw, srow, w_ok, 2)
        a3 += _group_term1(d3, xs, zw, srow, w_ok, 3)
        a4 += _group_term1(d4, xs, zw, srow, w_ok, 4)
        a5 += _group_term1(d5, xs, zw, srow, w_ok, 5)
        a6 += _group_term1(d6, xs, zw, srow, w_ok, 6)
        a7 += _group_term1(d7, xs, zw, srow, w_ok, 7)
    pdl_release(PDL)  # the weight stream is done: the next kernel may launch
    rm = tl.arange(0, 1)
    finish(a0[None, :], a1[None, :], a2[None, :], a3[None, :], a4[None, :], a5[None, :], a6[None, :],
           a7[None, :], out_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, 1, N, 1, BLOCK_W,
           SPLIT_K, ATOMIC)  # fmt: skip


def gemv_tiles(n: int, k: int, group: int, device: torch.device) -> GemvTiles:
    """One warp per program and K shares of quarter groups, up to about sixteen programs per SM: a warp has
    one tile of loads in flight at a time, and on the H200 more and shorter programs streamed faster at
    every DeepSeek-Coder shape (docs/awq.md)."""
    if device.type != "cuda":
        return GemvTiles(block_k=16, split_k=1, num_warps=1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = triton.cdiv(n // PACK, 128)
    sub = 4 if group >= 32 else 2
    split = max(1, min(16 * MAX_SPLIT, sub * k // group, triton.cdiv(16 * sms, blocks)))
    return GemvTiles(block_k=8, split_k=split, num_warps=1, sub=sub)


def launch_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    out: torch.Tensor,
    tiles: GemvTiles,
    workspace: AwqWorkspace | None,
    pdl: bool,
) -> torch.Tensor:
    """One launch, arguments already checked by the caller (kernels/awq_gemm.py's awq_skinny)."""
    m, k = x.shape
    n = scales.shape[1]
    words, groups = qweight.shape[1], k // group * tiles.sub
    if m != 1:
        raise ValueError(f"the CUDA-core kernel takes one row of x, got {m} (GemvTiles are for M = 1)")
    part = group // max(1, tiles.sub)
    if tiles.sub < 1 or group % tiles.sub or part % tiles.block_k or tiles.block_k & (tiles.block_k - 1):
        raise ValueError(
            f"block_k {tiles.block_k} must be a power of two dividing group {group} / sub {tiles.sub}"
        )
    block_w = 128 * tiles.num_warps
    per_split = triton.cdiv(groups, max(1, tiles.split_k))
    split = triton.cdiv(groups, per_split)  # shares that hold any group at all
    blocks = triton.cdiv(words, block_w)
    part, counts = out, out  # never touched without split-K
    if split > 1:
        workspace = workspace or AwqWorkspace.allocate(n, x.device, split)
        if workspace.accum.numel() < n or workspace.counts.numel() < blocks:
            raise ValueError(f"workspace too small for N {n}")
        if not tiles.atomic and workspace.partials.numel() < split * n:
            raise ValueError(f"workspace too small for split_k {split}, N {n}")
        part = workspace.accum if tiles.atomic else workspace.partials
        counts = workspace.counts
    _gemv_kernel[(blocks, split)](
        x, qweight, qzeros, scales, out, part, counts, n, words, groups, per_split,
        GROUP=group, SUB=tiles.sub, BLOCK_W=block_w, BLOCK_K=tiles.block_k, SPLIT_K=split,
        ATOMIC=tiles.atomic, PREFETCH=tiles.prefetch, PDL=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **launch_options(pdl),
    )  # fmt: skip
    return out
