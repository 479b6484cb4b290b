"""The online softmax (flash attention) that the attention kernels' key loops share: its running state, one
update per key tile, the final normalisation, and the K/V tile loads and causal mask that feed it.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Scores are kept in log2 units (exp2 is the native instruction): qk_scale = sm_scale * log2(e).
LOG2E = 1.4426950408889634
# Initial running max: finite, so a row whose keys are all masked gets exp2(-inf - m) = 0, not NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def softmax_state(ROWS: tl.constexpr, D: tl.constexpr):
    """Running max, sum and output (ROWS, D) of an online softmax before its first key tile."""
    return (
        tl.full((ROWS,), NEG_BIG, tl.float32),
        tl.zeros((ROWS,), tl.float32),
        tl.zeros((ROWS, D), tl.float32),
    )


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
def normalise(acc, l_i):
    """The output rows acc / l; a row that saw no key (l = 0) stays 0."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    return acc / l_safe[:, None]


@triton.jit
def load_kv(k_ptr, v_ptr, kv_off, kv_ok, MASK: tl.constexpr, UPCAST: tl.constexpr):
    """The K and V tiles (N, D) at kv_off, rows off kv_ok read as zeros when MASK; widened to fp32 when
    UPCAST (split_kv's `dot_operands_fp32`)."""
    if MASK:
        k = tl.load(k_ptr + kv_off, mask=kv_ok[:, None], other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + kv_off)
        v = tl.load(v_ptr + kv_off)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def causal_mask(qk, j, t, start, kv_ok):
    """Scores (M, N) with -inf where key j is past row t's position start + t, or off kv_ok."""
    visible = (j[None, :] <= start + t[:, None]) & kv_ok[None, :]
    return tl.where(visible, qk, float("-inf"))
