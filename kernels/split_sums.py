"""A GEMM's split-K sums handed to the kernel that reads them, instead of being finished by the GEMM.

A split-K GEMM whose shares add into one fp32 accumulator must still turn that accumulator into its
output: the last share to arrive learns it is last from an arrival counter (an acquire-release atomic)
and reads the totals back. On the H200 that tail costs 1.2-2.1 µs a launch, 10-33 % of a 1.3B or 6.7B INT4
matrix's time at one token (docs/awq.md). The kernel after the GEMM reads the output anyway, so here it
reads the accumulator instead: rounds each total to the output dtype (as the GEMM would have stored it)
and stores a zero in its place, leaving the accumulator ready for the next GEMM. The GEMM is then only
its atomic adds.

The contract: every total is taken exactly once, by one kernel, before the next GEMM adds into the same
accumulator (stream order; under PDL the next GEMM adds only after its wait, when the reader has
completed). Totals that will not be taken (a forward stopped between layers) are the owner's to zero: the
fast path zeroes its accumulator then (engine/fast.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .contract import check_tensor


@dataclass(frozen=True)
class SplitSums:
    """A GEMM's result still in its fp32 accumulator: `totals` (T, N), taken as `dtype`."""

    totals: torch.Tensor  # (T, N) fp32, a contiguous view of the accumulator
    dtype: torch.dtype  # what the GEMM's output would have been


def sums_or_tensor(
    name: str, x: object, ndim: int, dtypes: tuple[torch.dtype, ...]
) -> tuple[torch.Tensor, torch.dtype]:
    """The tensor a kernel reads (the totals for SplitSums) and the dtype its values have once read."""
    if isinstance(x, SplitSums):
        check_tensor(f"{name}.totals", x.totals, ndim=ndim, dtypes=(torch.float32,))
        if x.dtype not in dtypes:
            raise ValueError(f"{name}.dtype must be in {[str(d) for d in dtypes]}, got {x.dtype}")
        return x.totals, x.dtype
    t = check_tensor(name, x, ndim=ndim, dtypes=dtypes)
    return t, t.dtype


@triton.jit
def take(ptr, offs, mask, SUMS: tl.constexpr, DTYPE: tl.constexpr):
    """Load x[offs] as fp32. SUMS: x is an accumulator; its totals are rounded to DTYPE and zeroed."""
    x = tl.load(ptr + offs, mask=mask, other=0.0)
    if SUMS:
        # The compiler may give the zeros' store another thread-to-element map than the load (it did,
        # with 16-divisible widths on the H200): every thread must hold its values before any zeroes them.
        tl.debug_barrier()
        tl.store(ptr + offs, tl.zeros_like(x), mask=mask)
        x = x.to(DTYPE)
    return x.to(tl.float32)
