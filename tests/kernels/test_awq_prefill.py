"""kernels/awq_prefill.py through Triton's interpreter: the dequantizing GEMM on the fragment layout against
the plain PyTorch oracle (dequantize to fp32, one fp32 product), at odd row counts, shapes whose N is off
the widest tile and every group size, in both ways of applying the scales."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.awq_dequant import fragment_dequant
from lsp_dscoder.kernels.awq_format import pack_int4
from lsp_dscoder.kernels.awq_fragments import fragment_pack
from lsp_dscoder.kernels.awq_gemm import awq_gemm_ref
from lsp_dscoder.kernels.awq_prefill import PrefillTiles, fragment_gemm, prefill_tiles


def random_layer(n: int, k: int, group: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, generator=gen)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32, generator=gen)
    s = (torch.rand(k // group, n, generator=gen) * 0.09 + 0.01).half()
    return pack_int4(q), pack_int4(z), s


CASES = [  # (M, N, K, group, tiles)
    (17, 48, 128, 64, PrefillTiles(block_m=16, tiles=1)),  # N of three 16-column tiles
    (33, 64, 192, 64, PrefillTiles(block_m=16, tiles=2, group_m=2)),  # a band cut short by num_m
    (5, 32, 128, 32, PrefillTiles(block_m=16, tiles=2)),  # group 32: loads of two blocks
    (40, 128, 256, 128, PrefillTiles(block_m=32, tiles=8, group_m=1)),
]


@pytest.mark.parametrize("nk", [False, True])
@pytest.mark.parametrize("scale_after", [False, True])
@pytest.mark.parametrize(("m", "n", "k", "group", "tiles"), CASES)
def test_fp32_product_matches_the_oracle(
    m: int, n: int, k: int, group: int, tiles: PrefillTiles, scale_after: bool, nk: bool
) -> None:
    qweight, qzeros, scales = random_layer(n, k, group)
    x = torch.randn(m, k)
    out = torch.full((m, n), float("nan"))
    t = PrefillTiles(tiles.block_m, tiles.tiles, 1, 1, scale_after, tiles.group_m, nk)
    got = fragment_gemm(x, fragment_pack(qweight, group), qzeros, scales, out=out, tiles=t)
    assert got is out
    torch.testing.assert_close(got, awq_gemm_ref(x, qweight, qzeros, scales), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("nk", [False, True])
@pytest.mark.parametrize("scale_after", [False, True])
def test_half_matches_dequantize_then_matmul(scale_after: bool, nk: bool) -> None:
    # The engine's other path for long steps: the matrix fragment_dequant writes, times x. Without
    # scale_after the kernel multiplies exactly those rounded weights; with it they are not rounded.
    # fp16 here: the interpreter's tl.dot reads bf16 as raw integers (bf16 is checked on the GPU by
    # kernels/awq_check.py); the kernel's code does not depend on which 16-bit float it is.
    n, k, group = 64, 256, 128
    qweight, qzeros, scales = random_layer(n, k, group, seed=1)
    frags = fragment_pack(qweight, group)
    x = torch.randn(20, k).half()
    w = fragment_dequant(frags, qzeros, scales, torch.empty(k, n, dtype=torch.float16))
    want = (x.float() @ w.float()).half()
    t = PrefillTiles(block_m=16, tiles=4, num_warps=1, num_stages=1, scale_after=scale_after, nk=nk)
    got = fragment_gemm(x, frags, qzeros, scales, tiles=t)
    assert got.dtype == torch.float16 and got.shape == (20, n)
    oracle = awq_gemm_ref(x.float(), qweight, qzeros, scales)
    err = float((got.float() - oracle).abs().max() / oracle.abs().max())
    if not scale_after:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2**-10)
    rounded = float((want.float() - oracle).abs().max() / oracle.abs().max())
    assert err < 1e-3 and (err == rounded if not scale_after else err < rounded)


def test_default_tiles_divide_the_engine_shapes() -> None:
    # Every DeepSeek-Coder layer matrix (N = 2048 .. 38400) and a 48-column toy take the widest tile.
    for n in (48, 2048, 6144, 11008, 12288, 22016, 38400):
        t = prefill_tiles(256, n, 4096, 128, torch.device("cpu"))
        assert (n // 16) % t.tiles == 0
    assert prefill_tiles(256, 48, 64, 64, torch.device("cpu")).tiles == 1
    assert prefill_tiles(256, 22016, 4096, 128, torch.device("cpu")).tiles == 8


def test_contract_checked_on_the_host() -> None:
    qweight, qzeros, scales = random_layer(48, 128, 64)
    frags = fragment_pack(qweight, 64)
    with pytest.raises(ValueError, match="column tiles a program must divide the 3"):
        fragment_gemm(torch.randn(20, 128), frags, qzeros, scales, tiles=PrefillTiles(block_m=16, tiles=2))
    with pytest.raises(ValueError, match="qweight"):
        fragment_gemm(torch.randn(20, 64), frags, qzeros, scales)
    with pytest.raises(ValueError, match="no fragment layout"):
        q, z, s = random_layer(40, 128, 64)
        fragment_gemm(torch.randn(20, 128), q, z, s)
