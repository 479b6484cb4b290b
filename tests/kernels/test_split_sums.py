"""Split-K sums taken by the kernel after the GEMM (kernels/split_sums.py), Triton interpreter on CPU: each
reader gives what it gives on the GEMM's stored output (the totals rounded to the output dtype), bit for
bit, and leaves the accumulator zero, rows it does not store included."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.rms_norm import rms_norm
from lsp_dscoder.kernels.rope_store import rope_cos_sin, rope_store
from lsp_dscoder.kernels.silu_mul import silu_mul
from lsp_dscoder.kernels.split_sums import SplitSums

MAX_CTX = 32


def _totals(rows: int, cols: int) -> torch.Tensor:
    """fp32 totals a quarter of a bf16 ulp away from a bf16 value (away from zero): rounded to nearest (the
    GPU) or toward zero (the interpreter) they give that value, and a reader that skipped the rounding
    would not."""
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    base = (torch.randn(rows, cols, generator=gen) * 3).to(torch.bfloat16).float()
    ulp = torch.exp2(torch.floor(torch.log2(base.abs())) - 7)
    return base + 0.25 * ulp * torch.sign(base)


@pytest.mark.parametrize(("rows", "cols", "with_residual"), [(1, 200, True), (3, 64, True), (5, 130, False)])
def test_rms_norm_takes_the_sums(rows: int, cols: int, with_residual: bool) -> None:
    totals = _totals(rows, cols)
    weight = torch.randn(cols).to(torch.bfloat16)
    residual = torch.randn(rows, cols).to(torch.bfloat16) if with_residual else None
    want_res = residual.clone() if residual is not None else None
    want = rms_norm(totals.to(torch.bfloat16), weight, 1e-6, residual=want_res)
    got = rms_norm(SplitSums(totals, torch.bfloat16), weight, 1e-6, residual=residual)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    if residual is not None:
        assert want_res is not None and torch.equal(residual, want_res)
    assert torch.count_nonzero(totals) == 0


# 1100 columns: two column blocks, the second partial.
@pytest.mark.parametrize(("rows", "inter"), [(1, 75), (4, 1100)])
def test_silu_mul_takes_the_sums(rows: int, inter: int) -> None:
    totals = _totals(rows, 2 * inter)
    want = silu_mul(totals.to(torch.bfloat16))
    got = silu_mul(SplitSums(totals, torch.bfloat16))
    assert got.shape == (rows, inter) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    assert torch.count_nonzero(totals) == 0


@pytest.mark.parametrize(("n_tok", "start"), [(1, 7), (3, 30)])  # start 30: the third row is past the cache
def test_rope_store_takes_the_sums(n_tok: int, start: int) -> None:
    n_heads, n_kv, head_dim = 4, 2, 16
    cos_sin = rope_cos_sin(MAX_CTX, head_dim, 10000.0, 1.0, "cpu")
    totals = _totals(n_tok, (n_heads + 2 * n_kv) * head_dim)
    caches = [torch.randn(n_kv, MAX_CTX, head_dim).to(torch.bfloat16) for _ in range(2)]
    want_caches = [c.clone() for c in caches]
    pos = torch.tensor([start], dtype=torch.int32)
    want = rope_store(totals.to(torch.bfloat16), cos_sin, pos, *want_caches, n_heads, n_kv)
    got = rope_store(SplitSums(totals, torch.bfloat16), cos_sin, pos, *caches, n_heads, n_kv)
    stored = min(n_tok, MAX_CTX - start)  # q rows past the cache are not written (rope_store's contract)
    assert torch.equal(got[:stored], want[:stored])
    assert torch.equal(caches[0], want_caches[0]) and torch.equal(caches[1], want_caches[1])
    assert torch.count_nonzero(totals) == 0  # rows past the cache were taken too


def test_sums_must_be_fp32_totals_of_a_float_dtype() -> None:
    with pytest.raises(ValueError, match=r"x.totals must have dtype"):
        rms_norm(SplitSums(torch.zeros(1, 8, dtype=torch.bfloat16), torch.bfloat16), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"gate_up.dtype must be in"):
        silu_mul(SplitSums(torch.zeros(1, 8), torch.int32))
