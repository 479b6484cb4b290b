"""silu_mul against silu_mul_ref (Triton interpreter, CPU)."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.silu_mul import silu_mul, silu_mul_ref

# (atol, rtol) of kernel vs reference, per dtype.
TOL = {
    # Same fp32 formula; sigmoid's exp may differ in the last bit between numpy and torch.
    torch.float32: (1e-6, 1e-5),
    # One rounding, which the interpreter does by truncation (the GPU to nearest): one bf16 ulp apart at
    # most, and a bf16 ulp is at most 2**-7 of the value.
    torch.bfloat16: (1e-6, 2**-7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_rows", "inter"), [(1, 5), (3, 1100), (17, 37)])
def test_matches_reference(dtype: torch.dtype, n_rows: int, inter: int) -> None:
    gate_up = (3.0 * torch.randn(n_rows, 2 * inter)).to(dtype)  # wide enough to reach silu's tails
    out = torch.full((n_rows, inter), float("nan"), dtype=dtype)  # every element must be written

    got = silu_mul(gate_up, out=out)

    atol, rtol = TOL[dtype]
    assert got is out
    torch.testing.assert_close(got, silu_mul_ref(gate_up), atol=atol, rtol=rtol)


def test_reference_is_llama_mlp_activation() -> None:
    gate_up = torch.randn(4, 2 * 9, dtype=torch.float64)
    gate, up = gate_up[:, :9], gate_up[:, 9:]
    want = torch.nn.functional.silu(gate) * up  # LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    torch.testing.assert_close(silu_mul_ref(gate_up.float()).double(), want, atol=1e-6, rtol=1e-6)


def test_contract_errors() -> None:
    with pytest.raises(ValueError, match="even number of columns"):
        silu_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="gate_up must have 2 dimensions"):
        silu_mul(torch.randn(8))
    with pytest.raises(ValueError, match="gate_up must have dtype"):
        silu_mul(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="out must have shape"):
        silu_mul(torch.randn(2, 8), out=torch.empty(2, 8))
