"""y = x @ W.T for 1 to 8 rows of bf16 x with W INT4 AWQ, on the tensor cores with no shared memory: the
packed words are permuted once, at load, so that the word a lane loads is its MMA operand fragment.

`mma.sync.m16n8k16` multiplies A (16 x 16) by B (16 x 8). Here A is a 16-column by 16-row block of W.T
(output columns as A's rows) and B is 16 rows of x.T (x's rows as B's columns, zero past M), so one MMA
serves up to eight rows of x. Lane 4g + t holds A's elements (g, 2t..2t+1), (g + 8, 2t..2t+1),
(g, 2t+8..2t+9), (g + 8, 2t+8..2t+9) as four registers of two bf16: exactly one packed word, nibbles
(i, i + 4) giving register i. So the kernel loads one word a lane per block (coalesced: a warp's block is
128 contiguous bytes), makes each register with one shift and one LOP3 (unit values 1 + q/16, as in
kernels/awq_gemm.py) and issues the MMA: about one instruction a weight, where a CUDA-core kernel spends
four and the tensor-core kernel in awq_gemm.py shuffles every word through shared memory.

K order inside a load of LW blocks (16 LW rows) is permuted too (the product does not depend on it), so
lane t's B fragments are 4 LW consecutive x values (vector loads). X = sum_k x, for the zero point, is one
more MMA with A = 1.

The layout is kernels/awq_fragments.py's (made at load: engine/awq.py's AwqLinear.to_fragments), the
kernel's operations kernels/awq_mma_ops.py's, its tiles kernels/awq_plan.py's.

Split-K: the shares add into an fp32 accumulator. `awq_mma` finishes it in the kernel (the last share to
arrive reads the totals back); `awq_mma_sums` leaves them for the next kernel to take (kernels/split_sums.py),
which saves that tail's 1.2-2.1 µs a launch on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .awq_fragments import load_words
from .awq_mma_ops import BF16_ONES, block, block2, finish_lanes, load_b, quad
from .awq_ops import column_shift, zeros4
from .awq_plan import AwqWorkspace, MmaTiles, check_awq, mma_tiles, split_shares
from .contract import check_out, interpreting
from .pdl import check_pdl, launch_options, pdl_release, pdl_wait
from .split_sums import SplitSums

MMA_MAX_M = 8  # one MMA's B columns
# Registers a thread at most for one row block: the occupancy the kernel is built for (64 registers: 32
# one-warp programs an SM fill the register file). Triton 3.6 compiles exactly that at every DeepSeek-Coder
# shape (the same SASS with and without the cap); the cap keeps another compiler from trading programs in
# flight, which are what streams the weights, for registers. Two row blocks are not capped: a cap of 96
# (what they take) changed their schedule, unmeasured in a clean comparison (docs/awq.md "A register cap").
ONE_BLOCK_REGISTERS = 64


def mma_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """bf16 MMAs (sm_80 or later), compiled: the interpreter runs no inline PTX."""
    cuda = device.type == "cuda" and not interpreting()
    return cuda and dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] >= 8


@triton.jit
def _mma_kernel(
    x_ptr,  # (M, K / 2) int32: x in bf16, two K rows a word
    qp_ptr,  # fragment layout (fragment_pack)
    qz_ptr,  # (K / GROUP, N / 8) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (M, N) bf16
    acc_ptr,  # (M, N) fp32, zero between launches, when SPLIT_K > 1
    count_ptr,  # (column blocks,) int32, zero between launches, when SPLIT_K > 1
    M,
    groups_per_split,
    N: tl.constexpr,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    LW: tl.constexpr,
    NW: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DEPTH: tl.constexpr,
    MB: tl.constexpr,  # blocks of 8 x rows: 1, or 2 for 9..16 rows (each weight streamed once)
    PDL: tl.constexpr,
    SUMS: tl.constexpr,  # only add into acc (any SPLIT_K): the next kernel takes the totals
):
    L: tl.constexpr = 32 * NW  # lanes of the program; warp w takes column tile pid_n * NW + w
    LPG: tl.constexpr = GROUP // (16 * LW)  # loads a group
    TILE_WORDS: tl.constexpr = K * 2  # words of one 16-column tile
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    lane = tl.arange(0, L)
    nt = pid_n * NW + lane // 32
    g = (lane % 32) // 4
    t = lane % 4
    nt_ok = nt < N // 16  # the launcher makes NW divide N / 16: no load needs a mask
    n0 = nt * 16 + g  # A rows g and g + 8: output columns n0, n0 + 8
    g_lo = pid_k * groups_per_split
    g_hi = tl.minimum(g_lo + groups_per_split, K // GROUP)
    c4 = tl.arange(0, 4)
    w_off = (nt * TILE_WORDS + (lane % 32) * LW)[:, None] + tl.arange(0, LW)[None, :]  # (L, LW)
    # B columns past M read row M - 1 again (their outputs are never stored): no masks, no zero fills.
    x_off = (tl.minimum(g, M - 1) * (K // 2) + t * (2 * LW))[:, None] + c4[None, :]  # (L, 4): blocks 0, 1
    x_off2 = (tl.minimum(g + 8, M - 1) * (K // 2) + t * (2 * LW))[:, None] + c4[None, :]  # rows 8-15
    z_shift = column_shift(g)  # column g of a word: AutoAWQ's nibble order
    ones = tl.full((L,), BF16_ONES, tl.int32)
    LOADS: tl.constexpr = K // (16 * LW)
    kb0 = g_lo * LPG
    if DEPTH == 1:  # weights are no kernel's output: the first load may go out before the wait
        w_next = tl.load(qp_ptr + kb0 * (32 * LW) + w_off)
    pdl_wait(PDL)  # x is the previous kernel's output
    if DEPTH == 1:
        xa_next, xb_next = load_b(x_ptr, kb0, x_off, LW)
        if MB == 2:
            xc_next, xd_next = load_b(x_ptr, kb0, x_off2, LW)
    a0, a1, a2, a3 = zeros4((L,))
    a4, a5, a6, a7 = zeros4((L,))  # x rows 8-15: only for MB 2
    for grp in range(g_lo, g_hi):
        zw0 = tl.load(qz_ptr + grp * (N // 8) + nt * 2)
        zw1 = tl.load(qz_ptr + grp * (N // 8) + nt * 2 + 1)
        s0 = tl.load(s_ptr + grp * N + n0).to(tl.float32)
        s1 = tl.load(s_ptr + grp * N + n0 + 8).to(tl.float32)
        d0, d1, d2, d3 = zeros4((L,))
        x0, x1, x2, x3 = zeros4((L,))
        if MB == 2:
            e0, e1, e2, e3 = zeros4((L,))
            u0, u1, u2, u3 = zeros4((L,))
        for ld in range(LPG):
            kb = grp * LPG + ld  # load index: rows 16 LW kb ..
            if DEPTH == 1:
                w, xa, xb = w_next, xa_next, xb_next
                # The next load goes out before this one's MMAs (past the end: the last one, unused).
                nkb = tl.minimum(kb + 1, LOADS - 1)
                w_next = tl.load(qp_ptr + nkb * (32 * LW) + w_off)
                xa_next, xb_next = load_b(x_ptr, nkb, x_off, LW)
                if MB == 2:
                    xc, xd = xc_next, xd_next
                    xc_next, xd_next = load_b(x_ptr, nkb, x_off2, LW)
            else:
                w = tl.load(qp_ptr + kb * (32 * LW) + w_off)  # (L, LW)
                xa, xb = load_b(x_ptr, kb, x_off, LW)
                if MB == 2:
                    xc, xd = load_b(x_ptr, kb, x_off2, LW)
            xa0, xa1, xa2, xa3 = quad(xa)
            if LW == 4:
                xb0, xb1, xb2, xb3 = quad(xb)
                w0, w1, w2, w3 = quad(w)
            else:
                w0, w1 = tl.split(w)
            if MB == 1 and LW == 4:
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w0, xa0, xa1, ones, d0, d1, d2, d3, x0, x1, x2, x3)
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w1, xa2, xa3, ones, d0, d1, d2, d3, x0, x1, x2, x3)
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w2, xb0, xb1, ones, d0, d1, d2, d3, x0, x1, x2, x3)
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w3, xb2, xb3, ones, d0, d1, d2, d3, x0, x1, x2, x3)
            elif MB == 1:  # LW == 2
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w0, xa0, xa1, ones, d0, d1, d2, d3, x0, x1, x2, x3)
                d0, d1, d2, d3, x0, x1, x2, x3 = block(w1, xa2, xa3, ones, d0, d1, d2, d3, x0, x1, x2, x3)
            else:
                xc0, xc1, xc2, xc3 = quad(xc)
                acc = block2(w0, xa0, xa1, xc0, xc1, ones, d0, d1, d2, d3, x0, x1, x2, x3,
                              e0, e1, e2, e3, u0, u1, u2, u3)  # fmt: skip
                d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3 = acc
                acc = block2(w1, xa2, xa3, xc2, xc3, ones, d0, d1, d2, d3, x0, x1, x2, x3,
                              e0, e1, e2, e3, u0, u1, u2, u3)  # fmt: skip
                d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3 = acc
                if LW == 4:
                    xd0, xd1, xd2, xd3 = quad(xd)
                    acc = block2(w2, xb0, xb1, xd0, xd1, ones, d0, d1, d2, d3, x0, x1, x2, x3,
                                  e0, e1, e2, e3, u0, u1, u2, u3)  # fmt: skip
                    d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3 = acc
                    acc = block2(w3, xb2, xb3, xd2, xd3, ones, d0, d1, d2, d3, x0, x1, x2, x3,
                                  e0, e1, e2, e3, u0, u1, u2, u3)  # fmt: skip
                    d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3 = acc
        z0 = ((zw0 >> z_shift) & 0xF).to(tl.float32)
        z1 = ((zw1 >> z_shift) & 0xF).to(tl.float32)
        # D fragment: (n0, m 2t), (n0, 2t + 1), (n0 + 8, 2t), (n0 + 8, 2t + 1); X likewise (rows equal).
        a0 += s0 * (16.0 * d0 - (16.0 + z0) * x0)
        a1 += s0 * (16.0 * d1 - (16.0 + z0) * x1)
        a2 += s1 * (16.0 * d2 - (16.0 + z1) * x2)
        a3 += s1 * (16.0 * d3 - (16.0 + z1) * x3)
        if MB == 2:  # x rows 8 + 2t, 9 + 2t
            a4 += s0 * (16.0 * e0 - (16.0 + z0) * u0)
            a5 += s0 * (16.0 * e1 - (16.0 + z0) * u1)
            a6 += s1 * (16.0 * e2 - (16.0 + z1) * u2)
            a7 += s1 * (16.0 * e3 - (16.0 + z1) * u3)
    pdl_release(PDL)  # the weight stream is done: the next kernel may launch
    m0 = 2 * t  # D fragment columns: x rows 2t, 2t + 1
    finish_lanes(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, acc_ptr, count_ptr, pid_n, m0, n0, nt_ok, M, N,
                 MB, SPLIT_K, SUMS)  # fmt: skip


def awq_mma(
    x: torch.Tensor,
    fragments: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: MmaTiles | None = None,
    workspace: AwqWorkspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x (M, K) bf16 times the AWQ matrix in the fragment layout (fragments: fragment_pack's words viewed
    as (K, N / 8)): (M, N) bf16. One launch per 16 rows, each streaming the weights: rows 9..16 of a launch
    share its weight loads (two MMAs a block) unless `tiles.one_pass` is off (then one launch per 8 rows)."""
    m, n = x.shape[0], scales.shape[1]
    out = check_out(out, (m, n), x.dtype, x.device)
    _launch_rows(x, fragments, qzeros, scales, out, tiles, workspace, pdl, sums=False)
    return out


