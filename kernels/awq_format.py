"""AutoAWQ's INT4 "GEMM" layout in plain PyTorch: packing, unpacking and dequantizing.

A linear layer y = x @ W.T with W (out, in) is stored as three tensors, input channels first:

    qweight int32 (in, out / 8)          eight 4-bit weights per word
    qzeros  int32 (in / group, out / 8)  eight 4-bit zero points per word
    scales  fp16  (in / group, out)      one scale per group of `group` input channels and output column

and W.T[k, n] = (q[k, n] - z[k // group, n]) * s[k // group, n]. Within a word, nibble i (bits 4i..4i+3)
holds column 8c + ORDER[i]: AutoAWQ's interleaved order, which its CUDA kernels unpack two columns at a time.
So column 8c + j sits at nibble REVERSE_ORDER[j], shifted by SHIFTS[j] bits.

These functions are the format's definition for the loader, the `quantize` writer and the kernels' `_ref`.
"""

from __future__ import annotations

import torch

BITS = 4
PACK = 32 // BITS  # values per int32 word
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column ORDER[i] of its group of eight
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j sits in nibble REVERSE_ORDER[j]
SHIFTS = tuple(BITS * i for i in REVERSE_ORDER)  # bit offset of column j within its word


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """(rows, cols) integers in 0..15, cols a multiple of 8 -> int32 (rows, cols / 8) in AWQ order."""
    rows, cols = values.shape
    if cols % PACK:
        raise ValueError(f"cannot pack {cols} columns: AWQ packs columns in groups of {PACK}")
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > 15):
        raise ValueError("4-bit values must lie in 0..15")
    v = values.to(torch.int64).view(rows, cols // PACK, PACK)  # (R, C/8, 8) column j of each group
    shifts = torch.tensor(SHIFTS, dtype=torch.int64, device=values.device)
    words = (v << shifts).sum(-1)  # (R, C/8) in 0..2**32-1: disjoint bits, so the sum is an OR
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # same bits as int32


def unpack_int4(words: torch.Tensor) -> torch.Tensor:
    """int32 (rows, cols / 8) -> int32 (rows, cols) in 0..15, columns in natural order."""
    rows, n_words = words.shape
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=words.device)
    # An arithmetic shift of a negative word drags sign bits in from the top; the mask drops them.
    return ((words[:, :, None] >> shifts) & 0xF).view(rows, n_words * PACK)


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """W.T (in, out) in fp32: (q - z) * s, each scale and zero repeated over its group of input rows."""
    k = qweight.shape[0]
    groups = scales.shape[0]
    if not groups or k % groups:
        raise ValueError(f"{k} input rows do not split into {groups} groups")
    group = k // groups
    q = unpack_int4(qweight)  # (K, N)
    z = unpack_int4(qzeros).repeat_interleave(group, dim=0)  # (K, N)
    s = scales.float().repeat_interleave(group, dim=0)  # (K, N)
    return (q - z).float() * s


def quantize_groups(w_t: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric INT4 of W.T (in, out), per group of `group` input rows, as AutoAWQ's
    pseudo-quantizer does: scale = (max - min) / 15, zero = -round(min / scale) clamped to 0..15.

    Returns (q (in, out), zeros (in / group, out), scales fp16 (in / group, out)), q and zeros int32 in
    0..15. Scales are rounded to fp16 before q is computed, so q is what the fp16 scales reproduce best."""
    k, n = w_t.shape
    if k % group:
        raise ValueError(f"{k} input rows are not a multiple of the group size {group}")
    g = w_t.float().reshape(k // group, group, n)  # (G, group, N)
    w_max = g.amax(dim=1)  # (G, N)
    w_min = g.amin(dim=1)
    scales = ((w_max - w_min).clamp(min=1e-5) / 15).to(torch.float16)
    s = scales.float()
    zeros = (-torch.round(w_min / s)).clamp(0, 15)  # (G, N)
    q = (torch.round(g / s[:, None, :]) + zeros[:, None, :]).clamp(0, 15)  # (G, group, N)
    return q.reshape(k, n).to(torch.int32), zeros.to(torch.int32), scales
