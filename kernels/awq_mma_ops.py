"""The fragment kernel's operations (kernels/awq_mma.py): the `mma.m16n8k16` and the A operand's unit
values in inline PTX, the B operand's loads, and the stores of the results (split-K included). A lane's
packed word is its A fragment (kernels/awq_fragments.py): register i holds nibbles i and i + 4 as two bf16
1 + q/16, made with one shift and one LOP3."""

from __future__ import annotations

import triton
import triton.language as tl

_MMA = tl.constexpr(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)
# Register i of the A fragment: nibbles i and i + 4 of the word as two bf16 1 + q/16 (low, high half).
_PAIR = "{ .reg .b32 t; %s.b32 t, $1, %d; lop3.b32 $0, t, 0x00780078, 0x3F803F80, 0xea; }"
UNIT0 = tl.constexpr(_PAIR % ("shl", 3))
UNIT1 = tl.constexpr(_PAIR % ("shr", 1))
UNIT2 = tl.constexpr(_PAIR % ("shr", 5))
UNIT3 = tl.constexpr(_PAIR % ("shr", 9))
BF16_ONES = tl.constexpr(0x3F803F80)  # two bf16 1.0: the A operand of the X = sum x MMA


@triton.jit
def _unit(w, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r", [w], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return tl.inline_asm_elementwise(
        _MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def block(w, b0, b1, ones, d0, d1, d2, d3, x0, x1, x2, x3):
    """One 16 x 16 block: D += A B with A the word's unit values, X += 1 B."""
    d0, d1, d2, d3 = _mma(_unit(w, UNIT0), _unit(w, UNIT1), _unit(w, UNIT2), _unit(w, UNIT3), b0, b1,
                          d0, d1, d2, d3)  # fmt: skip
    x0, x1, x2, x3 = _mma(ones, ones, ones, ones, b0, b1, x0, x1, x2, x3)
    return d0, d1, d2, d3, x0, x1, x2, x3


@triton.jit
def block2(w, b0, b1, c0, c1, ones, d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3):
    """block for x rows 0-7 (B = b) and 8-15 (B = c), the unit values made once."""
    a0, a1, a2, a3 = _unit(w, UNIT0), _unit(w, UNIT1), _unit(w, UNIT2), _unit(w, UNIT3)
    d0, d1, d2, d3 = _mma(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
    e0, e1, e2, e3 = _mma(a0, a1, a2, a3, c0, c1, e0, e1, e2, e3)
    x0, x1, x2, x3 = _mma(ones, ones, ones, ones, b0, b1, x0, x1, x2, x3)
    u0, u1, u2, u3 = _mma(ones, ones, ones, ones, c0, c1, u0, u1, u2, u3)
    return d0, d1, d2, d3, x0, x1, x2, x3, e0, e1, e2, e3, u0, u1, u2, u3


@triton.jit
def quad(t):
    """(L, 4) -> four (L,) columns (in-thread: no data moves)."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], 2, 2)))  # columns (0, 2) and (1, 3)
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def load_b(x_ptr, kb, x_off, LW: tl.constexpr):
    """The B words of load kb, (L, 4) each: blocks 0-1 and 2-3 (the second is the first again at LW 2)."""
    xa = tl.load(x_ptr + kb * (8 * LW) + x_off)
    xb = xa
    if LW == 4:
        xb = tl.load(x_ptr + kb * (8 * LW) + 4 + x_off)
    return xa, xb


@triton.jit
def finish_lanes(a0, a1, a2, a3, a4, a5, a6, a7, out_ptr, acc_ptr, count_ptr, pid_n, m0, n0, ok, M, N,
                 MB: tl.constexpr, SPLIT_K: tl.constexpr, SUMS: tl.constexpr):  # fmt: skip
    """Store the lane's results: a0..a3 of x rows m0, m0 + 1, a4..a7 (MB 2) of rows m0 + 8, m0 + 9. Split-K
    shares (and SUMS) add into acc; without SUMS the last share to arrive reads the sums out, zeroes them."""
    ADD: tl.constexpr = SUMS or SPLIT_K > 1  # atomic adds into acc, not stores into out
    _finish(a0, a1, a2, a3, out_ptr, acc_ptr, m0, n0, ok, M, N, ADD, 0)
    if MB == 2:
        _finish(a4, a5, a6, a7, out_ptr, acc_ptr, m0 + 8, n0, ok, M, N, ADD, 0)
    if SPLIT_K > 1 and not SUMS:
        tl.debug_barrier()  # every thread's adds are issued before the one release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            _finish(a0, a1, a2, a3, out_ptr, acc_ptr, m0, n0, ok, M, N, ADD, 1)
            if MB == 2:
                _finish(a4, a5, a6, a7, out_ptr, acc_ptr, m0 + 8, n0, ok, M, N, ADD, 1)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _finish(a0, a1, a2, a3, out_ptr, acc_ptr, m0, n0, ok, M, N, ADD: tl.constexpr, PHASE: tl.constexpr):
    """The lane's four results (x rows m0, m0 + 1; columns n0, n0 + 8) through _store."""
    _store(a0, out_ptr, acc_ptr, m0 * N + n0, ok & (m0 < M), ADD, PHASE)
    _store(a1, out_ptr, acc_ptr, (m0 + 1) * N + n0, ok & (m0 + 1 < M), ADD, PHASE)
    _store(a2, out_ptr, acc_ptr, m0 * N + n0 + 8, ok & (m0 < M), ADD, PHASE)
    _store(a3, out_ptr, acc_ptr, (m0 + 1) * N + n0 + 8, ok & (m0 + 1 < M), ADD, PHASE)


@triton.jit
def _store(a, out_ptr, acc_ptr, off, ok, ADD: tl.constexpr, PHASE: tl.constexpr):
    """Phase 0: y, or the share's atomic add. Phase 1 (the last share): read the sum out, zero it."""
    if not ADD:
        tl.store(out_ptr + off, a.to(out_ptr.dtype.element_ty), mask=ok)
    elif PHASE == 0:
        tl.atomic_add(acc_ptr + off, a, mask=ok, sem="relaxed", scope="gpu")
    else:
        total = tl.load(acc_ptr + off, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + off, total.to(out_ptr.dtype.element_ty), mask=ok)
        tl.store(acc_ptr + off, tl.zeros_like(total), mask=ok)
