"""Split-KV attention pieces shared by extend_attention, extend_prefill and decode_attention: the device
helpers of their kernels (key shares, partial rows and their merge), the combine kernel, and the host side
(the launchers' common checks and options, split counts, partials). The online softmax itself is in
online_softmax.py.

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

from .contract import check_head_dim, check_kv_caches, check_out, check_position, interpreting
from .pdl import check_pdl, launch_options, pdl_enter

# Partial rows of one (token, head) sit in one combine program's registers.
MAX_SPLITS = 64


@triton.jit
def split_range(kv_len, split_id, num_splits, BLOCK_N: tl.constexpr):
    """[lo, hi) of keys for one split; `chunk` is a whole number of tiles so only a tail tile needs masks."""
    kv_len = tl.maximum(kv_len, 1)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split_id * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    return lo, hi, chunk


@triton.jit
def store_partial(part_o_ptr, part_lse_ptr, part_row, o, m_i, l_i, row_ok, D: tl.constexpr):
    """One split's rows part_row (M,) of the partials: the normalised output o (M, D) and its log2-sum-exp."""
    d = tl.arange(0, D)
    tl.store(part_o_ptr + part_row[:, None] * D + d[None, :], o, mask=row_ok[:, None])
    tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def merge_partials(part_o_ptr, part_lse_ptr, row, R, s_ok, D: tl.constexpr, BLOCK_S: tl.constexpr,
                   CACHE: tl.constexpr):  # fmt: skip
    """Row `row` of R merged from the partials of the splits in s_ok (BLOCK_S,), the ones whose share starts
    below kv_len: (D,) fp32, all loads in flight at once; CACHE: the loads' cache modifier."""
    part_row = tl.arange(0, BLOCK_S).to(tl.int64) * R + row  # (S,)
    lse = tl.load(part_lse_ptr + part_row, mask=s_ok, other=float("-inf"), cache_modifier=CACHE)  # (S,)
    w = tl.exp2(lse - tl.max(lse, 0))  # (S,); skipped splits weigh 0
    d = tl.arange(0, D)
    o = tl.load(
        part_o_ptr + part_row[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0, cache_modifier=CACHE
    )  # (S, D)
    return tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # (D,)


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
    s_ok = tl.arange(0, BLOCK_S) < n_active
    out = merge_partials(part_o_ptr, part_lse_ptr, row, R, s_ok, D, BLOCK_S, "")
    tl.store(out_ptr + row * D + tl.arange(0, D), out.to(out_ptr.dtype.element_ty))


def dot_operands_fp32(dtype: torch.dtype) -> bool:
    """Whether the attention kernels widen tl.dot operands to fp32 before the dot.

    On the GPU bf16/fp16 go to the tensor cores as they are. Triton's interpreter keeps bf16 as raw uint16
    and its dot multiplies those bits, so there the operands are widened: exactly, so the CPU tests still
    check the GPU's arithmetic (fp32 sums of products of the stored values)."""
    return interpreting() and dtype != torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 caches are the test/debug path: keep full precision there (tf32 would cost ~1e-3 relative).
    return "ieee" if dtype == torch.float32 else "tf32"


def check_attention(
    q: torch.Tensor,
    k_cache: object,
    v_cache: object,
    position_name: str,
    position: object,
    out: torch.Tensor | None,
    pdl: bool,
    n_tok: int | None = None,
) -> tuple[int, int, torch.Tensor]:
    """The attention launchers' common contract, once q itself is checked: its head dim, one slot's caches,
    n_tok in 1..max_ctx (when given), the device position, `out` and pdl. Returns (KVH, max_ctx, out)."""
    n_heads, head_dim = q.shape[-2:]
    check_head_dim(head_dim)
    n_kv, max_ctx = check_kv_caches(k_cache, v_cache, q, n_heads, head_dim)
    if n_tok is not None and not 1 <= n_tok <= max_ctx:
        raise ValueError(f"q must hold 1..max_ctx ({max_ctx}) tokens, got {n_tok}")
    check_position(position_name, position, q.device)
    out = check_out(out, tuple(q.shape), q.dtype, q.device)
    check_pdl(pdl, q.device)
    return n_kv, max_ctx, out


def dot_launch_options(dtype: torch.dtype, pdl: bool) -> dict[str, object]:
    """The options of a launch whose kernel takes UPCAST, PRECISION and PDL (the attention kernels, the
    skinny GEMM): its dot operands and precision for this dtype, and PDL."""
    return {
        "UPCAST": dot_operands_fp32(dtype),
        "PRECISION": dot_precision(dtype),
        "PDL": pdl,
        **launch_options(pdl),
    }


def choose_num_splits(
    programs: int, max_ctx: int, block_n: int, device: torch.device, requested: int | None
) -> int:
    """Splits per (query block, KV head), from shapes only (never from the live length).

    Aim for two programs per SM so a short query still streams the cache at full bandwidth; the interpreter
    runs programs one after another, so there one split is cheapest."""
    limit = min(MAX_SPLITS, int(triton.cdiv(max_ctx, block_n)))
    if requested is not None:
        if not 1 <= requested <= limit:
            raise ValueError(f"num_splits must be in [1, {limit}] for max_ctx {max_ctx}, got {requested}")
        return requested
    if device.type != "cuda" or interpreting():
        return 1
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(limit, int(triton.cdiv(target, programs))))


def alloc_partials(
    num_splits: int, rows: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, R, D) outputs and (S, R) log2-sum-exps; rows of skipped splits stay unwritten."""
    return (
        torch.empty((num_splits, rows, head_dim), dtype=torch.float32, device=device),
        torch.empty((num_splits, rows), dtype=torch.float32, device=device),
    )


def partials_or_out(num_splits: int, rows: int, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The partials of a split launch; without splits the kernel writes `out` directly and never touches the
    partial pointers, so `out` stands in for them."""
    if num_splits == 1:
        return out, out
    return alloc_partials(num_splits, rows, out.shape[-1], out.device)


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
