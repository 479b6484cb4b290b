"""y = x @ W.T for a handful of rows (M <= 16): the GEMMs of a keystroke, a decode step or a small prefill.

At these M the product is a weight stream: every byte of W (N, K) is read once and used M times, so the
kernel is judged by the fraction of copy bandwidth it reaches, not by FLOPs. Programs take BLOCK_N output
columns (BLOCK_N rows of W) and, where the N blocks alone cannot keep every SM streaming, a share of K
(split-K). Tiles of W are (BLOCK_N, BLOCK_K) with K fastest: 16-byte loads along each weight row, several
stages in flight. x is padded to 16 rows for tl.dot (the tensor cores take M >= 16); its padding rows are
masked loads, so they cost no memory traffic.

Split-K without a second launch: each share writes its fp32 partial to a workspace, then bumps a counter of
its N block; the share that arrives last sums the partials in split order (deterministic) and writes y, and
resets the counter, so a CUDA graph replays with the workspace as it found it.

GLU=True takes W as [gate | up] (2N, K) and writes silu(x @ gate.T) * (x @ up.T) (M, N): a program's tile
of W rows is BLOCK_N / 2 gate rows and the up rows of the same output columns, one stream and one dot as
for any tile; the epilogue splits the product into its halves, rounds each to the output dtype and applies
the SwiGLU as kernels/silu_mul.py does, so the gate/up projection and the SwiGLU are one launch.

A ResidualEpilogue (kernels/skinny_parts.py) adds the product into the residual stream and leaves the
rows' sums of squares per N block; an RmsScale scales the next product by the rows' 1/rms from them: the
residual add + RMSNorm between two projections without a launch and without work in the K loop.
A RopeEpilogue rotates q and k of the QKV product and stores k and v into the KV cache (kernels/
rope_store.py without its launch). Nothing is fused before the K loop: forms that normalised x or applied
the SwiGLU to it there kept Triton from pipelining the weight stream and were slower (docs/kernels.md).

The tiles (SkinnyConfig, default_config), the grid and the split-K workspace are planned on the host in
kernels/skinny_plan.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_out, check_tensor
from .pdl import check_pdl, pdl_release, pdl_wait
from .skinny_parts import (
    BLOCK_ROWS,
    ResidualEpilogue,
    RmsScale,
    RopeEpilogue,
    _tile_out,
    check_epilogues,
    check_rope,
)
from .skinny_plan import SkinnyConfig, SkinnyWorkspace, plan_grid, split_workspace
from .split_kv import dot_launch_options

MAX_M = BLOCK_ROWS  # rows of x a program holds: one tl.dot tile


@triton.jit
def _skinny_kernel(
    x_ptr,  # (M, K)
    w_ptr,  # (N, K)
    out_ptr,  # (M, N), N output columns (W has 2N rows with GLU); with ROPE q (M, H * D)
    part_ptr,  # (SPLIT_K, M, programs * BLOCK_N) fp32 partials by program tile, when SPLIT_K > 1
    count_ptr,  # (programs,) int32, zero between launches, when SPLIT_K > 1
    res_ptr,  # (M, N) residual when RESIDUAL
    norm_w_ptr,  # (N,) the next norm's weight when RESIDUAL
    sums_ptr,  # (blocks, BLOCK_M) fp32 row sums of squares: written when RESIDUAL, read when RMS
    sum_blocks,  # RMS: blocks of the launch that wrote sums_ptr
    cos_sin_ptr,  # ROPE: (max_ctx, D) fp32
    start_ptr,  # ROPE: (1,) position of row 0
    k_ptr,  # ROPE: (KVH, max_ctx, D)
    v_ptr,  # ROPE: (KVH, max_ctx, D)
    max_ctx,
    eps,
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GLU: tl.constexpr,
    RESIDUAL: tl.constexpr,  # ResidualEpilogue
    RMS: tl.constexpr,  # RmsScale
    BLOCK_B: tl.constexpr,  # sum_blocks padded to a power of two
    ROPE: tl.constexpr,  # RopeEpilogue: W is the QKV matrix of H + 2 KVH heads of D rows
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    EVEN_K: tl.constexpr,  # K == SPLIT_K * k_per_split: no K masks
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    r = tl.arange(0, BLOCK_N)  # rows of the W tile
    if GLU:  # the tile's first half is gate rows, its second the up rows of the same output columns
        HALF: tl.constexpr = BLOCK_N // 2
        col = pid_n * HALF + r % HALF
        rn = pid_n * HALF + tl.arange(0, HALF)  # output columns
    elif ROPE:  # dims j..j+P of one head, then the same dims of its second half: the pairs RoPE rotates
        P: tl.constexpr = BLOCK_N // 2
        col = (pid_n // (D // 2 // P)) * D + (pid_n % (D // 2 // P)) * P + r % P + (r // P) * (D // 2)
        rn = col  # unused: the RoPE epilogue addresses q and the caches itself
    else:
        col = pid_n * BLOCK_N + r
        rn = col
    n_ok = rn < N
    # Rows past N read row N-1 again instead of a masked load: the mask would be per row, and a clamped
    # index keeps every W load unmasked along K (the columns past N are never stored).
    w_rows = tl.minimum(col, N - 1)
    if GLU:
        w_rows += (r // HALF) * N
    k_lo = pid_k * k_per_split
    x_row = rm.to(tl.int64)[:, None] * K
    w_row = w_rows.to(tl.int64)[:, None] * K
    pdl_wait(PDL)  # x is the previous kernel's output
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        kk = k_lo + k0 + rk
        if EVEN_K:
            w = tl.load(w_ptr + w_row + kk[None, :])
            x_mask = m_ok[:, None]
        else:
            w = tl.load(w_ptr + w_row + kk[None, :], mask=(kk < K)[None, :], other=0.0)
            x_mask = m_ok[:, None] & (kk < K)[None, :]
        a = tl.load(x_ptr + x_row + kk[None, :], mask=x_mask, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)

    pdl_release(PDL)  # the weight stream is done: the next kernel may launch
    if SPLIT_K > 1:
        # Partials by program tile (BLOCK_N columns a program, in launch order): the last share to arrive
        # sums them in split order and finishes the tile.
        tile_cols = tl.num_programs(0) * BLOCK_N
        part_off = rm[:, None] * tile_cols + (pid_n * BLOCK_N + r)[None, :]
        tl.store(part_ptr + pid_k * M * tile_cols + part_off, acc, mask=m_ok[:, None])
        # Every thread's partial is stored before the one release below makes them visible.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for s in range(SPLIT_K):
                # .cg: from L2, where the other shares' stores are, never a stale L1 line.
                part = part_ptr + s * M * tile_cols + part_off
                acc += tl.load(part, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
            _tile_out(acc, out_ptr, rm, m_ok, rn, n_ok, pid_n, res_ptr, norm_w_ptr, sums_ptr, sum_blocks,
                      cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, N, K, eps, GLU, RESIDUAL, RMS, ROPE,
                      H, KVH, D, BLOCK_M, BLOCK_N, BLOCK_B)  # fmt: skip
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        _tile_out(acc, out_ptr, rm, m_ok, rn, n_ok, pid_n, res_ptr, norm_w_ptr, sums_ptr, sum_blocks,
                  cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, N, K, eps, GLU, RESIDUAL, RMS, ROPE,
                  H, KVH, D, BLOCK_M, BLOCK_N, BLOCK_B)  # fmt: skip


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    workspace: SkinnyWorkspace | None = None,
    pdl: bool = False,
    glu: bool = False,
    residual: ResidualEpilogue | None = None,
    rms: RmsScale | None = None,
    rope: RopeEpilogue | None = None,
) -> torch.Tensor:
    """x (M, K) @ w (N, K).T -> (M, N) in x.dtype, M <= 16. With glu, w is [gate | up] (2N, K) and the
    result (M, N) is silu(x @ gate.T) * (x @ up.T); with residual, y is added to residual.residual in place
    and the result is the new residual * residual.weight; with rms, the product is scaled by the rows'
    1 / rms from the sums such a launch wrote; with rope, w is the QKV matrix, k and v go to the caches and
    the result is the rotated q (M, H * D) (kernels/skinny_parts.py). Split-K configs need a workspace (one
    is allocated if none). pdl: launch as a programmatic dependent of the previous kernel (kernels/pdl.py)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("w", w, ndim=2, dtypes=(x.dtype,), device=x.device)
    m, width = x.shape
    n, k = w.shape
    if glu:
        if n % 2:
            raise ValueError(f"glu takes w as [gate | up] with an even row count; w has {n} rows")
        n //= 2  # output columns; a program's tile takes BLOCK_N / 2 rows of each half
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x must have 1..{MAX_M} rows (larger M belongs to a tiled GEMM), got {m}")
    if width != k:
        raise ValueError(f"x has {width} columns, w {k}: they must match")
    if n < 1 or k < 1:
        raise ValueError(f"w must be non-empty, got shape {tuple(w.shape)}")
    head_dim = check_rope(rope, x, n, glu or residual is not None)
    out_cols = rope.num_heads * head_dim if rope else n
    out = check_out(out, (m, out_cols), x.dtype, x.device)
    check_pdl(pdl, x.device)
    grid = plan_grid(m, n, k, x.device, config, glu, head_dim if rope else None)
    cfg, split = grid.config, grid.split
    sum_blocks = check_epilogues(x, n, residual, rms, glu, grid.blocks)
    if split > 1:
        workspace = split_workspace(workspace, grid, m, n, x.device)
        part, counts = workspace.partials, workspace.counts
    else:
        part, counts = out, out  # never touched without split-K
    _skinny_kernel[(grid.blocks, split)](
        x,
        w,
        out,
        part,
        counts,
        *((residual.residual, residual.weight) if residual else (x, x)),
        residual.sums if residual else rms.sums if rms else part,
        sum_blocks,
        *((rope.cos_sin, rope.start, rope.k_cache, rope.v_cache) if rope else (part, part, out, out)),
        rope.k_cache.shape[1] if rope else 0,
        rms.eps if rms else 0.0,
        m,
        n,
        k,
        grid.k_per_split,
        BLOCK_M=MAX_M,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split,
        GLU=glu,
        RESIDUAL=residual is not None,
        RMS=rms is not None,
        BLOCK_B=triton.next_power_of_2(max(sum_blocks, 1)),
        ROPE=rope is not None,
        H=rope.num_heads if rope else 1,
        KVH=rope.num_kv_heads if rope else 1,
        D=head_dim,
        EVEN_K=split * grid.k_per_split == k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **dot_launch_options(x.dtype, pdl),
    )
    return out


def skinny_gemm_ref(x: torch.Tensor, w: torch.Tensor, glu: bool = False) -> torch.Tensor:
    """Plain PyTorch, fp32 products and sums, one rounding (the test oracle); glu: then silu(gate) * up in
    fp32 and a second rounding, as kernels/silu_mul.py."""
    y = (x.float() @ w.float().T).to(x.dtype)
    if glu:
        gate, up = y.float().chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return y
