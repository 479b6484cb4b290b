"""The fragment layout of an INT4 AWQ matrix: AutoAWQ's qweight with its words and nibbles permuted so
that the word a lane of kernels/awq_mma.py loads is its `mma.m16n8k16` A fragment. Same shape and dtype
as qweight (K, N / 8) int32; only the order differs.

A is a 16 (output columns) x 16 (K rows) block of W.T. PTX gives lane 4g + t the A elements
(g, 2t..2t+1), (g + 8, 2t..2t+1), (g, 2t+8..2t+9), (g + 8, 2t+8..2t+9) as four registers of two bf16
(low half the lower k); here register i is nibbles (i, i + 4) of one word. A load is LW = min(4, group / 16)
blocks (one 16-byte load a lane, never across a group), and inside a load the K rows are permuted (the
product does not depend on their order): the MMA's k = 2t, 2t+1, 2t+8, 2t+9 of block j are the load's rows
4 LW t + 4 j + 0..3, so lane t's x values are 4 LW consecutive ones.

Words in memory: (N / 16, K / (16 LW), 32, LW): word j of lane L in load kb of column tile nt. Nibble
rb + 2 (r // 2) + 4 (r % 2) of it is W.T[16 LW kb + 4 LW t + 4 j + r, 16 nt + 8 rb + g], L = 4g + t.
"""

from __future__ import annotations

import torch

from .awq_format import unpack_int4


def load_words(group: int) -> int:
    """Blocks of 16 K rows a lane loads at once: a 16-byte load, never past the end of a group."""
    return min(4, group // 16)


def fragments_fit(k: int, n: int, group: int) -> bool:
    """Whether a (K, N) matrix with this group size has a fragment layout."""
    return k % (16 * load_words(group)) == 0 and n % 16 == 0 and group % 32 == 0


def fragment_pack(qweight: torch.Tensor, group: int, chunk: int = 2048) -> torch.Tensor:
    """AutoAWQ's qweight (K, N / 8) to the fragment layout: int32 of the same shape (only the order of
    the words and nibbles differs, so every shape check still holds). Column tiles are contiguous in the
    layout, so it is built `chunk` columns at a time (the int64 temporaries of a whole 33B matrix would
    take gigabytes)."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    lw = load_words(group)
    if not fragments_fit(k, n, group):
        raise ValueError(f"fragment layout needs K % {16 * lw} == 0 and N % 16 == 0, got K {k}, N {n}")
    rb = torch.arange(2, device=qweight.device).view(2, 1)
    r = torch.arange(4, device=qweight.device).view(1, 4)
    shift = 4 * (rb + 2 * (r // 2) + 4 * (r % 2))  # (rb, r) -> bit of nibble rb + 2 (r // 2) + 4 (r % 2)
    parts = []
    for c0 in range(0, n, chunk):
        c = min(chunk, n - c0)
        q = unpack_int4(qweight[:, c0 // 8 : (c0 + c) // 8]).to(torch.int64)  # (K, c)
        # K = (kb, t, j, r), N = (nt, rb, g): k = 16 LW kb + 4 LW t + 4 j + r, column 16 nt + 8 rb + g.
        q = q.view(k // (16 * lw), 4, lw, 4, c // 16, 2, 8).permute(4, 0, 6, 1, 2, 5, 3)  # (nt,kb,g,t,j,rb,r)
        words = (q << shift).sum(dim=(-1, -2))  # (nt, kb, g, t, j): disjoint bits, so the sum is an OR
        parts.append(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).reshape(-1))
    return torch.cat(parts).reshape(k, n // 8)


def fragment_unpack(packed: torch.Tensor, k: int, n: int, group: int) -> torch.Tensor:
    """The inverse of fragment_pack, to values (K, N) in 0..15 (the test oracle of the layout)."""
    lw = load_words(group)
    w = packed.to(torch.int64).reshape(n // 16, k // (16 * lw), 8, 4, lw, 1, 1)
    rb = torch.arange(2).view(2, 1)
    r = torch.arange(4).view(1, 4)
    nib = rb + 2 * (r // 2) + 4 * (r % 2)
    q = (w >> (4 * nib).to(w.device)) & 0xF  # (nt, kb, g, t, j, rb, r)
    return q.permute(1, 3, 4, 6, 0, 5, 2).reshape(k, n).to(torch.int32)
