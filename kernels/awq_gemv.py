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

Here: the kernel and its launcher (called by awq_skinny, kernels/awq_gemm.py); its tiles, their default and
the workspace are kernels/awq_plan.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .awq_ops import finish, group_term1, unit_value, word_rows, zeros4
from .awq_plan import AwqWorkspace, GemvTiles, split_shares
from .pdl import launch_options, pdl_release, pdl_wait


@triton.jit
def _dot1(x, w, NIB: tl.constexpr):
    """sum_k x v for nibble NIB, v in fp32: (WORDS,), the K sum in each thread's registers."""
    return tl.sum(x[:, None] * unit_value(w, NIB, 0), axis=0)


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
    a0, a1, a2, a3 = zeros4((BLOCK_W,))
    a4, a5, a6, a7 = zeros4((BLOCK_W,))
    last_row = groups * (GROUP // SUB) - 1
    if PREFETCH:
        k0 = tl.minimum(g_lo * (GROUP // SUB) + rk, last_row)
        w_next = word_rows(qw_ptr, k0, rw, words, w_ok)
    for g in range(g_lo, g_hi):
        d0, d1, d2, d3 = zeros4((BLOCK_W,))
        d4, d5, d6, d7 = zeros4((BLOCK_W,))
        xs = 0.0
        for kt in range(0, GROUP // SUB, BLOCK_K):
            kk = g * (GROUP // SUB) + kt + rk
            if PREFETCH:
                w = w_next
                # The next tile's loads go out before this tile's arithmetic (rows clamped at the end of
                # the matrix: the last program re-reads a tile it never uses).
                nk = tl.minimum(kk + BLOCK_K, last_row)
                w_next = word_rows(qw_ptr, nk, rw, words, w_ok)
            else:
                w = word_rows(qw_ptr, kk, rw, words, w_ok)
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
        a0 += group_term1(d0, xs, zw, srow, w_ok, 0)
        a1 += group_term1(d1, xs, zw, srow, w_ok, 1)
        a2 += group_term1(d2, xs, zw, srow, w_ok, 2)
        a3 += group_term1(d3, xs, zw, srow, w_ok, 3)
        a4 += group_term1(d4, xs, zw, srow, w_ok, 4)
        a5 += group_term1(d5, xs, zw, srow, w_ok, 5)
        a6 += group_term1(d6, xs, zw, srow, w_ok, 6)
        a7 += group_term1(d7, xs, zw, srow, w_ok, 7)
    pdl_release(PDL)  # the weight stream is done: the next kernel may launch
    rm = tl.arange(0, 1)
    finish(a0[None, :], a1[None, :], a2[None, :], a3[None, :], a4[None, :], a5[None, :], a6[None, :],
           a7[None, :], out_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, 1, N, 1, BLOCK_W,
           SPLIT_K, ATOMIC)  # fmt: skip


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
    tiles.check(group)
    block_w = 128 * tiles.num_warps
    per_split, split = split_shares(groups, tiles.split_k)
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