def awq_mma_sums(
    x: torch.Tensor,
    fragments: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    workspace: AwqWorkspace,
    tiles: MmaTiles | None = None,
    pdl: bool = False,
) -> SplitSums:
    """awq_mma's product left as the shares' totals in `workspace.accum` (zero before, as every reader of
    SplitSums leaves it): the next kernel takes them, so no share waits to finish the sum."""
    m, n = x.shape[0], scales.shape[1]
    if workspace.accum.numel() < m * n:
        raise ValueError(f"workspace too small for M {m}, N {n}")
    totals = workspace.accum[: m * n].view(m, n)
    _launch_rows(x, fragments, qzeros, scales, totals, tiles, None, pdl, sums=True)
    return SplitSums(totals, x.dtype)


def _launch_rows(
    x: torch.Tensor,
    fragments: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    tiles: MmaTiles | None,
    workspace: AwqWorkspace | None,
    pdl: bool,
    sums: bool,
) -> None:
    """Check the arguments, then one launch per `step` rows into `out`. With `sums`, `out` is an fp32
    accumulator (zero: the totals themselves) that the shares only add into."""
    group = check_awq(x, fragments, qzeros, scales)
    m, k = x.shape
    n = scales.shape[1]
    if m < 1:
        raise ValueError(f"x must have at least one row, got {m}")
    check_pdl(pdl, x.device)
    tiles = tiles or mma_tiles(n, k, group, x.device)
    step = 2 * MMA_MAX_M if tiles.one_pass else MMA_MAX_M
    most = min(m, step)  # rows of the first launch, the largest
    if x.dtype != torch.bfloat16:
        raise ValueError(
            f"the fragment kernel takes 1..{2 * MMA_MAX_M} rows of bf16 x, got {most} of {x.dtype}"
        )
    per_split, split = split_shares(k // group, tiles.split_k)
    tiles.check(n)
    blocks = n // 16 // tiles.num_warps
    acc, counts = out, out
    if split > 1 and not sums:
        workspace = workspace or AwqWorkspace.allocate(n, x.device)
        if workspace.accum.numel() < most * n or workspace.counts.numel() < blocks:
            raise ValueError(f"workspace too small for M {most}, N {n}")
        acc, counts = workspace.accum, workspace.counts
    for r in range(0, m, step):
        rows = min(step, m - r)
        xr, yr = x[r : r + rows].view(torch.int32), out[r : r + rows]  # x in bf16, two K rows a word
        _mma_kernel[(blocks, split)](
            xr, fragments, qzeros, scales, yr, acc, counts, rows, per_split, N=n, K=k, GROUP=group,
            LW=load_words(group), NW=tiles.num_warps, SPLIT_K=split, DEPTH=tiles.depth,
            MB=triton.cdiv(rows, MMA_MAX_M), PDL=pdl, SUMS=sums, num_warps=tiles.num_warps, num_stages=1,
            maxnreg=ONE_BLOCK_REGISTERS if rows <= MMA_MAX_M else None, **launch_options(pdl),
        )  # fmt: skip
