"""SwiGLU activation on the fused gate/up projection output: silu(gate) * up, in one pass.

The fused GEMM writes [gate | up] per row; reading both halves here and writing the product once saves
the separate silu and multiply passes (and their intermediate) of the unfused MLP. gate_up may be the GEMM's
split-K sums (kernels/split_sums.py), taken as they are read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_out
from .pdl import check_pdl, launch_options, pdl_enter
from .split_sums import SplitSums, sums_or_tensor, take

# 1024 columns x 4 warps: 8 bf16 per thread per half, one 16-byte load each.
_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,  # (T, 2I): gate in columns [0, I), up in [I, 2I); fp32 totals to take when SUMS
    out_ptr,  # (T, I)
    inter,  # I
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    SUMS: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < inter
    gate = take(gate_up_ptr, row * 2 * inter + cols, col_ok, SUMS, out_ptr.dtype.element_ty)
    up = take(gate_up_ptr, row * 2 * inter + inter + cols, col_ok, SUMS, out_ptr.dtype.element_ty)
    # One rounding at the end: within one output ulp of the model's bf16 silu-then-multiply.
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * inter + cols, y.to(out_ptr.dtype.element_ty), mask=col_ok)


def silu_mul(
    gate_up: torch.Tensor | SplitSums, out: torch.Tensor | None = None, pdl: bool = False
) -> torch.Tensor:
    """gate_up (T, 2I) float, contiguous -> (T, I) = silu(gate) * up in gate_up.dtype (fp32 math); split-K
    sums are taken (left zero). pdl: launch as a programmatic dependent of the previous kernel
    (kernels/pdl.py)."""
    src, dtype = sums_or_tensor("gate_up", gate_up, 2, FLOAT_DTYPES)
    n_rows, width = src.shape
    if width % 2:
        raise ValueError(f"gate_up must have an even number of columns (gate | up), got {width}")
    inter = width // 2
    out = check_out(out, (n_rows, inter), dtype, src.device)
    check_pdl(pdl, src.device)
    if n_rows == 0 or inter == 0:
        return out
    sums = isinstance(gate_up, SplitSums)
    _silu_mul_kernel[(n_rows, triton.cdiv(inter, _BLOCK))](
        src, out, inter, BLOCK=_BLOCK, PDL=pdl, SUMS=sums, num_warps=4, **launch_options(pdl)
    )
    return out


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch in fp32 (the test oracle)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)
