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


@dataclass(frozen=True)
class ResidualEpilogue:
    """After a projection y (O, down): residual += y in place (rounded as stored), the result written is
    residual * weight (the next RMSNorm's weight, not yet its scale), and each N block's sum of squares of
    the new residual rows goes to `sums` (block, row), for the next projection's RmsScale."""

    residual: torch.Tensor  # (M, N)
    weight: torch.Tensor  # (N,)
    sums: torch.Tensor  # (>= blocks * MAX_M,) fp32


@dataclass(frozen=True)
class RmsScale:
    """The product scaled by 1 / rms of each row of the residual a ResidualEpilogue wrote, from its block
    sums: with x = residual * weight, that is rmsnorm(residual) * weight @ W.T, the norm without a launch."""

    sums: torch.Tensor  # (>= blocks * MAX_M,) fp32
    blocks: int  # N blocks of the ResidualEpilogue's launch
    eps: float


@dataclass(frozen=True)
class RopeEpilogue:
    """After the QKV projection: RoPE on the q and k heads, k and v stored into one slot's KV cache at
    positions start.., and the rotated q returned (M, H * D): kernels/rope_store.py without its launch, the
    same arithmetic (the product rounded as stored, rotated in fp32, rounded once)."""

    cos_sin: torch.Tensor  # (>= max_ctx, D) fp32, rope_cos_sin
    start: torch.Tensor  # (1,) int32/int64 on the device: position of row 0
    k_cache: torch.Tensor  # (KVH, max_ctx, D)
    v_cache: torch.Tensor  # (KVH, max_ctx, D)
    num_heads: int
    num_kv_heads: int


@triton.jit
def _rms_inv(sums_ptr, sum_blocks, rm, m_ok, K, eps, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    """1 / rms of each row from the block sums a ResidualEpilogue left, added in one fixed order (the result
    does not depend on which program ran first). Only the real rows are read (a decode step: 1 of 16); .cg:
    the previous kernel's stores are in L2, never in a stale L1 line."""
    b = tl.arange(0, BLOCK_B)
    sums = tl.load(
        sums_ptr + b[:, None] * BLOCK_M + rm[None, :],
        mask=(b < sum_blocks)[:, None] & m_ok[None, :],
        other=0.0,
        cache_modifier=".cg",
    )  # (BLOCK_B, BLOCK_M)
    return tl.rsqrt(tl.sum(sums, 0) / K + eps)  # (BLOCK_M,)


@triton.jit
def _rope_tile(x1, x2, q_ptr, k_ptr, v_ptr, cos_sin_ptr, start_ptr, rm, m_ok, pid_n, max_ctx,
               H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, P: tl.constexpr):  # fmt: skip
    """A RopeEpilogue tile: dims j..j+P of one head (x1) and the same dims of its second half (x2)."""
    head = pid_n // (D // 2 // P)
    j = (pid_n % (D // 2 // P)) * P + tl.arange(0, P)  # (P,)
    x1 = x1.to(q_ptr.dtype.element_ty).to(tl.float32)  # the projection as stored
    x2 = x2.to(q_ptr.dtype.element_ty).to(tl.float32)
    pos = tl.load(start_ptr).to(tl.int64) + rm
    # Positions past the cache are dropped: a write there would land in another head's (or slot's) rows.
    ok = (m_ok & (pos < max_ctx))[:, None]
    if head < H + KVH:
        cs = cos_sin_ptr + pos[:, None] * D + j[None, :]
        cos = tl.load(cs, mask=ok, other=0.0)
        sin = tl.load(cs + D // 2, mask=ok, other=0.0)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
    else:
        y1 = x1
        y2 = x2
    if head < H:
        dst = q_ptr + rm.to(tl.int64)[:, None] * (H * D) + head * D + j[None, :]
    elif head < H + KVH:
        dst = k_ptr + (head - H).to(tl.int64) * max_ctx * D + pos[:, None] * D + j[None, :]
    else:
        dst = v_ptr + (head - H - KVH).to(tl.int64) * max_ctx * D + pos[:, None] * D + j[None, :]
    tl.store(dst, y1.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, y2.to(q_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _epilogue(total, total_up, out_ptr, out_off, out_mask, rm, rn, n_ok, pid_n, res_ptr, norm_w_ptr, sums_ptr,
              GLU: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """Store the output tile: plain (_finish, with GLU the SwiGLU of the two halves), or as a
    ResidualEpilogue (RESIDUAL)."""
    if RESIDUAL:
        y = total.to(out_ptr.dtype.element_ty).to(tl.float32)  # the projection, rounded as stored
        h = y + tl.load(res_ptr + out_off, mask=out_mask, other=0.0).to(tl.float32)
        h_stored = h.to(out_ptr.dtype.element_ty)
        tl.store(res_ptr + out_off, h_stored, mask=out_mask)
        hf = tl.where(out_mask, h_stored.to(tl.float32), 0.0)
        tl.store(sums_ptr + pid_n * BLOCK_M + rm, tl.sum(hf * hf, 1))
        nw = tl.load(norm_w_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_off, (hf * nw[None, :]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptr + out_off, _finish(total, total_up, out_ptr, GLU), mask=out_mask)
