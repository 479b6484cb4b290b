"""Rotary embedding of q and k straight out of the fused QKV projection, with k and v stored into one
slot's KV cache in the same pass (instead of a rope pass plus two copies).

Convention: Hugging Face Llama's rotate_half (the two halves of a head pair up, not interleaved lanes):
out[:D/2] = x1 cos - x2 sin, out[D/2:] = x2 cos + x1 sin. The start position is read on the device so a
CUDA graph captured once replays at any position. qkv may be the GEMM's split-K sums (kernels/split_sums.py),
taken as they are read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_head_dim, check_out, check_position, check_tensor
from .pdl import check_pdl, launch_options, pdl_enter
from .reference import rope_cos_sin as rope_cos_sin  # the one table; re-exported for the launchers' callers
from .split_sums import SplitSums, sums_or_tensor, take

# Tokens per program: a (16, D/2) tile per half-head, a few KB in flight.
_MAX_BLOCK_T = 16


@triton.jit
def _rope_store_kernel(
    qkv_ptr,  # (T, (H + 2 KVH) * D): q heads, then k heads, then v heads; fp32 totals to take when SUMS
    cos_sin_ptr,  # (max_ctx, D) fp32: cos in [0, D/2), sin in [D/2, D)
    start_ptr,  # (1,) position of token 0
    q_ptr,  # (T, H, D) out
    k_ptr,  # (KVH, max_ctx, D)
    v_ptr,  # (KVH, max_ctx, D)
    T,
    max_ctx,
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
    SUMS: tl.constexpr,
):
    pdl_enter(PDL)
    head = tl.program_id(1)  # over the H + 2 KVH heads of the qkv row
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
    half = tl.arange(0, D // 2)
    pos = tl.load(start_ptr).to(tl.int64) + t
    # Positions past the cache are dropped: the host cannot see start, and a write there would land in
    # another head's (or slot's) rows.
    ok = ((t < T) & (pos < max_ctx))[:, None]
    src = t.to(tl.int64)[:, None] * ((H + 2 * KVH) * D) + head * D + half[None, :]
    # Sums are taken for every row, stored or not: the accumulator must be left zero.
    row_ok = ok
    if SUMS:
        row_ok = (t < T)[:, None]
    x1 = take(qkv_ptr, src, row_ok, SUMS, q_ptr.dtype.element_ty)  # (BLOCK_T, D/2)
    x2 = take(qkv_ptr, src + D // 2, row_ok, SUMS, q_ptr.dtype.element_ty)
    rotate_store(x1, x2, head, half, t, pos, ok, q_ptr, k_ptr, v_ptr, cos_sin_ptr, max_ctx, H, KVH, D)


@triton.jit
def rotate_store(x1, x2, head, j, t, pos, ok, q_ptr, k_ptr, v_ptr, cos_sin_ptr, max_ctx,
                 H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """Dims j of head `head` (x1) and the same dims of its second half (x2), fp32 (rows t, positions pos):
    rotated when the head is a q or k head, then stored to q (T, H, D) or to the k or v cache. Also the
    QKV GEMM's RoPE epilogue (kernels/skinny_parts.py)."""
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
        dst = q_ptr + t.to(tl.int64)[:, None] * (H * D) + head * D + j[None, :]
    elif head < H + KVH:
        dst = k_ptr + (head - H).to(tl.int64) * max_ctx * D + pos[:, None] * D + j[None, :]
    else:
        dst = v_ptr + (head - H - KVH).to(tl.int64) * max_ctx * D + pos[:, None] * D + j[None, :]
    tl.store(dst, y1.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, y2.to(q_ptr.dtype.element_ty), mask=ok)


