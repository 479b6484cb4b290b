"""Triton pieces shared by the INT4 AWQ kernels (kernels/awq_gemv.py, awq_gemm.py, awq_mma.py and
awq_dequant.py): zeroed accumulators, row loads of packed words, a column's bit offset in its word, the unit
values 1 + q/16 of nibbles, the per-group zero and scale term, and the split-K epilogue of the kernels on
AutoAWQ's layout (gemv and gemm)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def zeros4(SHAPE: tl.constexpr):
    """Four fp32 accumulators of SHAPE, zero."""
    return (tl.zeros(SHAPE, tl.float32), tl.zeros(SHAPE, tl.float32), tl.zeros(SHAPE, tl.float32),
            tl.zeros(SHAPE, tl.float32))  # fmt: skip


@triton.jit
def word_rows(qw_ptr, rows, rw, words, w_ok):
    """Words rw of qweight rows `rows` (K indices): (rows, words) int32, zero past the last word."""
    return tl.load(qw_ptr + rows.to(tl.int64)[:, None] * words + rw[None, :], mask=w_ok[None, :], other=0)


@triton.jit
def column_shift(j):
    """Bit offset of column j (0..7) of a word: SHIFTS, column j sits in nibble 0 4 1 5 2 6 3 7."""
    return (j // 2) * 4 + (j % 2) * 16


@triton.jit
def nibble_unit(w, NIB: tl.constexpr, POS: tl.constexpr):
    """Bits of nibble NIB of each word moved to bits POS..POS+3 (everything else zero): one shift."""
    if 4 * NIB >= POS:
        return (w >> (4 * NIB - POS)) & (0xF << POS)
    return (w << (POS - 4 * NIB)) & (0xF << POS)


@triton.jit
def unit_value(w, NIB: tl.constexpr, KIND: tl.constexpr):
    """1 + q/16 for nibble NIB of each word in the dtype KIND (0 fp32, 1 bf16, 2 fp16), exactly: q under
    the exponent of 1.0."""
    if KIND == 1:  # bf16 1.0 = 0x3F80, 7 mantissa bits
        v = (nibble_unit(w, NIB, 3) | 0x3F80).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif KIND == 2:  # fp16 1.0 = 0x3C00, 10 mantissa bits
        v = (nibble_unit(w, NIB, 6) | 0x3C00).to(tl.int16).to(tl.float16, bitcast=True)
    else:  # fp32 1.0 = 0x3F800000, 23 mantissa bits
        v = (nibble_unit(w, NIB, 19) | 0x3F800000).to(tl.float32, bitcast=True)
    return v


@triton.jit
def _zero_scale(zw, srow, ok, NIB: tl.constexpr):
    """Zero point and scale, (WORDS,) fp32 each, of the columns of nibble NIB: once per group."""
    COL: tl.constexpr = (NIB % 4) * 2 + NIB // 4  # ORDER: 0 2 4 6 1 3 5 7
    z = ((zw >> (4 * NIB)) & 0xF).to(tl.float32)
    s = tl.load(srow + COL, mask=ok, other=0.0).to(tl.float32)
    return z, s


@triton.jit
def group_term(d, xs, zw, srow, ok, NIB: tl.constexpr):
    """s (16 D - (16 + z) X) for the columns of nibble NIB: (BM, WORDS) fp32 from D (BM, WORDS), X (BM,)."""
    z, s = _zero_scale(zw, srow, ok, NIB)
    return s[None, :] * (16.0 * d - (16.0 + z)[None, :] * xs[:, None])


@triton.jit
def group_term1(d, xs, zw, srow, ok, NIB: tl.constexpr):
    """group_term for one row: D (WORDS,), X a scalar."""
    z, s = _zero_scale(zw, srow, ok, NIB)
    return s * (16.0 * d - (16.0 + z) * xs)


@triton.jit
def finish(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, M, N,
           BLOCK_M: tl.constexpr, WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
           ATOMIC: tl.constexpr = False):  # fmt: skip
    """Put the eight nibble accumulators back in column order and store y, or the split-K partial and,
    for the last share to arrive, the sum of all partials in split order. ATOMIC: part_ptr is one zeroed
    fp32 (M, N) that every share adds into; the last share reads it out and zeroes it again."""
    # Column j = 4 j2 + 2 j1 + j0 of a word is nibble REVERSE_ORDER[j]; joins put j0 innermost, then j1,
    # then j2, so the reshape lays the columns out as 8w + j.
    acc = tl.join(tl.join(tl.join(a0, a2), tl.join(a1, a3)), tl.join(tl.join(a4, a6), tl.join(a5, a7)))
    acc = tl.reshape(acc, (BLOCK_M, WORDS * 8))
    rn = pid_n * WORDS * 8 + tl.arange(0, WORDS * 8)
    out_off = rm[:, None] * N + rn[None, :]
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    elif ATOMIC:
        tl.atomic_add(part_ptr + out_off, acc, mask=out_mask, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # every thread's adds are issued before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.load(part_ptr + out_off, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.store(part_ptr + out_off, tl.zeros_like(total), mask=out_mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(part_ptr + pid_k * M * N + out_off, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, WORDS * 8), tl.float32)
            for sh in range(SPLIT_K):  # in split order: deterministic
                total += tl.load(
                    part_ptr + sh * M * N + out_off, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(out_ptr + out_off, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")
