"""W.T (K, N) in bf16/fp16 from its INT4 AWQ form (kernels/awq_format.py), for prefills: one streaming
launch writes a layer matrix into a reused buffer and cuBLAS multiplies it (engine/fast.py).

At thousands of rows a prefill GEMM is bound by the tensor cores, not by the weight read; writing the
matrix out once (2.5 bytes per weight moved) costs a few percent of the GEMM it feeds and leaves the GEMM
to cuBLAS, which a dequantizing Triton GEMM does not match (docs/awq.md).

A program takes BLOCK_K rows (inside one group) and BLOCK_W words; each word's eight columns are unpacked
in column order (column j at bit SHIFTS[j]), so the stores are contiguous along N.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .awq_format import PACK, dequantize
from .awq_fragments import load_words
from .awq_ops import column_shift, word_rows
from .contract import check_out, check_tensor


@triton.jit
def _dequant_kernel(
    qw_ptr,  # (K, words) int32
    qz_ptr,  # (K / GROUP, words) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (K, N)
    N,
    words,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    pid_k = tl.program_id(0)
    pid_w = tl.program_id(1)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rw = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    j = tl.arange(0, 8)  # the eight columns of a word
    shift = column_shift(j)
    w_ok = rw < words
    g = pid_k * BLOCK_K // GROUP  # BLOCK_K divides GROUP: one group per program
    w = word_rows(qw_ptr, rk, rw, words, w_ok)  # (BLOCK_K, BLOCK_W)
    zw = tl.load(qz_ptr + g * words + rw, mask=w_ok, other=0)  # (BLOCK_W,)
    cols = rw[:, None] * 8 + j[None, :]  # (BLOCK_W, 8)
    ok = w_ok[:, None]
    s = tl.load(s_ptr + g * N + cols, mask=ok, other=0.0).to(tl.float32)
    z = ((zw[:, None] >> shift[None, :]) & 0xF).to(tl.float32)  # (BLOCK_W, 8)
    q = ((w[:, :, None] >> shift[None, None, :]) & 0xF).to(tl.float32)  # (BLOCK_K, BLOCK_W, 8)
    val = (q - z[None, :, :]) * s[None, :, :]
    offs = rk.to(tl.int64)[:, None, None] * N + cols[None, :, :]
    tl.store(out_ptr + offs, val.to(out_ptr.dtype.element_ty), mask=ok[None, :, :])


def awq_dequant(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Write W.T = (q - z) s, (K, N), into `out` (bf16 or fp16, contiguous); returns `out`."""
    check_tensor("qweight", qweight, ndim=2, dtypes=(torch.int32,))
    check_tensor("qzeros", qzeros, ndim=2, dtypes=(torch.int32,), device=qweight.device)
    check_tensor("scales", scales, ndim=2, dtypes=(torch.float16,), device=qweight.device)
    k, words = qweight.shape
    groups, n = scales.shape
    if groups < 1 or k % groups or n != words * PACK or tuple(qzeros.shape) != (groups, words):
        raise ValueError(
            f"qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)} and scales "
            f"{tuple(scales.shape)} are not one AWQ matrix"
        )
    group = k // groups
    if out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"out must be bf16, fp16 or fp32, got {out.dtype}")
    check_out(out, (k, n), out.dtype, qweight.device)
    block_k = min(group, 16)
    if group % block_k:
        raise ValueError(f"group size {group} must be a multiple of {block_k}")
    block_w = 64
    grid = (k // block_k, triton.cdiv(words, block_w))
    _dequant_kernel[grid](
        qweight, qzeros, scales, out, n, words, GROUP=group, BLOCK_K=block_k, BLOCK_W=block_w
    )
    return out


def awq_dequant_ref(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Plain PyTorch: kernels/awq_format.py's dequantize, rounded once."""
    return dequantize(qweight, qzeros, scales).to(dtype)


@triton.jit
def _fragment_dequant_kernel(
    qp_ptr,  # fragment layout (kernels/awq_fragments.py)
    qz_ptr,  # (K / GROUP, N / 8) int32
    s_ptr,  # (K / GROUP, N) fp16
    out_ptr,  # (K, N)
    N: tl.constexpr,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    LW: tl.constexpr,
    TILES: tl.constexpr,
):
    """One load (16 LW rows) of TILES adjacent 16-column tiles, so each row's store is 32 TILES bytes:
    nibble rb + 2 (r // 2) + 4 (r % 2) of lane 4g + t's word j is row 4 LW t + 4 j + r, column 8 rb + g
    (kernels/awq_fragments.py)."""
    pid_n = tl.program_id(0)
    kb = tl.program_id(1)
    ROWS: tl.constexpr = 16 * LW
    tile = pid_n * TILES + tl.arange(0, TILES)
    words = tile[:, None] * (2 * K) + kb * (32 * LW) + tl.arange(0, 32 * LW)[None, :]  # (TILES, 32 LW)
    w = tl.reshape(tl.load(qp_ptr + words), (TILES, 8, 4, LW, 1, 1))  # (tile, g, t, j, rb, r)
    rb = tl.arange(0, 2)[:, None]
    r = tl.arange(0, 4)[None, :]
    shift = 4 * (rb + 2 * (r // 2) + 4 * (r % 2))  # (rb, r)
    q = (w >> shift[None, None, None, None, :, :]) & 0xF  # (tile, g, t, j, rb, r)
    q = tl.permute(q, (2, 3, 5, 0, 4, 1))  # (t, j, r, tile, rb, g)
    q = tl.reshape(q, (ROWS, TILES * 16))
    rk = kb * ROWS + tl.arange(0, ROWS)
    rn = pid_n * TILES * 16 + tl.arange(0, TILES * 16)
    grp = kb * ROWS // GROUP  # a load never crosses a group
    s = tl.load(s_ptr + grp * N + rn).to(tl.float32)
    zw = tl.load(qz_ptr + grp * (N // 8) + rn // 8)
    z = (zw >> (((rn % 8) // 2) * 4 + (rn % 2) * 16)) & 0xF  # AutoAWQ's nibble order
    val = (q - z[None, :]).to(tl.float32) * s[None, :]
    tl.store(out_ptr + rk.to(tl.int64)[:, None] * N + rn[None, :], val.to(out_ptr.dtype.element_ty))


def fragment_dequant(
    packed: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """W.T (K, N) into `out` from the fragment layout of kernels/awq_fragments.py; returns `out`."""
    groups, n = scales.shape
    k = out.shape[0]
    check_tensor("packed", packed, ndim=2, dtypes=(torch.int32,))
    check_tensor("qzeros", qzeros, shape=(groups, n // PACK), dtypes=(torch.int32,), device=packed.device)
    check_tensor("scales", scales, ndim=2, dtypes=(torch.float16,), device=packed.device)
    if groups < 1 or k % groups or packed.numel() != k * n // PACK:
        raise ValueError(
            f"packed ({packed.numel()} words), scales {tuple(scales.shape)}: not a ({k}, {n}) matrix"
        )
    check_out(out, (k, n), out.dtype, packed.device)
    group = k // groups
    lw = load_words(group)
    # Four 16-column tiles a program: 12-19 % faster than eight at the 6.7B and 33B matrices on an H200
    # (75-83 % of the copy rate, reading the words and writing bf16; docs/awq.md).
    tiles = next(c for c in (4, 2, 1) if (n // 16) % c == 0)
    _fragment_dequant_kernel[(n // 16 // tiles, k // (16 * lw))](
        packed, qzeros, scales, out, N=n, K=k, GROUP=group, LW=lw, TILES=tiles, num_warps=4
    )
    return out
