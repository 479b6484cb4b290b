"""Epilogues of the INT4 tensor-core GEMM (kernels/awq_mma.py): the fused layer of kernels/skinny_parts.py
on packed weights. The same contracts (ResidualEpilogue, RmsScale, RopeEpilogue, the SwiGLU) and the same
rounding, on the MMA's result fragments instead of a tile: a lane holds rows r, r + 1 of two columns,
c_lo and c_hi, which the fragment layout pairs (kernels/awq_fragments.py), so the SwiGLU (gate, up) and
RoPE (dims j, j + D/2) happen in the lane that holds both.

One difference: the residual epilogue adds each row's sum of squares into one total per row with atomic
adds (a 16-column tile a warp would leave hundreds of block sums for every program of the next GEMM to
read), so the sums are summed in no fixed order (as the split-K shares already are), and the total must be
zero before the launch: the launch of the GEMM before it zeroes it (`zero`), after its own wait, when the
GEMM that read the total last has completed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import check_tensor
from .rope_store import rotate_store
from .skinny_parts import BLOCK_ROWS, ResidualEpilogue, RmsScale, RopeEpilogue, check_epilogues, check_rope


@triton.jit
def _inv_rms(sums_ptr, r, ok, K, eps):
    """1 / rms of rows r from their totals (.cg: the previous kernel's atomics are in L2)."""
    return tl.rsqrt(tl.load(sums_ptr + r, mask=ok, other=0.0, cache_modifier=".cg") / K + eps)


@triton.jit
def _swiglu(gate, up, out_ptr):
    """silu(gate) * up of the rounded products, rounded once more (kernels/skinny_parts.py's _finish)."""
    g = gate.to(out_ptr.dtype.element_ty).to(tl.float32)
    u = up.to(out_ptr.dtype.element_ty).to(tl.float32)
    return (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty)


@triton.jit
def _residual(v, r, c, ok, N, out_ptr, res_ptr, norm_w_ptr):
    """residual[r, c] += v (rounded as stored); out = the new residual times the norm weight; returns the
    square of the stored residual (0 where masked)."""
    off = r * N + c
    y = v.to(out_ptr.dtype.element_ty).to(tl.float32)  # the projection, rounded as stored
    h = y + tl.load(res_ptr + off, mask=ok, other=0.0).to(tl.float32)
    h_stored = h.to(out_ptr.dtype.element_ty)
    tl.store(res_ptr + off, h_stored, mask=ok)
    hf = tl.where(ok, h_stored.to(tl.float32), 0.0)
    nw = tl.load(norm_w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + off, (hf * nw).to(out_ptr.dtype.element_ty), mask=ok)
    return hf * hf


@triton.jit
def _row_totals(sq0, sq1, sums_ptr, m_base, M, L: tl.constexpr):
    """Add the program's squares of rows m_base + 2t (sq0) and + 2t + 1 (sq1) into the row totals: lane
    w * 32 + 4g + t holds row 2t's, so the sum over (w, g) is one atomic add a row a program."""
    t = tl.arange(0, 4)
    s0 = tl.sum(tl.reshape(sq0, (L // 4, 4)), 0)  # (4,): rows m_base + 2t
    s1 = tl.sum(tl.reshape(sq1, (L // 4, 4)), 0)
    r = m_base + 2 * t
    tl.atomic_add(sums_ptr + r, s0, mask=r < M, sem="relaxed", scope="gpu")
    tl.atomic_add(sums_ptr + r + 1, s1, mask=r + 1 < M, sem="relaxed", scope="gpu")


@triton.jit
def _rope(x1, x2, r, ok, j, head, out_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx,
          H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """Row r's dims j (x1) and j + D/2 (x2) of head `head`: kernels/rope_store.py's rotation and stores."""
    x1 = x1.to(out_ptr.dtype.element_ty).to(tl.float32)  # the projection as stored
    x2 = x2.to(out_ptr.dtype.element_ty).to(tl.float32)
    pos = tl.load(start_ptr).to(tl.int64) + r
    ok = ok & (pos < max_ctx)  # positions past the cache are dropped, as rope_store drops them
    rotate_store(x1, x2, head, j, r, pos, ok, out_ptr, k_ptr, v_ptr, cos_sin_ptr, max_ctx, H, KVH, D)


@triton.jit
def mma_out(v0, v1, v2, v3, m_base, r0, c_lo, c_hi, n_ok, M, N, K, eps, head, out_ptr, sums_ptr, res_ptr,
            norm_w_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, L: tl.constexpr, RMS: tl.constexpr,
            GLU: tl.constexpr, RESIDUAL: tl.constexpr, ROPE: tl.constexpr, H: tl.constexpr,
            KVH: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """A lane's finished sums, fp32: v0 (row r0, column c_lo), v1 (r0 + 1, c_lo), v2 (r0, c_hi), v3
    (r0 + 1, c_hi), r0 = m_base + 2t. Scaled by the rows' 1 / rms (RMS), then stored: the SwiGLU of the
    pair (GLU, out (M, N / 2)), rotated and split into q, k, v (ROPE, out (M, H * D)), as a residual
    epilogue (RESIDUAL), or as they are."""
    r1 = r0 + 1
    ok0 = n_ok & (r0 < M)
    ok1 = n_ok & (r1 < M)
    if RMS:
        inv0 = _inv_rms(sums_ptr, r0, ok0, K, eps)
        inv1 = _inv_rms(sums_ptr, r1, ok1, K, eps)
        v0, v2 = v0 * inv0, v2 * inv0
        v1, v3 = v1 * inv1, v3 * inv1
    if GLU:
        tl.store(out_ptr + r0 * (N // 2) + c_lo, _swiglu(v0, v2, out_ptr), mask=ok0)
        tl.store(out_ptr + r1 * (N // 2) + c_lo, _swiglu(v1, v3, out_ptr), mask=ok1)
    elif ROPE:
        j = c_lo % D
        _rope(v0, v2, r0, ok0, j, head, out_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, H, KVH, D)
        _rope(v1, v3, r1, ok1, j, head, out_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, H, KVH, D)
    elif RESIDUAL:
        sq0 = _residual(v0, r0, c_lo, ok0, N, out_ptr, res_ptr, norm_w_ptr)
        sq0 += _residual(v2, r0, c_hi, ok0, N, out_ptr, res_ptr, norm_w_ptr)
        sq1 = _residual(v1, r1, c_lo, ok1, N, out_ptr, res_ptr, norm_w_ptr)
        sq1 += _residual(v3, r1, c_hi, ok1, N, out_ptr, res_ptr, norm_w_ptr)
        _row_totals(sq0, sq1, sums_ptr, m_base, M, L)
    else:
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + r0 * N + c_lo, v0.to(ty), mask=ok0)
        tl.store(out_ptr + r1 * N + c_lo, v1.to(ty), mask=ok1)
        tl.store(out_ptr + r0 * N + c_hi, v2.to(ty), mask=ok0)
        tl.store(out_ptr + r1 * N + c_hi, v3.to(ty), mask=ok1)


@triton.jit
def zero_totals(zero_ptr, pid_n, pid_k, ZERO: tl.constexpr):
    """Zero the 16 row totals a later residual epilogue adds into (one program stores; after the wait)."""
    if ZERO and (pid_n == 0) & (pid_k == 0):
        tl.store(zero_ptr + tl.arange(0, 16), tl.zeros((16,), tl.float32))


@triton.jit
def share_add(v0, v1, v2, v3, acc_ptr, r0, c_lo, c_hi, n_ok, M, N):
    """A split-K share's sums into the fp32 accumulator (zero before the first share)."""
    ok0 = n_ok & (r0 < M)
    ok1 = n_ok & (r0 + 1 < M)
    tl.atomic_add(acc_ptr + r0 * N + c_lo, v0, mask=ok0, sem="relaxed", scope="gpu")
    tl.atomic_add(acc_ptr + (r0 + 1) * N + c_lo, v1, mask=ok1, sem="relaxed", scope="gpu")
    tl.atomic_add(acc_ptr + r0 * N + c_hi, v2, mask=ok0, sem="relaxed", scope="gpu")
    tl.atomic_add(acc_ptr + (r0 + 1) * N + c_hi, v3, mask=ok1, sem="relaxed", scope="gpu")


@triton.jit
def _take(acc_ptr, off, ok):
    total = tl.load(acc_ptr + off, mask=ok, other=0.0, cache_modifier=".cg")
    tl.store(acc_ptr + off, tl.zeros_like(total), mask=ok)
    return total


@triton.jit
def share_take(acc_ptr, r0, c_lo, c_hi, n_ok, M, N):
    """The last share: the four totals read out of the accumulator, which is left zero for the next launch."""
    ok0 = n_ok & (r0 < M)
    ok1 = n_ok & (r0 + 1 < M)
    v0 = _take(acc_ptr, r0 * N + c_lo, ok0)
    v1 = _take(acc_ptr, (r0 + 1) * N + c_lo, ok1)
    v2 = _take(acc_ptr, r0 * N + c_hi, ok0)
    v3 = _take(acc_ptr, (r0 + 1) * N + c_hi, ok1)
    return v0, v1, v2, v3


def mma_epilogue_args(
    x: torch.Tensor,
    n: int,
    pair: int,
    warps: int,
    residual: ResidualEpilogue | None,
    rms: RmsScale | None,
    glu: bool,
    rope: RopeEpilogue | None,
    zero: torch.Tensor | None,
) -> tuple[tuple[int, int], dict[str, object]]:
    """The epilogues' contract for awq_mma (kernels/skinny_parts.py's, with row totals: `blocks` 1), the
    output's shape and the kernel's arguments for them."""
    m = x.shape[0]
    check_epilogues(x, n, residual, rms, glu, 1)
    if rms is not None and rms.blocks != 1:
        raise ValueError(f"the packed GEMM reads one total a row (blocks 1), not {rms.blocks} blocks")
    head_dim = check_rope(rope, x, n, glu or residual is not None)
    if glu and pair != n // 2:
        raise ValueError(f"glu needs gate and up columns paired (pair {n // 2}), the layout pairs {pair}")
    if rope is not None and (pair != head_dim // 2 or (head_dim // 2) % (8 * warps)):
        half = head_dim // 2
        raise ValueError(f"rope needs dims j and j + {half} paired in one head a program, got pair {pair}")
    if zero is not None:
        check_tensor("zero", zero, ndim=1, dtypes=(torch.float32,), device=x.device)
        if zero.numel() < BLOCK_ROWS:
            raise ValueError(f"zero holds {zero.numel()} row totals, a launch may add {BLOCK_ROWS}")
    shape = (m, n // 2) if glu else (m, rope.num_heads * head_dim) if rope is not None else (m, n)
    dummy = x  # pointers an epilogue does not read
    args: dict[str, object] = {
        "res_ptr": residual.residual if residual else dummy,
        "norm_w_ptr": residual.weight if residual else dummy,
        "sums_ptr": residual.sums if residual else rms.sums if rms else dummy,
        "zero_ptr": zero if zero is not None else dummy,
        "cos_sin_ptr": rope.cos_sin if rope else dummy,
        "start_ptr": rope.start if rope else dummy,
        "k_ptr": rope.k_cache if rope else dummy,
        "v_ptr": rope.v_cache if rope else dummy,
        "max_ctx": rope.k_cache.shape[1] if rope else 1,
        "eps": rms.eps if rms else 0.0,
        "RMS": rms is not None,
        "GLU": glu,
        "RESIDUAL": residual is not None,
        "ROPE": rope is not None,
        "ZERO": zero is not None,
        "H": rope.num_heads if rope else 1,
        "KVH": rope.num_kv_heads if rope else 1,
        "D": head_dim,
    }
    return shape, args
