"""y = x @ W.T with W stored as INT4 AWQ (kernels/awq_format.py), dequantized on the fly in one launch on
the tensor cores: `awq_skinny` for steps of 3 to 16 rows (keystrokes, small prefills; one or two rows go to
the CUDA-core kernel in kernels/awq_gemv.py), `awq_gemm` tiles M as well (prefills).

A K tile never crosses a quantization group, so per group and column there is one zero and one scale and
the dequantization leaves the inner product. The nibbles go to tl.dot as v = 1 + q/16, made by putting
q's four bits under the exponent of 1.0 (exact in bf16/fp16/fp32; a shift and a LOP3, no conversion
instruction, which the hardware runs at a quarter rate), and per group, with X = sum_k x and D = x . v:

    sum_k x[m, k] (q[k, n] - z[n]) s[n] = s[n] (16 D[m, n] - (16 + z[n]) X[m])

Each nibble position of a word is its own (BLOCK_K, BLOCK_W) operand with its own accumulator (columns
8w + ORDER[i]); the eight are put back in column order once, at the end. Split-K (in whole groups) is
reduced in the same launch by the last share to arrive, as in kernels/skinny_gemm.py.

Here: the tensor-core kernel, the entry points and the reference; tiles, workspace and the contract check
are kernels/awq_plan.py's, the Triton pieces shared with the other AWQ kernels kernels/awq_ops.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .awq_format import PACK, dequantize
from .awq_gemv import launch_gemv
from .awq_ops import finish, group_term, unit_value, word_rows, zeros4
from .awq_plan import (
    GEMV_MAX_M,
    MAX_SPLIT,
    AwqTiles,
    AwqWorkspace,
    GemvTiles,
    check_awq,
    gemm_tiles,
    gemv_tiles,
    skinny_tiles,
    split_shares,
)
from .contract import check_out, interpreting
from .pdl import check_pdl, launch_options, pdl_release, pdl_wait
from .skinny_gemm import MAX_M
from .split_kv import dot_operands_fp32, dot_precision

__all__ = ["MAX_SPLIT", "AwqTiles", "AwqWorkspace", "awq_gemm", "awq_gemm_ref", "awq_skinny", "check_awq"]

KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the dot operands' dtype, for the kernel


# Nibbles i and i + 4 of a word (columns 2c, 2c + 1 in AWQ's order) sit 16 bits apart: one shift puts
# both under the bf16 mantissa's top (bits 3..6 and 19..22), one LOP3 masks them and ors in 1.0 twice.
_PAIR = "{ .reg .b32 t; %s.b32 t, $2, %d; lop3.b32 t, t, 0x00780078, 0x3F803F80, 0xea; mov.b32 {$0, $1}, t; }"
PAIR_ASM0 = tl.constexpr(_PAIR % ("shl", 3))
PAIR_ASM1 = tl.constexpr(_PAIR % ("shr", 1))
PAIR_ASM2 = tl.constexpr(_PAIR % ("shr", 5))
PAIR_ASM3 = tl.constexpr(_PAIR % ("shr", 9))


@triton.jit
def _pair(w, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(
        ASM, "=h,=h,r", [w], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1
    )


@triton.jit
def _pair_dots(x, w, d0, d1, d2, d3, d4, d5, d6, d7, PRECISION: tl.constexpr):
    """The eight nibble dots with unit values made two at a time (bf16, GPU only): two instructions per two
    weights, where unit_value takes two and a PRMT per weight."""
    v0, v4 = _pair(w, PAIR_ASM0)
    v1, v5 = _pair(w, PAIR_ASM1)
    v2, v6 = _pair(w, PAIR_ASM2)
    v3, v7 = _pair(w, PAIR_ASM3)
    d0 = tl.dot(x, v0, d0, input_precision=PRECISION)
    d1 = tl.dot(x, v1, d1, input_precision=PRECISION)
    d2 = tl.dot(x, v2, d2, input_precision=PRECISION)
    d3 = tl.dot(x, v3, d3, input_precision=PRECISION)
    d4 = tl.dot(x, v4, d4, input_precision=PRECISION)
    d5 = tl.dot(x, v5, d5, input_precision=PRECISION)
    d6 = tl.dot(x, v6, d6, input_precision=PRECISION)
    d7 = tl.dot(x, v7, d7, input_precision=PRECISION)
    return d0, d1, d2, d3, d4, d5, d6, d7


@triton.jit
def _awq_kernel(
    x_ptr,  # (M, K)
    qw_ptr,  # (K, words) int32
    qz_ptr,  # (K / GROUP, words) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (M, N)
    part_ptr,  # (SPLIT_K, M, N) fp32 partials when SPLIT_K > 1
    count_ptr,  # (column blocks,) int32, zero between launches, when SPLIT_K > 1
    M,
    N,
    K,
    words,  # N / 8, the row stride of qweight: an argument, so Triton sees it divisible by 16
    groups,
    groups_per_split,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    KIND: tl.constexpr,
    PAIRS: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    n_blocks = tl.cdiv(words, BLOCK_W)
    pid_m = tl.program_id(0) // n_blocks
    pid_n = tl.program_id(0) % n_blocks
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = pid_n * BLOCK_W + tl.arange(0, BLOCK_W)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    w_ok = rw < words
    g_lo = pid_k * groups_per_split
    g_hi = tl.minimum(g_lo + groups_per_split, groups)
    pdl_wait(PDL)  # x is the previous kernel's output
    a0, a1, a2, a3 = zeros4((BLOCK_M, BLOCK_W))
    a4, a5, a6, a7 = zeros4((BLOCK_M, BLOCK_W))
    for g in range(g_lo, g_hi):
        d0, d1, d2, d3 = zeros4((BLOCK_M, BLOCK_W))
        d4, d5, d6, d7 = zeros4((BLOCK_M, BLOCK_W))
        xs = tl.zeros((BLOCK_M,), tl.float32)
        for kt in range(0, GROUP, BLOCK_K):
            kk = g * GROUP + kt + rk
            x = tl.load(x_ptr + rm.to(tl.int64)[:, None] * K + kk[None, :], mask=m_ok[:, None], other=0.0)
            w = word_rows(qw_ptr, kk, rw, words, w_ok)
            xs += tl.sum(x.to(tl.float32), axis=1)
            if KIND == 0:
                x = x.to(tl.float32)
            if PAIRS:
                d0, d1, d2, d3, d4, d5, d6, d7 = _pair_dots(x, w, d0, d1, d2, d3, d4, d5, d6, d7, PRECISION)
            else:
                d0 = tl.dot(x, unit_value(w, 0, KIND), d0, input_precision=PRECISION)
                d1 = tl.dot(x, unit_value(w, 1, KIND), d1, input_precision=PRECISION)
                d2 = tl.dot(x, unit_value(w, 2, KIND), d2, input_precision=PRECISION)
                d3 = tl.dot(x, unit_value(w, 3, KIND), d3, input_precision=PRECISION)
                d4 = tl.dot(x, unit_value(w, 4, KIND), d4, input_precision=PRECISION)
                d5 = tl.dot(x, unit_value(w, 5, KIND), d5, input_precision=PRECISION)
                d6 = tl.dot(x, unit_value(w, 6, KIND), d6, input_precision=PRECISION)
                d7 = tl.dot(x, unit_value(w, 7, KIND), d7, input_precision=PRECISION)
        zw = tl.load(qz_ptr + g * words + rw, mask=w_ok, other=0)  # (BLOCK_W,)
        srow = s_ptr + g * N + rw * 8  # scales of the words' first columns
        a0 += group_term(d0, xs, zw, srow, w_ok, 0)
        a1 += group_term(d1, xs, zw, srow, w_ok, 1)
        a2 += group_term(d2, xs, zw, srow, w_ok, 2)
        a3 += group_term(d3, xs, zw, srow, w_ok, 3)
        a4 += group_term(d4, xs, zw, srow, w_ok, 4)
        a5 += group_term(d5, xs, zw, srow, w_ok, 5)
        a6 += group_term(d6, xs, zw, srow, w_ok, 6)
        a7 += group_term(d7, xs, zw, srow, w_ok, 7)
    pdl_release(PDL)  # the weight stream is done: the next kernel may launch
    finish(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, M, N,
           BLOCK_M, BLOCK_W, SPLIT_K)  # fmt: skip


def _launch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    out: torch.Tensor,
    tiles: AwqTiles,
    workspace: AwqWorkspace | None,
    pdl: bool,
) -> torch.Tensor:
    m, k = x.shape
    n = scales.shape[1]
    words, groups = qweight.shape[1], k // group
    tiles.check(group)
    per_split, split = split_shares(groups, tiles.split_k)
    block_w = tiles.block_n // PACK
    n_blocks = triton.cdiv(words, block_w)
    m_blocks = triton.cdiv(m, tiles.block_m)
    part, counts = out, out  # never touched without split-K
    if split > 1:
        if m_blocks > 1:
            raise ValueError(f"split-K needs all {m} rows in one block (block_m {tiles.block_m})")
        workspace = workspace or AwqWorkspace.allocate(n, x.device, split)
        if workspace.partials.numel() < split * m * n or workspace.counts.numel() < n_blocks:
            raise ValueError(f"workspace too small for split_k {split}, M {m}, N {n}")
        part, counts = workspace.partials, workspace.counts
    upcast = dot_operands_fp32(x.dtype)
    pairs = tiles.pairs and x.dtype == torch.bfloat16 and not interpreting()
    _awq_kernel[(m_blocks * n_blocks, split)](
        x, qweight, qzeros, scales, out, part, counts, m, n, k, words, groups, per_split,
        GROUP=group, BLOCK_M=tiles.block_m, BLOCK_W=block_w, BLOCK_K=tiles.block_k, SPLIT_K=split,
        KIND=0 if upcast else KIND[x.dtype], PAIRS=pairs, PRECISION=dot_precision(x.dtype), PDL=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **launch_options(pdl),
    )  # fmt: skip
    return out


def awq_skinny(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: AwqTiles | GemvTiles | None = None,
    workspace: AwqWorkspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x (M, K), M <= 16, times the AWQ matrix (K -> N): (M, N) in x.dtype. GemvTiles (the default for
    M <= 2) run the CUDA-core kernel, AwqTiles the tensor-core one. Split-K tiles need a workspace (one is
    allocated if none). pdl: launch as a programmatic dependent of the previous kernel."""
    group = check_awq(x, qweight, qzeros, scales)
    m, k = x.shape
    n = scales.shape[1]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x must have 1..{MAX_M} rows (larger M belongs to awq_gemm), got {m}")
    check_pdl(pdl, x.device)
    out = check_out(out, (m, n), x.dtype, x.device)
    if tiles is None:
        small = m <= GEMV_MAX_M
        tiles = gemv_tiles(n, k, group, x.device) if small else skinny_tiles(m, n, k, group, x.device)
    if isinstance(tiles, GemvTiles):
        return launch_gemv(x, qweight, qzeros, scales, group, out, tiles, workspace, pdl)
    return _launch(x, qweight, qzeros, scales, group, out, tiles, workspace, pdl)


def awq_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: AwqTiles | None = None,
) -> torch.Tensor:
    """x (M, K), any M >= 1, times the AWQ matrix: tiled over M and N, no split-K (prefills)."""
    group = check_awq(x, qweight, qzeros, scales)
    m, k = x.shape
    n = scales.shape[1]
    out = check_out(out, (m, n), x.dtype, x.device)
    tiles = tiles or gemm_tiles(m, n, k, group, x.device)
    if tiles.split_k != 1:
        raise ValueError("awq_gemm tiles take no split-K (awq_skinny does)")
    return _launch(x, qweight, qzeros, scales, group, out, tiles, None, False)


def awq_gemm_ref(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """Plain PyTorch: dequantize to fp32, fp32 products and sums, one rounding (the test oracle)."""
    return (x.float() @ dequantize(qweight, qzeros, scales)).to(x.dtype)
