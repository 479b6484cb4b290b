"""The skinny GEMM's epilogues (kernels/skinny_parts.py) under the Triton interpreter: a projection that
adds into the residual stream, the next one normalised by the sums the first left (with the SwiGLU), and
the QKV projection with RoPE and the K/V store, against the separate kernels (the GEMM, kernels/rms_norm.py,
kernels/silu_mul.py, kernels/rope_store.py) on the same values."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.rms_norm import rms_norm
from lsp_dscoder.kernels.rope_store import rope_cos_sin, rope_store
from lsp_dscoder.kernels.skinny_gemm import MAX_M, skinny_gemm, skinny_gemm_ref
from lsp_dscoder.kernels.skinny_parts import ResidualEpilogue, RmsScale, RopeEpilogue
from lsp_dscoder.kernels.skinny_plan import SkinnyConfig

EPS = 1e-6
CASES = [
    # (M, C, K of the producer, N of the consumer, producer tiles): C off the 16-column blocks, one row,
    # MAX_M rows, a producer with K shares (its last share does the epilogue).
    (1, 40, 48, 24, SkinnyConfig(16, 32, 1, 4, 1)),
    (5, 70, 96, 33, SkinnyConfig(16, 32, 3, 4, 1)),
    (MAX_M, 48, 64, 16, SkinnyConfig(32, 32, 2, 4, 1)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "c", "k", "n", "config"), CASES)
def test_residual_then_rms_scale(
    dtype: torch.dtype, m: int, c: int, k: int, n: int, config: SkinnyConfig
) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + c)
    attn = torch.randn(m, k, generator=gen).to(dtype)
    w_o = (torch.randn(c, k, generator=gen) / k**0.5).to(dtype)
    residual = torch.randn(m, c, generator=gen).to(dtype)
    norm_w = (1 + 0.1 * torch.randn(c, generator=gen)).to(dtype)
    w_next = (torch.randn(n, c, generator=gen) / c**0.5).to(dtype)
    blocks = -(-c // config.block_n)
    sums = torch.full((blocks * MAX_M + 7,), float("nan"))  # every slot the launch owns is written

    res = residual.clone()
    x_w = skinny_gemm(attn, w_o, config=config, residual=ResidualEpilogue(res, norm_w, sums))

    # The residual as the separate kernels leave it (the same GEMM, then kernels/rms_norm.py's in-place
    # add): bit for bit.
    want_res = residual.clone()
    normed = rms_norm(skinny_gemm(attn, w_o, config=config), norm_w, EPS, residual=want_res)
    torch.testing.assert_close(res, want_res, atol=0, rtol=0)
    # The weighted row: one rounding (the interpreter truncates, torch rounds to nearest: one ulp).
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-23
    torch.testing.assert_close(x_w.float(), want_res.float() * norm_w.float(), atol=0, rtol=ulp)
    total = sums[: blocks * MAX_M].view(blocks, MAX_M).sum(0)
    torch.testing.assert_close(total[:m], want_res.float().square().sum(1), atol=0, rtol=1e-6)
    assert torch.equal(total[m:], torch.zeros(MAX_M - m))  # rows past M add nothing

    out = skinny_gemm(x_w, w_next, rms=RmsScale(sums, blocks, EPS))
    # The separate kernels: rmsnorm(residual) * weight, rounded, then the GEMM. The fused form rounds the
    # weighted row before the scale instead of the normalised one twice: up to two ulps of each operand
    # (2 * 2**-7 of each term in bf16), and one of the result.
    want = skinny_gemm_ref(normed, w_next).float()
    terms = normed.float().abs() @ w_next.float().abs().T
    bound = 2 * ulp * terms + ulp * want.abs() + 1e-6
    assert ((out.float() - want).abs() <= bound).all(), (out.float() - want).abs().max()


def test_epilogue_contract() -> None:
    x = torch.randn(2, 32)
    w = torch.randn(16, 32)
    res, nw, sums = torch.zeros(2, 16), torch.ones(16), torch.zeros(MAX_M)
    with pytest.raises(ValueError, match="residual must have shape"):
        skinny_gemm(x, w, residual=ResidualEpilogue(torch.zeros(3, 16), nw, sums))
    with pytest.raises(ValueError, match="sums holds 8 values, the launch writes 16"):
        skinny_gemm(x, w, residual=ResidualEpilogue(res, nw, torch.zeros(8)))
    with pytest.raises(ValueError, match="a residual epilogue takes a plain product"):
        skinny_gemm(x, w, residual=ResidualEpilogue(res, nw, sums), rms=RmsScale(sums, 1, EPS))
    with pytest.raises(ValueError, match="rms names 2 blocks, sums holds 1"):
        skinny_gemm(x, w, rms=RmsScale(sums, 2, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [None, SkinnyConfig(32, 32, 3, 4, 1)])
def test_rms_scale_with_glu(dtype: torch.dtype, config: SkinnyConfig | None) -> None:
    """gate/up as the fused layer runs it: the RMS scale and the SwiGLU in one epilogue, against the scaled
    product of the same rows without glu, then silu(gate) * up."""
    m, c, n = 3, 48, 40
    gen = torch.Generator().manual_seed(7)
    x_w = torch.randn(m, c, generator=gen).to(dtype)
    w = (torch.randn(2 * n, c, generator=gen) / c**0.5).to(dtype)
    sums = torch.zeros(4 * MAX_M)
    sums[: 2 * MAX_M].view(2, MAX_M)[:, :m] = torch.rand(2, m, generator=gen) * c
    scale = RmsScale(sums, 2, EPS)
    plain = skinny_gemm(x_w, w, rms=scale).float()
    gate, up = plain.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = skinny_gemm(x_w, w, rms=scale, glu=True, config=config)
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-23
    # Two roundings apart at most (the interpreter truncates where torch rounds, and the GEMM's sums run
    # in another order in a tile twice as wide): 4 ulps of the value, with a floor for values near zero.
    torch.testing.assert_close(got.float(), want, atol=4 * ulp * float(want.abs().max()), rtol=4 * ulp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("m", "heads", "kv_heads", "head_dim", "config"),
    [
        (1, 4, 2, 16, None),  # one program a head
        (5, 2, 2, 32, SkinnyConfig(16, 32, 1, 4, 1)),  # two programs a head
        (MAX_M, 3, 1, 32, SkinnyConfig(64, 32, 2, 4, 1)),  # tiles cut to the head; K shares
    ],
)
def test_rope_epilogue_matches_gemm_then_rope_store(
    dtype: torch.dtype, m: int, heads: int, kv_heads: int, head_dim: int, config: SkinnyConfig | None
) -> None:
    """q, and the K/V rows written, as the plain GEMM then kernels/rope_store.py give them, with and without
    the RMS scale in front; nothing written past the step's rows."""
    c, max_ctx, start = 48, 40, 21
    gen = torch.Generator().manual_seed(m + head_dim)
    x = torch.randn(m, c, generator=gen).to(dtype)
    wqkv = (torch.randn((heads + 2 * kv_heads) * head_dim, c, generator=gen) / c**0.5).to(dtype)
    cos_sin = rope_cos_sin(max_ctx, head_dim, 10000.0, 1.0, torch.device("cpu"))
    pos = torch.tensor([start], dtype=torch.int32)
    sums = torch.zeros(2 * MAX_M)
    sums[:m] = torch.rand(m, generator=gen) * c
    for scale in (None, RmsScale(sums, 2, EPS)):
        caches = [torch.full((kv_heads, max_ctx, head_dim), 7.0).to(dtype) for _ in range(4)]
        qkv = skinny_gemm(x, wqkv, rms=scale, config=config)
        want = rope_store(qkv, cos_sin, pos, caches[0], caches[1], heads, kv_heads)
        rope = RopeEpilogue(cos_sin, pos, caches[2], caches[3], heads, kv_heads)
        got = skinny_gemm(x, wqkv, rms=scale, rope=rope, config=config)
        assert got.shape == (m, heads * head_dim)
        # bf16: bit for bit. fp32: the interpreter runs each tile's tl.dot as numpy's matmul, whose BLAS
        # kernel sums in an order that depends on the tile's width (the epilogue's tiles are cut to a
        # head), so the GEMM's totals may differ in their last bits: 4 ulps of the largest value.
        tol = 0.0 if dtype == torch.bfloat16 else 4 * 2**-23 * float(want.abs().max())
        torch.testing.assert_close(got.view(m, heads, head_dim), want, atol=tol, rtol=0)
        torch.testing.assert_close(caches[2], caches[0], atol=tol, rtol=0)  # rows past start + m untouched
        torch.testing.assert_close(caches[3], caches[1], atol=tol, rtol=0)
        assert bool((caches[2][:, start + m :] == 7).all()) and bool((caches[2][:, :start] == 7).all())


def test_rope_epilogue_contract() -> None:
    x, w = torch.randn(2, 32), torch.randn(4 * 16, 32)  # 2 + 2 * 1 heads of 16
    k = torch.zeros(1, 8, 16)
    cos_sin = rope_cos_sin(8, 16, 10000.0, 1.0, torch.device("cpu"))
    pos = torch.tensor([0])
    with pytest.raises(ValueError, match="w has 64 rows, not .* for 5 heads"):
        skinny_gemm(x, w, rope=RopeEpilogue(cos_sin, pos, k, k.clone(), 3, 1))
    with pytest.raises(ValueError, match=r"k_cache must be \(2, max_ctx, 16\)"):
        skinny_gemm(x, torch.randn(6 * 16, 32), rope=RopeEpilogue(cos_sin, pos, k, k.clone(), 2, 2))
    with pytest.raises(ValueError, match="a rope epilogue takes the QKV product itself"):
        skinny_gemm(x, w, glu=True, rope=RopeEpilogue(cos_sin, pos, k, k.clone(), 2, 1))
