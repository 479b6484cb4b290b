"""y = x @ W.T with W stored as INT4 AWQ (kernels/awq_format.py), dequantized on the fly in one launch.

One kernel, two uses. Steps of at most 16 rows (keystroke, decode, small prefill: `awq_skinny`) are a
stream of packed weights, a quarter of bf16's bytes: a program takes BLOCK_N output columns and a share
of K (split-K, reduced in the same launch as kernels/skinny_gemm.py does), so every SM streams. Larger
prefills (`awq_gemm`) tile M too and feed the tensor cores.

A K tile never crosses a quantization group (BLOCK_K divides the group size, and K is a whole number of
groups), so a tile has one zero point and one scale per column, and the dequantization leaves the inner
product: for the tile's rows k of group g,

    sum_k x[m, k] (q[k, n] - z[g, n]) s[g, n] = s[g, n] (sum_k x[m, k] q[k, n] - z[g, n] sum_k x[m, k])

q in 0..15 is exact in bf16/fp16, so tl.dot takes the raw nibbles. Each nibble position of a word is its
own (BLOCK_K, BLOCK_N / 8) operand with its own accumulator (columns 8w + ORDER[i]); the eight are put back
in column order once, at the end. Spreading every word over its eight columns inside the K loop instead
(three tl.interleave, as vLLM's Triton AWQ kernel does) ran at 2-7% of copy bandwidth on the H200.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .awq_format import PACK, dequantize
from .contract import FLOAT_DTYPES, check_out, check_tensor, interpreting
from .pdl import check_pdl, launch_options, pdl_release, pdl_wait
from .skinny_gemm import MAX_M, SkinnyWorkspace
from .split_kv import dot_operands_fp32, dot_precision

MAX_SPLIT = 16  # K shares of a skinny launch; the workspace holds MAX_SPLIT partials of (MAX_M, N)


@dataclass(frozen=True)
class AwqTiles:
    """Tiles of one launch: BLOCK_N a multiple of 8 (whole words), BLOCK_K a divisor of the group size."""

    block_m: int = 16
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _nibble(x, w, zw, srow, x_sum, NIB: tl.constexpr, PRECISION: tl.constexpr):
    """The tile's contribution to columns 8w + ORDER[NIB]: s (sum_k x q - z sum_k x), (BM, WORDS) fp32."""
    COL: tl.constexpr = (NIB % 4) * 2 + NIB // 4  # ORDER: 0 2 4 6 1 3 5 7
    q = ((w >> (4 * NIB)) & 0xF).to(tl.float32).to(x.dtype)  # (BK, WORDS), exact
    z = ((zw >> (4 * NIB)) & 0xF).to(tl.float32)  # (WORDS,)
    s = tl.load(srow + COL).to(tl.float32)  # (WORDS,)
    part = tl.dot(x, q, input_precision=PRECISION)  # (BM, WORDS)
    return (part - x_sum[:, None] * z[None, :]) * s[None, :]


