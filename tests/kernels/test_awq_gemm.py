"""awq_skinny (its CUDA-core and tensor-core kernels) and awq_gemm against awq_gemm_ref (Triton interpreter,
CPU): odd shapes, group sizes 32/64/128, split-K with unequal shares, and a product worked by hand."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.awq_dequant import awq_dequant, awq_dequant_ref
from lsp_dscoder.kernels.awq_format import pack_int4
from lsp_dscoder.kernels.awq_gemm import awq_gemm, awq_gemm_ref, awq_skinny
from lsp_dscoder.kernels.awq_plan import AwqTiles, AwqWorkspace, GemvTiles

# (atol, rtol) of kernel vs reference. Both sum exact fp32 products (the interpreter widens the dot
# operands), in different orders, and the kernel subtracts z * sum(x) from sum(x * q): terms up to
# 15 * |x| * s with s <= 0.1 and K <= 256 give sums near 1e2, whose fp32 reordering error is ~1e-5.
# bf16/fp16 outputs are rounded once (truncated by the interpreter): one ulp, 2**-7 / 2**-10 of the value.
TOL = {torch.float32: (2e-4, 1e-5), torch.bfloat16: (2e-4, 2**-7), torch.float16: (2e-4, 2**-10)}

SKINNY = [
    # (M, N, K, group, tiles): N off the block, one row, 16 rows, K shares of unequal fill.
    (1, 40, 64, 32, AwqTiles(16, 32, 32, 1, 4, 1)),
    (5, 72, 128, 64, AwqTiles(16, 64, 32, 1, 4, 1)),
    (16, 24, 256, 128, AwqTiles(16, 16, 64, 1, 4, 1)),
    (3, 8, 224, 32, AwqTiles(16, 32, 32, 3, 4, 1)),  # shares of 3, 3 and 1 groups
    (2, 56, 256, 128, AwqTiles(16, 32, 128, 2, 4, 1)),  # one whole group per share
    (7, 48, 192, 64, AwqTiles(16, 16, 16, 16, 4, 1)),  # 16 asked, 3 shares hold any group
    # The CUDA-core kernel (one row): a 128-word block over a few words, group shares.
    (1, 40, 64, 32, GemvTiles(16, 1, 1)),
    (1, 72, 128, 64, GemvTiles(8, 1, 1)),
    (1, 24, 384, 128, GemvTiles(32, 2, 1)),  # shares of 2 and 1 groups
    (1, 1032, 224, 32, GemvTiles(16, 3, 1)),  # 129 words: two column blocks, the last of one word
    (1, 8, 96, 32, GemvTiles(32, 16, 1)),  # 16 asked, 3 shares hold any group
    (1, 40, 192, 64, GemvTiles(8, 5, 1, sub=4)),  # quarters of groups: 5 asked, 4 shares of 3 parts
    (1, 16, 256, 128, GemvTiles(16, 3, 1, sub=2)),  # a share ends in the middle of a group
    (1, 1032, 224, 32, GemvTiles(16, 3, 1, atomic=False)),  # partials summed by the last share
    (1, 40, 192, 64, GemvTiles(8, 5, 1, sub=4, prefetch=True)),  # the last share prefetches past K
    (1, 72, 256, 128, GemvTiles(16, 1, 1, sub=2, prefetch=True)),
]
GEMM = [
    (37, 40, 64, 32, AwqTiles(16, 32, 32, 1, 4, 1)),  # three M blocks, the last of 5 rows
    (17, 24, 256, 128, AwqTiles(32, 16, 64, 1, 4, 1)),
    (33, 72, 128, 64, AwqTiles(32, 64, 64, 1, 4, 1)),
]


def random_layer(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32)
    s = (torch.rand(k // group, n) * 0.09 + 0.01).half()
    return pack_int4(q), pack_int4(z), s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "group", "tiles"), SKINNY)
def test_skinny_matches_reference(
    dtype: torch.dtype, m: int, n: int, k: int, group: int, tiles: AwqTiles | GemvTiles
) -> None:
    packed = random_layer(n, k, group)
    x = torch.randn(m, k).to(dtype)
    workspace = AwqWorkspace.allocate(n, x.device, 16)
    workspace.partials.fill_(float("nan"))  # partials are written before they are read
    out = torch.full((m, n), float("nan"), dtype=dtype)  # every element must be written

    got = awq_skinny(x, *packed, out=out, tiles=tiles, workspace=workspace)

    atol, rtol = TOL[dtype]
    assert got is out
    torch.testing.assert_close(got, awq_gemm_ref(x, *packed), atol=atol, rtol=rtol)
    # Left as found, for the next graph replay.
    assert workspace.counts.count_nonzero().item() == 0 and workspace.accum.count_nonzero().item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k", "group", "tiles"), GEMM)
def test_gemm_matches_reference(
    dtype: torch.dtype, m: int, n: int, k: int, group: int, tiles: AwqTiles
) -> None:
    packed = random_layer(n, k, group)
    x = torch.randn(m, k).to(dtype)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(
        awq_gemm(x, *packed, tiles=tiles), awq_gemm_ref(x, *packed), atol=atol, rtol=rtol
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "group"), [(72, 64, 32), (1032, 128, 64), (8, 256, 128)])
def test_dequant_matches_reference(dtype: torch.dtype, n: int, k: int, group: int) -> None:
    # (q - z) s is one fp32 product of exact factors: equal to the bit in fp32; bf16/fp16 are rounded once
    # (truncated by the interpreter): one ulp.
    packed = random_layer(n, k, group)
    out = torch.full((k, n), float("nan"), dtype=dtype)
    got = awq_dequant(*packed, out=out)
    torch.testing.assert_close(got, awq_dequant_ref(*packed, dtype), atol=0, rtol=TOL[dtype][1])


def test_hand_worked_product() -> None:
    # Column n of every row holds q = n, zero 1, scale 0.5; x is 32 ones: y[n] = 32 * (n - 1) * 0.5.
    q = torch.arange(8, dtype=torch.int32).repeat(32, 1)  # (K=32, N=8)
    packed = pack_int4(q), pack_int4(torch.ones(1, 8, dtype=torch.int32)), torch.full((1, 8), 0.5).half()
    want = [[-16.0, 0.0, 16.0, 32.0, 48.0, 64.0, 80.0, 96.0]]
    assert awq_skinny(torch.ones(1, 32), *packed, tiles=AwqTiles(16, 16, 32, 1, 4, 1)).tolist() == want
    assert awq_skinny(torch.ones(1, 32), *packed, tiles=GemvTiles(32, 1, 1)).tolist() == want


def test_contract_errors_name_the_argument() -> None:
    qw, qz, s = random_layer(16, 64, 32)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="qzeros"):
        awq_skinny(x, qw, qz[:1], s)
    with pytest.raises(ValueError, match="qweight"):
        awq_skinny(torch.randn(2, 32), qw, qz, s)
    with pytest.raises(ValueError, match="one row of x, got 2"):
        awq_skinny(x, qw, qz, s, tiles=GemvTiles(16, 1, 1))
    with pytest.raises(ValueError, match="1..16 rows"):
        awq_skinny(torch.randn(17, 64), qw, qz, s)
    with pytest.raises(ValueError, match="block_k 64 must be >= 16 and divide the group size 32"):
        awq_skinny(x, qw, qz, s, tiles=AwqTiles(16, 16, 64, 1, 4, 1))
    with pytest.raises(ValueError, match="scales"):
        awq_gemm(x, qw, qz, s.float())
    qw48, qz48, s48 = random_layer(16, 96, 48)
    with pytest.raises(ValueError, match="group size 48 must be a power of two"):
        awq_gemm(torch.randn(2, 96), qw48, qz48, s48)
