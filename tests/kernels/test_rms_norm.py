"""rms_norm against rms_norm_ref (Triton interpreter, CPU), and rms_norm_ref against transformers."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.rms_norm import rms_norm, rms_norm_ref

# (atol, rtol) of kernel vs reference, per output dtype.
TOL = {
    # Same fp32 operations; only the order of the row sum and rsqrt's last bit differ.
    torch.float32: (1e-5, 1e-5),
    # Two roundings (the normalised row, then the product), and the interpreter's fp32->bf16 conversion
    # truncates where the GPU rounds to nearest: up to one bf16 ulp (<= 2**-7 of the value) each.
    torch.bfloat16: (1e-5, 2**-6),
}
EPS = 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_rows", "n_cols"), [(1, 16), (3, 37), (17, 200)])
def test_matches_reference(dtype: torch.dtype, n_rows: int, n_cols: int) -> None:
    x = torch.randn(n_rows, n_cols).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(n_cols)).to(dtype)
    out = torch.full((n_rows, n_cols), float("nan"), dtype=dtype)  # every element must be written

    got = rms_norm(x, weight, EPS, out=out)

    atol, rtol = TOL[dtype]
    assert got is out
    torch.testing.assert_close(got, rms_norm_ref(x, weight, EPS), atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    ("dtype", "res_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
)
def test_residual_added_in_place(dtype: torch.dtype, res_dtype: torch.dtype) -> None:
    x = torch.randn(17, 37).to(dtype)
    residual = torch.randn(17, 37).to(res_dtype)
    weight = torch.randn(37).to(dtype)
    residual_ref = residual.clone()

    got = rms_norm(x, weight, EPS, residual=residual)
    want = rms_norm_ref(x, weight, EPS, residual=residual_ref)

    atol, rtol = TOL[dtype]
    assert got.dtype == dtype
    # One rounding of an exact fp32 sum: equal up to the interpreter's truncation (one ulp).
    torch.testing.assert_close(residual, residual_ref, atol=0, rtol=2**-7)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


def test_reference_is_llama_rmsnorm() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(48, eps=EPS).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(48))
    x = torch.randn(5, 48).to(torch.bfloat16)
    torch.testing.assert_close(rms_norm_ref(x, hf.weight.detach(), EPS), hf(x).detach(), atol=0, rtol=0)


def test_contract_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 8)
    w = torch.randn(8)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.randn(7), EPS)
    with pytest.raises(ValueError, match="x must have dtype"):
        rms_norm(x.to(torch.int32), w, EPS)
    with pytest.raises(ValueError, match="x must be contiguous"):
        rms_norm(torch.randn(8, 3).t(), w, EPS)
    with pytest.raises(ValueError, match="residual must have shape"):
        rms_norm(x, w, EPS, residual=torch.randn(3, 9))
    with pytest.raises(ValueError, match="eps must be > 0"):
        rms_norm(x, w, 0.0)
    with pytest.raises(ValueError, match="out must have dtype"):
        rms_norm(x, w, EPS, out=torch.empty(3, 8, dtype=torch.bfloat16))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        rms_norm(x, w, EPS)
