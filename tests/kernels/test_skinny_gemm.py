"""skinny_gemm against skinny_gemm_ref (Triton interpreter, CPU): odd shapes, split-K, the SwiGLU epilogue."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.skinny_gemm import MAX_M, skinny_gemm, skinny_gemm_ref
from lsp_dscoder.kernels.skinny_plan import SkinnyConfig, SkinnyWorkspace

# (atol, rtol) of kernel vs reference, per dtype. Both sum fp32 products, in different orders: K terms of
# size |x||w| ~ 1-3 give an fp32 reordering error of a few 1e-6 of the sum. bf16 adds one rounding of the
# result, which the interpreter does by truncation: one bf16 ulp, at most 2**-7 of the value.
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (1e-4, 2**-7)}
SHAPES = [
    # (M, N, K, config): N and K off the tile sizes, one row, MAX_M rows, K shares of unequal fill.
    (1, 37, 70, SkinnyConfig(16, 32, 1, 4, 1)),
    (5, 40, 96, SkinnyConfig(16, 32, 1, 4, 1)),
    (MAX_M, 33, 200, SkinnyConfig(16, 32, 3, 4, 1)),  # 3 shares of 96, 96 and 8 columns
    (3, 48, 128, SkinnyConfig(32, 32, 4, 4, 1)),  # 4 shares of exactly one tile: no K masks
    (2, 17, 300, SkinnyConfig(16, 64, 8, 4, 1)),  # 8 asked, 5 shares hold any K
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k", "config"), SHAPES)
def test_matches_reference(dtype: torch.dtype, m: int, n: int, k: int, config: SkinnyConfig) -> None:
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype)
    workspace = SkinnyWorkspace.allocate(n, 8, x.device)
    workspace.partials.fill_(float("nan"))  # partials are written before they are read
    out = torch.full((m, n), float("nan"), dtype=dtype)  # every element must be written

    got = skinny_gemm(x, w, out=out, config=config, workspace=workspace)

    atol, rtol = TOL[dtype]
    assert got is out
    torch.testing.assert_close(got, skinny_gemm_ref(x, w), atol=atol, rtol=rtol)
    assert workspace.counts.count_nonzero().item() == 0  # left as found, for the next graph replay


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k", "config"), SHAPES)
def test_glu_epilogue_matches_gemm_then_silu_mul(
    dtype: torch.dtype, m: int, n: int, k: int, config: SkinnyConfig
) -> None:
    """W = [gate | up] (2n, k) -> silu(x @ gate.T) * (x @ up.T) (m, n), gate and up rows in one tile."""
    x, w = torch.randn(m, k).to(dtype), torch.randn(2 * n, k).to(dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype)
    workspace = SkinnyWorkspace.allocate(2 * n, 8, x.device)
    workspace.partials.fill_(float("nan"))

    got = skinny_gemm(x, w, out=out, config=config, workspace=workspace, glu=True)

    want = skinny_gemm_ref(x, w, glu=True)
    assert got is out and got.shape == (m, n)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    else:  # gate and up each one rounding (a truncation here), silu * up one more: 3 ulps of the result
        gate, up = (x.float() @ w.float().T).chunk(2, dim=-1)
        silu = torch.nn.functional.silu(gate)
        bound = 1e-4 + 3 * 2**-7 * (silu * up).abs() + 2**-7 * (silu.abs() + up.abs())
        assert ((got.float() - want.float()).abs() <= bound).all()
    assert workspace.counts.count_nonzero().item() == 0


def test_glu_contract() -> None:
    with pytest.raises(ValueError, match="even row count"):
        skinny_gemm(torch.randn(3, 40), torch.randn(47, 40), glu=True)


def test_repeated_split_launches_share_one_workspace() -> None:
    """Launches in stream order reuse the counters: the second and third must not see the first's."""
    workspace = SkinnyWorkspace.allocate(64, 4, torch.device("cpu"))
    config = SkinnyConfig(16, 32, 4, 4, 1)
    for n, k in ((64, 128), (40, 100), (64, 128)):
        x, w = torch.randn(4, k), torch.randn(n, k)
        got = skinny_gemm(x, w, config=config, workspace=workspace)
        atol, rtol = TOL[torch.float32]
        torch.testing.assert_close(got, skinny_gemm_ref(x, w), atol=atol, rtol=rtol)


def test_default_config_on_cpu_runs() -> None:
    x, w = torch.randn(7, 50).to(torch.bfloat16), torch.randn(21, 50).to(torch.bfloat16)
    torch.testing.assert_close(skinny_gemm(x, w), skinny_gemm_ref(x, w), atol=1e-4, rtol=2**-7)


def test_contract_errors() -> None:
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="1..16 rows"):
        skinny_gemm(torch.randn(17, 8), w)
    with pytest.raises(ValueError, match="x has 8 columns, w 9: they must match"):
        skinny_gemm(x, torch.randn(4, 9))
    with pytest.raises(ValueError, match="w must have dtype"):
        skinny_gemm(x, w.double())
    with pytest.raises(ValueError, match="out must have shape"):
        skinny_gemm(x, w, out=torch.empty(2, 5))
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        skinny_gemm(x, w, config=SkinnyConfig(16, 48))
    with pytest.raises(ValueError, match="split_k must be >= 1"):
        skinny_gemm(x, w, config=SkinnyConfig(split_k=0))
    with pytest.raises(ValueError, match="workspace too small"):
        skinny_gemm(
            torch.randn(2, 64),
            torch.randn(40, 64),
            config=SkinnyConfig(16, 16, 4, 4, 1),
            workspace=SkinnyWorkspace.allocate(4, 1, torch.device("cpu")),
        )
