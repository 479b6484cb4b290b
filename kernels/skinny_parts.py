"""Prologue and epilogue pieces of the skinny GEMM (kernels/skinny_gemm.py): the residual add + RMSNorm
before a projection, and the SwiGLU after a [gate | up] projection.

They follow kernels/rms_norm.py and kernels/silu_mul.py rounding for rounding, so a fused step gives what
the separate kernels give.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class NormPrologue:
    """The residual add + RMSNorm before a projection: x := rmsnorm(x + residual) * weight, and
    residual_out := x + residual (the residual stream after this add)."""

    residual: torch.Tensor  # (M, K)
    weight: torch.Tensor  # (K,)
    eps: float
    residual_out: torch.Tensor  # (M, K), not `residual` itself


@triton.jit
def _row_inv_rms(x_ptr, res_ptr, rm, M, K, eps, BLOCK_M: tl.constexpr, BLOCK_KF: tl.constexpr):
    """1 / rms of each row of bf16-rounded x + residual, over the whole K (BLOCK_KF >= K), one row at a time
    so that only real rows are read."""
    cols = tl.arange(0, BLOCK_KF)
    col_ok = cols < K
    inv = tl.zeros((BLOCK_M,), tl.float32)
    for r in range(0, M):
        h = tl.load(x_ptr + r * K + cols, mask=col_ok, other=0.0).to(tl.float32)
        h += tl.load(res_ptr + r * K + cols, mask=col_ok, other=0.0).to(tl.float32)
        h = h.to(x_ptr.dtype.element_ty).to(tl.float32)  # the residual as stored
        inv = tl.where(rm == r, tl.rsqrt(tl.sum(h * h, 0) / K + eps), inv)
    return inv


@triton.jit
def _finish(acc, acc_up, out_ptr, GLU: tl.constexpr):
    """The output tile: acc rounded, or with GLU silu(gate) * up of the rounded products (one more
    rounding), as the separate GEMM and kernels/silu_mul.py would give."""
    out = acc.to(out_ptr.dtype.element_ty)
    if GLU:
        gate = out.to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        out = (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty)
    return out
