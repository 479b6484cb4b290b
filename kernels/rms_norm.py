"""Fused residual add + RMSNorm (Llama's), one row per program.

Fusing the add saves a full read and write of the hidden state per norm (two per layer). The arithmetic
follows Hugging Face's LlamaRMSNorm: the sum is rounded to the residual's dtype (as the model's separate
`residual + x` would be) and that rounded value is normalised in fp32; the normalised row is rounded to the
norm input's dtype before the weight multiply, as `weight * hidden.to(input_dtype)` does. x may be a GEMM's
split-K sums (kernels/split_sums.py), taken as they are read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import FLOAT_DTYPES, check_out, check_tensor
from .pdl import check_pdl, launch_options, pdl_enter
from .reference import rms_norm_ref as rms_norm_ref  # the oracle, shared with engine/model.py
from .split_sums import SplitSums, sums_or_tensor, take


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # (T, C); fp32 totals to take when SUMS
    res_ptr,  # (T, C), updated in place when HAS_RESIDUAL
    w_ptr,  # (C,)
    out_ptr,  # (T, C)
    C,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
    SUMS: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    x = take(x_ptr, row * C + cols, col_ok, SUMS, out_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        h = x + tl.load(res_ptr + row * C + cols, mask=col_ok, other=0.0).to(tl.float32)
        h_stored = h.to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * C + cols, h_stored, mask=col_ok)
        h_norm_in = h_stored
    else:
        h_norm_in = x.to(out_ptr.dtype.element_ty)
    h = h_norm_in.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h * h, 0) / C + eps)
    normed = (h * inv_rms).to(h_norm_in.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * C + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=col_ok)


def rms_norm(
    x: torch.Tensor | SplitSums,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """rmsnorm(x) * weight, or with `residual`: residual += x in place, then rmsnorm(residual) * weight.

    x (T, C) and residual (T, C) float, contiguous; weight (C,). Returns (T, C) in x.dtype (filling `out`
    when given). x may be split-K sums, taken (left zero). pdl: launch as a programmatic dependent of the
    previous kernel (kernels/pdl.py)."""
    x_in, dtype = sums_or_tensor("x", x, 2, FLOAT_DTYPES)
    n_rows, n_cols = x_in.shape
    check_tensor("weight", weight, shape=(n_cols,), dtypes=FLOAT_DTYPES, device=x_in.device)
    if residual is not None:
        check_tensor("residual", residual, shape=(n_rows, n_cols), dtypes=FLOAT_DTYPES, device=x_in.device)
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0, got {eps}")
    out = check_out(out, (n_rows, n_cols), dtype, x_in.device)
    check_pdl(pdl, x_in.device)
    if n_rows == 0:
        return out
    block_c = triton.next_power_of_2(n_cols)
    _rms_norm_kernel[(n_rows,)](
        x_in,
        out if residual is None else residual,
        weight,
        out,
        n_cols,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_C=block_c,
        PDL=pdl,
        SUMS=isinstance(x, SplitSums),
        **launch_options(pdl),
        # About 16 elements per thread: 16-byte bf16 loads with a row of 2K-8K in registers.
        num_warps=min(16, max(1, block_c // 512)),
    )
    return out