@triton.jit
def _awq_kernel(
    x_ptr,  # (M, K)
    qw_ptr,  # (K, N / 8) int32
    qz_ptr,  # (K / G, N / 8) int32
    s_ptr,  # (K / G, N) fp16
    out_ptr,  # (M, N)
    part_ptr,  # (SPLIT_K, M, N) fp32 partials when SPLIT_K > 1
    count_ptr,  # (cdiv(N, BLOCK_N),) int32, zero between launches, when SPLIT_K > 1
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    group_size,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    WORDS: tl.constexpr = BLOCK_N // 8
    n_blocks = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // n_blocks
    pid_n = tl.program_id(0) % n_blocks
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = pid_n * WORDS + tl.arange(0, WORDS)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    # Words past the last one read the last one again (never stored): W loads stay unmasked.
    rw_safe = tl.minimum(rw, N // 8 - 1)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    pdl_release(PDL)
    pdl_wait(PDL)  # x is the previous kernel's output
    # One accumulator per nibble position i: columns 8w + ORDER[i] of the block's words w.
    a0 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a1 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a2 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a3 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a4 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a5 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a6 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    a7 = tl.zeros((BLOCK_M, WORDS), tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm.to(tl.int64)[:, None] * K + kk[None, :], mask=m_ok[:, None], other=0.0)
        w = tl.load(qw_ptr + kk.to(tl.int64)[:, None] * (N // 8) + rw_safe[None, :])  # (BK, WORDS)
        g = k0 // group_size
        zw = tl.load(qz_ptr + g * (N // 8) + rw_safe)  # (WORDS,)
        srow = s_ptr + g * N + rw_safe * 8  # scales of the words' first columns
        if UPCAST:
            x = x.to(tl.float32)
        x_sum = tl.sum(x.to(tl.float32), axis=1)  # (BM,)
        a0 += _nibble(x, w, zw, srow, x_sum, 0, PRECISION)
        a1 += _nibble(x, w, zw, srow, x_sum, 1, PRECISION)
        a2 += _nibble(x, w, zw, srow, x_sum, 2, PRECISION)
        a3 += _nibble(x, w, zw, srow, x_sum, 3, PRECISION)
        a4 += _nibble(x, w, zw, srow, x_sum, 4, PRECISION)
        a5 += _nibble(x, w, zw, srow, x_sum, 5, PRECISION)
        a6 += _nibble(x, w, zw, srow, x_sum, 6, PRECISION)
        a7 += _nibble(x, w, zw, srow, x_sum, 7, PRECISION)
    # Back to column order: column j = 4 j2 + 2 j1 + j0 of a word is nibble REVERSE_ORDER[j]; joins put
    # j0 innermost, then j1, then j2, so the reshape lays the columns out as 8w + j.
    acc = tl.join(tl.join(tl.join(a0, a2), tl.join(a1, a3)), tl.join(tl.join(a4, a6), tl.join(a5, a7)))
    acc = tl.reshape(acc, (BLOCK_M, BLOCK_N))

    out_off = rm[:, None] * N + rn[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(part_ptr + pid_k * M * N + out_off, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for sh in range(SPLIT_K):  # in split order: deterministic
                total += tl.load(
                    part_ptr + sh * M * N + out_off, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")


def skinny_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> AwqTiles:
    """Tiles for M <= 16: 128-column blocks, K shares until about two programs per SM."""
    if interpreting() or device.type != "cuda":
        return AwqTiles(16, 32, min(32, group), 1, 4, 1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    block_k = min(group, 128)
    blocks = triton.cdiv(n, 128)
    split = max(1, min(MAX_SPLIT, triton.cdiv(2 * sms, blocks), k // block_k))
    return AwqTiles(16, 128, block_k, split, 4, 4)


def gemm_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> AwqTiles:
    """Tiles for a prefill: 128 x 256 output tiles (eight 32-column dots) on the tensor cores, 64-deep K."""
    if interpreting() or device.type != "cuda":
        return AwqTiles(32, 32, min(32, group), 1, 4, 1)
    return AwqTiles(64 if m <= 64 else 128, 256, min(group, 64), 1, 8, 3)


def check_awq(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> int:
    """Shapes and dtypes of one launch; returns the group size."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    k = x.shape[1]
    check_tensor("qweight", qweight, ndim=2, dtypes=(torch.int32,), device=x.device)
    check_tensor("qzeros", qzeros, ndim=2, dtypes=(torch.int32,), device=x.device)
    check_tensor("scales", scales, ndim=2, dtypes=(torch.float16,), device=x.device)
    words = qweight.shape[1]
    groups = scales.shape[0]
    if qweight.shape[0] != k or words < 1:
        raise ValueError(f"qweight {tuple(qweight.shape)} must be ({k}, N/8) for x with {k} columns")
    if groups < 1 or k % groups or tuple(scales.shape) != (groups, words * PACK):
        raise ValueError(f"scales {tuple(scales.shape)} must be (K/group, {words * PACK}) with K = {k}")
    if tuple(qzeros.shape) != (groups, words):
        raise ValueError(f"qzeros {tuple(qzeros.shape)} must be ({groups}, {words})")
    group = k // groups
    if group < 16 or group & (group - 1):
        raise ValueError(f"group size {group} must be a power of two >= 16")
    return group


def _launch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    out: torch.Tensor,
    tiles: AwqTiles,
    workspace: SkinnyWorkspace | None,
    pdl: bool,
) -> torch.Tensor:
    m, k = x.shape
    n = scales.shape[1]
    if tiles.block_n % PACK or tiles.block_n < 16 or tiles.block_n & (tiles.block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {tiles.block_n}")
    if not interpreting() and tiles.block_n < 128:  # tl.dot on the GPU needs N >= 16: 16 words
        raise ValueError(f"block_n must be >= 128 on the GPU, got {tiles.block_n}")
    if tiles.block_k < 16 or group % tiles.block_k:
        raise ValueError(f"block_k {tiles.block_k} must be >= 16 and divide the group size {group}")
    k_per_split = triton.cdiv(triton.cdiv(k, tiles.split_k), tiles.block_k) * tiles.block_k
    split = triton.cdiv(k, k_per_split)  # shares that hold any K at all
    n_blocks = triton.cdiv(n, tiles.block_n)
    m_blocks = triton.cdiv(m, tiles.block_m)
    part, counts = out, out  # never touched without split-K
    if split > 1:
        if m_blocks > 1:
            raise ValueError(f"split-K needs all {m} rows in one block (block_m {tiles.block_m})")
        if workspace is None:
            workspace = SkinnyWorkspace.allocate(n, split, x.device, tiles.block_n)
        if workspace.partials.numel() < split * m * n or workspace.counts.numel() < n_blocks:
            raise ValueError(f"workspace too small for split_k {split}, M {m}, N {n}")
        part, counts = workspace.partials, workspace.counts
    _awq_kernel[(m_blocks * n_blocks, split)](
        x, qweight, qzeros, scales, out, part, counts, m, n, k, k_per_split, group,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SPLIT_K=split,
        UPCAST=dot_operands_fp32(x.dtype), PRECISION=dot_precision(x.dtype), PDL=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **launch_options(pdl),
    )  # fmt: skip
    return out


def awq_skinny(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: AwqTiles | None = None,
    workspace: SkinnyWorkspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x (M, K), M <= 16, times the AWQ matrix (K -> N): (M, N) in x.dtype. Split-K tiles need a
    workspace (one is allocated if none). pdl: launch as a programmatic dependent of the previous kernel."""
    group = check_awq(x, qweight, qzeros, scales)
    m, k = x.shape
    n = scales.shape[1]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x must have 1..{MAX_M} rows (larger M belongs to awq_gemm), got {m}")
    check_pdl(pdl, x.device)
    out = check_out(out, (m, n), x.dtype, x.device)
    tiles = tiles or skinny_tiles(m, n, k, group, x.device)
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
