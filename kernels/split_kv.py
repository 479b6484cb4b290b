"""Split-KV attention pieces shared by extend_attention and decode_attention.

The key range [0, kv_len) is cut into NUM_SPLITS shares so that a short query (one token, or a keystroke's
few) still occupies every SM: each split runs the online softmax over its share and writes a partial
(normalised output, log2-sum-exp) row; `_combine_kernel` merges them. kv_len lives on the device, so the
shares are computed there: the grid depends only on shapes, never on a position, and a CUDA graph replays
with any length. Splits whose share starts at or past kv_len write nothing and the combine skips them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import interpreting
from .pdl import launch_options, pdl_enter

# Scores are kept in log2 units (exp2 is the native instruction): qk_scale = sm_scale * log2(e).
LOG2E = 1.4426950408889634
# Partial rows of one (token, head) sit in one combine program's registers.
MAX_SPLITS = 64
# Initial running max: finite, so a row whose keys are all masked gets exp2(-inf - m) = 0, not NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def split_range(kv_len, split_id, num_splits, BLOCK_N: tl.constexpr):
    """[lo, hi) of keys for one split; `chunk` is a whole number of tiles so only a tail tile needs masks."""
    kv_len = tl.maximum(kv_len, 1)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split_id * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    return lo, hi, chunk


@triton.jit
def softmax_step(qk, v, m_i, l_i, acc, P_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """One flash-attention update. qk (M, N) fp32 in log2 units, masked keys at -inf; v (N, D)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # p is rounded to the cache dtype as the tensor cores take it, also where v was widened for the
    # interpreter, so both run the same arithmetic.
    pv = tl.dot(p.to(P_DTYPE).to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _combine_kernel(
    part_o_ptr,  # (S, R, D) fp32: each split's normalised output
    part_lse_ptr,  # (S, R) fp32: each split's log2-sum-exp
    out_ptr,  # (R, D), R = tokens * heads
    kv_len_ptr,  # the device position the partial kernels read
    kv_len_offset,  # added to it to give kv_len (the number of new tokens for extend, 0 for decode)
    max_ctx,
    R,
    num_splits,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    kv_len = tl.minimum(tl.load(kv_len_ptr).to(tl.int32) + kv_len_offset, max_ctx)
    _, _, chunk = split_range(kv_len, 0, num_splits, BLOCK_N)
    n_active = tl.cdiv(tl.maximum(kv_len, 1), chunk)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < n_active
    part_row = s.to(tl.int64) * R + row  # (S,)
    lse = tl.load(part_lse_ptr + part_row, mask=s_ok, other=float("-inf"))  # (S,)
    w = tl.exp2(lse - tl.max(lse, 0))  # (S,); skipped splits weigh 0
    d = tl.arange(0, D)
    o = tl.load(part_o_ptr + part_row[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)  # (S, D)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # (D,)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))


def dot_operands_fp32(dtype: torch.dtype) -> bool:
    """Whether the attention kernels widen tl.dot operands to fp32 before the dot.

    On the GPU bf16/fp16 go to the tensor cores as they are. Triton's interpreter keeps bf16 as raw uint16
    and its dot multiplies those bits, so there the operands are widened: exactly, so the CPU tests still
    check the GPU's arithmetic (fp32 sums of products of the stored values)."""
    return interpreting() and dtype != torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 caches are the test/debug path: keep full precision there (tf32 would cost ~1e-3 relative).
    return "ieee" if dtype == torch.float32 else "tf32"


def choose_num_splits(
    programs: int, max_ctx: int, block_n: int, device: torch.device, requested: int | None
) -> int:
    """Splits per (query block, KV head), from shapes only (never from the live length).

    Aim for two programs per SM so a short query still streams the cache at full bandwidth; the interpreter
    runs programs one after another, so there one split is cheapest."""
    limit = min(MAX_SPLITS, triton.cdiv(max_ctx, block_n))
    if requested is not None:
        if not 1 <= requested <= limit:
            raise ValueError(f"num_splits must be in [1, {limit}] for max_ctx {max_ctx}, got {requested}")
        return requested
    if device.type != "cuda" or interpreting():
        return 1
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(limit, triton.cdiv(target, programs)))


def alloc_partials(
    num_splits: int, rows: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, R, D) outputs and (S, R) log2-sum-exps; rows of skipped splits stay unwritten."""
    return (
        torch.empty((num_splits, rows, head_dim), dtype=torch.float32, device=device),
        torch.empty((num_splits, rows), dtype=torch.float32, device=device),
    )


def combine_splits(
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    out: torch.Tensor,
    kv_len_ptr: torch.Tensor,
    kv_len_offset: int,
    max_ctx: int,
    block_n: int,
    pdl: bool = False,
) -> None:
    """out (R, D) from the partials; kv_len_ptr, offset, max_ctx, block_n as the partial kernel had them."""
    num_splits, rows, head_dim = part_o.shape
    _combine_kernel[(rows,)](
        part_o,
        part_lse,
        out,
        kv_len_ptr,
        kv_len_offset,
        max_ctx,
        rows,
        num_splits,
        D=head_dim,
        BLOCK_N=block_n,
        BLOCK_S=triton.next_power_of_2(num_splits),
        num_warps=4,
        PDL=pdl,
        **launch_options(pdl),
    )
