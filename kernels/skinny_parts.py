"""Epilogues of the skinny GEMM (kernels/skinny_gemm.py): the residual add and the RMSNorm between two
projections, the SwiGLU after a [gate | up] projection, RoPE and the K/V store after the QKV projection.

They follow kernels/rms_norm.py, kernels/silu_mul.py and kernels/rope_store.py rounding for rounding,
except where a docstring says otherwise, so a fused step gives what the separate kernels give.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_head_dim, check_tensor
from .rope_store import check_rope_caches, rotate_store

BLOCK_ROWS = 16  # rows of x a skinny GEMM program holds (its MAX_M): the row stride of the block sums


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
    sums: torch.Tensor  # (>= blocks * BLOCK_ROWS,) fp32


@dataclass(frozen=True)
class RmsScale:
    """The product scaled by 1 / rms of each row of the residual a ResidualEpilogue wrote, from its block
    sums: with x = residual * weight, that is rmsnorm(residual) * weight @ W.T, the norm without a launch.
    It rounds the weighted row before the scale where kernels/rms_norm.py rounds the normalised row and
    then the weighted one: a bf16 ulp or two of each operand, not the same bits."""

    sums: torch.Tensor  # (>= blocks * BLOCK_ROWS,) fp32
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
    rotate_store(x1, x2, head, j, rm, pos, ok, q_ptr, k_ptr, v_ptr, cos_sin_ptr, max_ctx, H, KVH, D)


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


@triton.jit
def _tile_out(acc, out_ptr, rm, m_ok, rn, n_ok, pid_n, res_ptr, norm_w_ptr, sums_ptr, sum_blocks, cos_sin_ptr,
              start_ptr, k_ptr, v_ptr, max_ctx, N, K, eps, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
              RMS: tl.constexpr, ROPE: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):  # fmt: skip
    """The finished tile (fp32 sums) to its epilogue: scaled by the rows' 1 / rms (RMS), then split into
    its halves for GLU (gate, up) and ROPE (the two halves of a head's dims), or stored whole."""
    if RMS:
        acc = acc * _rms_inv(sums_ptr, sum_blocks, rm, m_ok, K, eps, BLOCK_M, BLOCK_B)[:, None]
    out_off = rm[:, None] * N + rn[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if GLU or ROPE:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))  # (M, BLOCK_N / 2, 2)
        first, second = tl.split(halves)
        if ROPE:
            _rope_tile(first, second, out_ptr, k_ptr, v_ptr, cos_sin_ptr, start_ptr, rm, m_ok, pid_n, max_ctx,
                       H, KVH, D, BLOCK_N // 2)  # fmt: skip
        else:
            _epilogue(first, second, out_ptr, out_off, out_mask, rm, rn, n_ok, pid_n, res_ptr, norm_w_ptr,
                      sums_ptr, GLU, RESIDUAL, BLOCK_M)  # fmt: skip
    else:
        _epilogue(acc, acc, out_ptr, out_off, out_mask, rm, rn, n_ok, pid_n, res_ptr, norm_w_ptr, sums_ptr,
                  GLU, RESIDUAL, BLOCK_M)  # fmt: skip


def check_epilogues(
    x: torch.Tensor,
    n: int,
    residual: ResidualEpilogue | None,
    rms: RmsScale | None,
    glu: bool,
    blocks: int,
) -> int:
    """The contract of the residual epilogue and the RMS scale; returns the block count rms names (0)."""
    m = x.shape[0]
    if residual is not None:
        if glu or rms is not None:
            raise ValueError("a residual epilogue takes a plain product: no glu or rms")
        check_tensor("residual", residual.residual, shape=(m, n), dtypes=(x.dtype,), device=x.device)
        check_tensor("residual weight", residual.weight, shape=(n,), dtypes=FLOAT_DTYPES, device=x.device)
        need = blocks * BLOCK_ROWS
        check_tensor("sums", residual.sums, ndim=1, dtypes=(torch.float32,), device=x.device)
        if residual.sums.numel() < need:
            raise ValueError(f"sums holds {residual.sums.numel()} values, the launch writes {need}")
    if rms is None:
        return 0
    check_tensor("sums", rms.sums, ndim=1, dtypes=(torch.float32,), device=x.device)
    if not 1 <= rms.blocks <= rms.sums.numel() // BLOCK_ROWS:
        raise ValueError(f"rms names {rms.blocks} blocks, sums holds {rms.sums.numel() // BLOCK_ROWS}")
    return rms.blocks


def check_rope(rope: RopeEpilogue | None, x: torch.Tensor, n: int, other_fusion: bool) -> int:
    """The RoPE epilogue's contract; returns the head dim (1 without rope)."""
    if rope is None:
        return 1
    if other_fusion:
        raise ValueError("a rope epilogue takes the QKV product itself: no glu or residual")
    if rope.num_heads < 1 or rope.num_kv_heads < 1:
        raise ValueError(f"rope needs heads >= 1, got {rope.num_heads}, {rope.num_kv_heads}")
    rows = rope.num_heads + 2 * rope.num_kv_heads
    if n % rows:
        raise ValueError(f"w has {n} rows, not (num_heads + 2 * num_kv_heads) * head_dim for {rows} heads")
    head_dim = n // rows
    check_head_dim(head_dim)
    check_rope_caches(
        rope.k_cache, rope.v_cache, rope.cos_sin, rope.start, rope.num_kv_heads, head_dim, x.dtype, x.device,
        cos_sin_name="cos_sin", start_name="start",
    )  # fmt: skip
    return head_dim