def rope_store(
    qkv: torch.Tensor | SplitSums,
    cos_sin_cache: torch.Tensor,
    positions_start: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Rotate q and k of qkv (T, (H + 2 KVH) * D) for positions start..start+T-1; write rotated k and raw v
    to k_cache/v_cache (KVH, max_ctx, D) at those positions; return rotated q (T, H, D) in qkv.dtype.

    cos_sin_cache: (>= max_ctx, D) fp32 from rope_cos_sin. positions_start: 1-element int32/int64 device
    tensor; the caller keeps start + T <= max_ctx (rows past the cache are not written). Split-K sums
    are taken (left zero)."""
    src, dtype = sums_or_tensor("qkv", qkv, 2, FLOAT_DTYPES)
    n_tok = src.shape[0]
    if num_heads < 1 or num_kv_heads < 1:
        raise ValueError(f"num_heads and num_kv_heads must be >= 1, got {num_heads}, {num_kv_heads}")
    n_rows = num_heads + 2 * num_kv_heads
    if src.shape[1] % n_rows:
        raise ValueError(f"qkv width {src.shape[1]} is not (num_heads + 2 * num_kv_heads) * head_dim")
    head_dim = src.shape[1] // n_rows
    check_head_dim(head_dim)
    max_ctx = check_rope_caches(
        k_cache, v_cache, cos_sin_cache, positions_start, num_kv_heads, head_dim, dtype, src.device
    )
    out = check_out(out, (n_tok, num_heads, head_dim), dtype, src.device)
    check_pdl(pdl, src.device)
    if n_tok == 0:
        return out
    block_t = min(_MAX_BLOCK_T, triton.next_power_of_2(n_tok))
    _rope_store_kernel[(triton.cdiv(n_tok, block_t), n_rows)](
        src,
        cos_sin_cache,
        positions_start,
        out,
        k_cache,
        v_cache,
        n_tok,
        max_ctx,
        H=num_heads,
        KVH=num_kv_heads,
        D=head_dim,
        BLOCK_T=block_t,
        num_warps=4,
        PDL=pdl,
        SUMS=isinstance(qkv, SplitSums),
        **launch_options(pdl),
    )
    return out


def check_rope_caches(
    k_cache: object,
    v_cache: object,
    cos_sin: object,
    start: object,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    cos_sin_name: str = "cos_sin_cache",
    start_name: str = "positions_start",
) -> int:
    """The contract shared with the QKV GEMM's RoPE epilogue (kernels/skinny_parts.py): one slot's caches
    (KVH, max_ctx, D) in dtype, the (>= max_ctx, D) fp32 cos/sin table and the device start position, named
    as the caller names them. Returns max_ctx."""
    k_cache = check_tensor("k_cache", k_cache, ndim=3, dtypes=(dtype,), device=device)
    max_ctx = k_cache.shape[1]
    if k_cache.shape != (num_kv_heads, max_ctx, head_dim):
        raise ValueError(f"k_cache must be ({num_kv_heads}, max_ctx, {head_dim}), got {tuple(k_cache.shape)}")
    check_tensor("v_cache", v_cache, shape=tuple(k_cache.shape), dtypes=(dtype,), device=device)
    cos_sin = check_tensor(cos_sin_name, cos_sin, ndim=2, dtypes=(torch.float32,), device=device)
    if cos_sin.shape[0] < max_ctx or cos_sin.shape[1] != head_dim:
        raise ValueError(f"{cos_sin_name} must be (>= {max_ctx}, {head_dim}), got {tuple(cos_sin.shape)}")
    check_position(start_name, start, device)
    return max_ctx


def rope_store_ref(
    qkv: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions_start: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """Plain PyTorch, fp32 rotation rounded once (the test oracle); writes the caches like the kernel."""
    n_tok = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    start = int(positions_start.item())
    heads = qkv.view(n_tok, -1, head_dim)  # (T, H + 2 KVH, D)
    q, k, v = heads.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    cos, sin = cos_sin_cache[start : start + n_tok].float().chunk(2, dim=-1)  # (T, D/2) each
    cos = torch.cat((cos, cos), -1)[:, None, :]  # (T, 1, D)
    sin = torch.cat((sin, sin), -1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x1, x2 = x.chunk(2, dim=-1)
        return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(qkv.dtype)

    k_cache[:, start : start + n_tok] = rotate(k).transpose(0, 1)  # (KVH, T, D)
    v_cache[:, start : start + n_tok] = v.transpose(0, 1)
    return rotate(q)
