"""y = x @ W.T for steps of more than 16 rows (a line, a paste, a prompt) with W INT4 AWQ in the fragment
layout (kernels/awq_fragments.py), dequantized tile by tile on the way to the tensor cores.

Until this kernel a step of more than 16 rows wrote each layer matrix out in bf16 (kernels/awq_dequant.py)
and handed it to cuBLAS: 2.5 bytes moved per weight on every step whatever its rows, which at 256 rows
made the INT4 model's step 1.5-1.7x slower than bf16's (docs/awq.md). Here a program owns BLOCK_M rows of
x and TILES 16-column tiles of W and walks K one load (16 LW rows, kernels/awq_fragments.py) at a time:
the packed words of the load are read once, unpacked in registers (the shift and mask of
`fragment_dequant`, the same permutation back to (k, n) order) and multiplied with `tl.dot` on the x
tile of the same K rows; programs of one column tile and consecutive row tiles are launched together,
so the weights come from HBM once and from L2 for the other row tiles.

Two ways to apply the group's scale and zero (`PrefillTiles.scale_after`):

- off: each weight becomes (q - z) s rounded to x's dtype before the MMA: the very values
  `fragment_dequant` writes for cuBLAS, so the product matches that path up to the order of the sums.
- on: the MMA takes q itself (0..15, exact in bf16) and each group ends with
  acc += s (D - z X), D = x . q over the group, X = sum of x over the group (fp32): two instructions
  less a weight, and no rounding of the dequantized weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .awq_fragments import fragments_fit, load_words
from .awq_gemm import check_awq
from .contract import check_out

PREFILL_MIN_M = 17  # below: kernels/awq_mma.py (skinny steps)


@dataclass(frozen=True)
class PrefillTiles:
    """block_m rows of x and 16 * tiles columns a program; loads of 16 LW K rows."""

    block_m: int = 64
    tiles: int = 8
    num_warps: int = 4
    num_stages: int = 3
    scale_after: bool = False
    group_m: int = 8  # row tiles launched next to each other on one column tile (L2 reuse of its weights)
    nk: bool = False  # the weight tile as the MMA's A operand (registers), x.T as B


@triton.jit
def _offsets(pid_n, kb, K, LW: tl.constexpr, TILES: tl.constexpr):
    """Word offsets of load kb for TILES column tiles, as (tile g) and (t j) parts: word j of lane
    4g + t of load kb of a tile is at tile * 2K + kb * 32 LW + 4 LW g + LW t + j."""
    i = tl.arange(0, TILES * 8)  # (tile, g)
    off_n = (pid_n * TILES + i // 8) * (2 * K) + kb * (32 * LW) + (i % 8) * (4 * LW)
    return off_n, tl.arange(0, 4 * LW)


@triton.jit
def _tile_nk(qp_ptr, pid_n, kb, K, LW: tl.constexpr, TILES: tl.constexpr):
    """Load kb's values 0..15 as a (16 TILES, 16 LW) tile in (tile g rb, t j r) order. Nibble
    rb + 2 (r // 2) + 4 (r % 2) of a word is K row r of its four and column 8 rb + g of its tile: a
    broadcast and a reshape, no permutation."""
    off_n, off_k = _offsets(pid_n, kb, K, LW, TILES)
    w = tl.load(qp_ptr + off_n[:, None] + off_k[None, :])  # (tile g, t j)
    rb = tl.arange(0, 2)[:, None, None]
    r = tl.arange(0, 4)[None, None, :]
    shift = 4 * (rb + 2 * (r // 2) + 4 * (r % 2))  # (rb, 1, r)
    q = (w[:, None, :, None] >> shift[None, :, :, :]) & 0xF  # (tile g, rb, t j, r)
    return tl.reshape(q, (16 * TILES, 16 * LW))


@triton.jit
def _tile_kn(qp_ptr, pid_n, kb, K, LW: tl.constexpr, TILES: tl.constexpr):
    """_tile_nk's transpose, (16 LW, 16 TILES) in (t j r, tile g rb) order, built the same way."""
    off_n, off_k = _offsets(pid_n, kb, K, LW, TILES)
    w = tl.load(qp_ptr + off_k[:, None] + off_n[None, :])  # (t j, tile g)
    r = tl.arange(0, 4)[:, None, None]
    rb = tl.arange(0, 2)[None, None, :]
    shift = 4 * (rb + 2 * (r // 2) + 4 * (r % 2))  # (r, 1, rb)
    q = (w[:, None, :, None] >> shift[None, :, :, :]) & 0xF  # (t j, r, tile g, rb)
    return tl.reshape(q, (16 * LW, 16 * TILES))


@triton.jit
def _prefill_kernel(
    x_ptr,  # (M, K)
    qp_ptr,  # fragment layout
    qz_ptr,  # (K / GROUP, N / 8) int32, AutoAWQ's nibble order
    s_ptr,  # (K / GROUP, N) fp16
    y_ptr,  # (M, N)
    M,
    N,  # runtime: one compiled kernel serves every matrix of a model (Triton specializes on N % 16)
    K,
    GROUP: tl.constexpr,
    LW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILES: tl.constexpr,
    GROUP_M: tl.constexpr,
    SCALE_AFTER: tl.constexpr,
    NK: tl.constexpr,
):
    """NK: the MMA's A operand is the weight tile (N rows, K columns: unpacked in registers) and B is x.T;
    else A is x and B the weight tile's transpose. Either way the tile's columns of W come in the order
    (tile, g, rb): column 16 tile + 8 rb + g, which only the scales, zeros and the store see."""
    ROWS: tl.constexpr = 16 * LW
    BLOCK_N: tl.constexpr = 16 * TILES
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    # Programs in bands of GROUP_M row tiles: inside a band, consecutive programs share a column tile.
    per_band = GROUP_M * (N // BLOCK_N)
    band = pid // per_band
    first_m = band * GROUP_M
    band_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_band) % band_m
    pid_n = (pid % per_band) // band_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    p = tl.arange(0, BLOCK_N)
    rn = pid_n * BLOCK_N + (p // 16) * 16 + (p % 2) * 8 + (p // 2) % 8  # (tile, g, rb) order
    rk = tl.arange(0, ROWS)
    z_shift = ((rn % 8) // 2) * 4 + (rn % 2) * 16  # column n's nibble in a word of qzeros
    if NK:
        x_tile = x_ptr + rm.to(tl.int64)[None, :] * K + rk[:, None]  # (ROWS, BLOCK_M): x.T
        x_ok = m_ok[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        x_tile = x_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]  # (BLOCK_M, ROWS)
        x_ok = m_ok[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SCALE_AFTER:
        PER_GROUP: tl.constexpr = GROUP // ROWS
        for grp in range(0, K // GROUP):
            s = tl.load(s_ptr + grp * N + rn).to(tl.float32)
            z = ((tl.load(qz_ptr + grp * (N // 8) + rn // 8) >> z_shift) & 0xF).to(tl.float32)
            d = tl.zeros_like(acc)
            if NK:
                xs = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for i in tl.static_range(PER_GROUP):
                    kb = grp * PER_GROUP + i
                    b = tl.load(x_tile + kb * ROWS, mask=x_ok, other=0.0)
                    q = _tile_nk(qp_ptr, pid_n, kb, K, LW, TILES)
                    d = tl.dot(q.to(x_ptr.dtype.element_ty), b, d)
                    xs += tl.sum(b.to(tl.float32), axis=0)
                acc += s[:, None] * (d - z[:, None] * xs[None, :])
            else:
                xs = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for i in tl.static_range(PER_GROUP):
                    kb = grp * PER_GROUP + i
                    a = tl.load(x_tile + kb * ROWS, mask=x_ok, other=0.0)
                    q = _tile_kn(qp_ptr, pid_n, kb, K, LW, TILES)
                    d = tl.dot(a, q.to(x_ptr.dtype.element_ty), d)
                    xs += tl.sum(a.to(tl.float32), axis=1)
                acc += s[None, :] * (d - z[None, :] * xs[:, None])
    else:
        for kb in range(0, K // ROWS):
            grp = kb * ROWS // GROUP  # a load never crosses a group
            s = tl.load(s_ptr + grp * N + rn).to(tl.float32)
            z = (tl.load(qz_ptr + grp * (N // 8) + rn // 8) >> z_shift) & 0xF
            xk = tl.load(x_tile + kb * ROWS, mask=x_ok, other=0.0)
            if NK:
                q = _tile_nk(qp_ptr, pid_n, kb, K, LW, TILES)
                w = ((q - z[:, None]).to(tl.float32) * s[:, None]).to(x_ptr.dtype.element_ty)
                acc = tl.dot(w, xk, acc)
            else:
                q = _tile_kn(qp_ptr, pid_n, kb, K, LW, TILES)
                w = ((q - z[None, :]).to(tl.float32) * s[None, :]).to(x_ptr.dtype.element_ty)
                acc = tl.dot(xk, w, acc)
    y = acc.to(y_ptr.dtype.element_ty)
    if NK:
        tl.store(y_ptr + rm.to(tl.int64)[None, :] * N + rn[:, None], y, mask=x_ok)
    else:
        tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], y, mask=x_ok)


def prefill_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> PrefillTiles:
    """The default tiles: the widest column tiles that divide N (measured on the H200, docs/awq.md)."""
    del k, group, device
    tiles = next(c for c in (8, 4, 2, 1) if (n // 16) % c == 0)
    return PrefillTiles(block_m=64 if m <= 64 else 128, tiles=tiles, num_warps=4 if m <= 64 else 8)


def fragment_gemm(
    x: torch.Tensor,
    fragments: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: PrefillTiles | None = None,
) -> torch.Tensor:
    """x (M, K), any M >= 1 (meant for M > 16), times the AWQ matrix in the fragment layout
    (fragment_pack's words viewed as (K, N / 8)): (M, N) in x's dtype."""
    group = check_awq(x, fragments, qzeros, scales)
    m, k = x.shape
    n = scales.shape[1]
    if not fragments_fit(k, n, group):
        raise ValueError(f"({k}, {n}) with group {group} has no fragment layout")
    if m < 1:
        raise ValueError("x must have at least one row")
    out = check_out(out, (m, n), x.dtype, x.device)
    tiles = tiles or prefill_tiles(m, n, k, group, x.device)
    if (n // 16) % tiles.tiles:
        raise ValueError(f"{tiles.tiles} column tiles a program must divide the {n // 16} of N = {n}")
    lw = load_words(group)
    if tiles.scale_after and group % (16 * lw):
        raise ValueError(f"group {group} is not a whole number of {16 * lw}-row loads")
    grid = (triton.cdiv(m, tiles.block_m) * (n // (16 * tiles.tiles)),)
    _prefill_kernel[grid](
        x, fragments, qzeros, scales, out, m,
        N=n, K=k, GROUP=group, LW=lw, BLOCK_M=tiles.block_m, TILES=tiles.tiles, GROUP_M=tiles.group_m,
        SCALE_AFTER=tiles.scale_after, NK=tiles.nk, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out
