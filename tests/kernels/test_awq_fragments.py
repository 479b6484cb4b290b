"""The fragment layout of kernels/awq_mma.py on CPU. The kernel itself is an MMA in inline PTX and runs only
on the GPU (kernels/awq_check.py compares every launch there with awq_gemm_ref); here the layout is
checked against PTX's documented fragment semantics of mma.m16n8k16 by replaying the kernel's index
arithmetic lane by lane in PyTorch: which word and x values each lane loads, which (row, k) each half of
each register is, and the per-group scale and zero term."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.engine.awq import AwqLinear, PackedLayout
from lsp_dscoder.kernels.awq_dequant import awq_dequant_ref, fragment_dequant
from lsp_dscoder.kernels.awq_format import pack_int4, unpack_int4
from lsp_dscoder.kernels.awq_fragments import fragment_pack, fragment_unpack, load_words
from lsp_dscoder.kernels.awq_gemm import awq_gemm_ref
from lsp_dscoder.kernels.awq_mma import awq_mma
from lsp_dscoder.kernels.awq_plan import MmaTiles

SHAPES = [(48, 192, 64), (16, 64, 32), (32, 256, 128), (80, 128, 32)]  # (N, K, group): N off 32, K off 128


def random_layer(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32)
    s = (torch.rand(k // group, n) * 0.09 + 0.01).half()
    return pack_int4(q), pack_int4(z), s


def a_fragment(word: int) -> dict[tuple[int, int], int]:
    """PTX mma.m16n8k16 .bf16 A fragment of lane 4g + t (here g = t = 0 offsets): register i holds
    (row, col) = (g + 8 (i % 2), 2t + 8 (i // 2) + half), its low half the lower col. Our registers are
    nibbles (i, i + 4) of the word: {(row offset, col offset): q}."""
    out = {}
    for reg in range(4):
        for half in range(2):
            out[(8 * (reg % 2), 8 * (reg // 2) + half)] = (word >> (4 * (reg + 4 * half))) & 0xF
    return out


def replay(x: torch.Tensor, words: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int):
    """The kernel's arithmetic, lane by lane, with the MMA done as its definition says."""
    m, k = x.shape
    n = scales.shape[1]
    lw = load_words(group)
    xw = torch.zeros(8, k)  # B columns past M are the kernel's masked zeros
    xw[:m] = x.float()
    y = torch.zeros(8, n)
    z = unpack_int4(qzeros)  # (K / group, N)
    flat = words.reshape(-1)  # the kernel sees only the pointer
    for nt in range(n // 16):
        for kb in range(k // (16 * lw)):
            grp = kb * 16 * lw // group
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for j in range(lw):
                    word = int(flat[((nt * (k // (16 * lw)) + kb) * 32 + lane) * lw + j]) & 0xFFFFFFFF
                    for (ro, co), q in a_fragment(word).items():
                        # col offset co of the lane: MMA k = 2t + co; rows 4 LW t + 4 j + r of the load
                        r = (co % 2) + 2 * (co // 8)
                        row = 16 * lw * kb + 4 * lw * t + 4 * j + r
                        col = nt * 16 + g + ro
                        w = (q - int(z[grp, col])) * float(scales[grp, col])
                        y[:, col] += xw[:, row] * w
    return y[:m]


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
def test_pack_round_trip(n: int, k: int, group: int) -> None:
    qweight, _, _ = random_layer(n, k, group)
    words = fragment_pack(qweight, group)
    assert words.dtype == torch.int32 and words.shape == qweight.shape
    assert torch.equal(fragment_unpack(words, k, n, group), unpack_int4(qweight))


def test_pack_in_column_chunks() -> None:
    qweight, _, _ = random_layer(96, 256, 128)
    assert torch.equal(fragment_pack(qweight, 128, chunk=32), fragment_pack(qweight, 128))


def test_layer_in_fragments_dequantizes_the_same() -> None:
    # The reference path falls back on a fast path's layers: they dequantize alike in either layout.
    layer = AwqLinear(*random_layer(48, 192, 64), group_size=64)
    frag = layer.to_fragments()
    assert frag.layout is PackedLayout.FRAGMENTS and frag.qweight.shape == layer.qweight.shape
    assert torch.equal(frag.dequantized(torch.float32), layer.dequantized(torch.float32))
    assert torch.equal(frag.awq_qweight(), layer.qweight)
    with pytest.raises(ValueError, match="fuse before permuting"):
        AwqLinear.cat([frag, frag])


@pytest.mark.parametrize(("n", "k", "group"), SHAPES[:2])
def test_fragments_give_the_product(n: int, k: int, group: int) -> None:
    qweight, qzeros, scales = random_layer(n, k, group)
    x = torch.randn(3, k)
    got = replay(x, fragment_pack(qweight, group), qzeros, scales, group)
    torch.testing.assert_close(got, awq_gemm_ref(x, qweight, qzeros, scales), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k", "group"), [*SHAPES, (128, 128, 64), (64, 64, 32)])  # 8 and 4 tiles
def test_fragment_dequant_matches_reference(dtype: torch.dtype, n: int, k: int, group: int) -> None:
    # (q - z) s is one fp32 product of exact factors: equal to the bit in fp32; bf16 is rounded once
    # (truncated by the interpreter): one ulp.
    qweight, qzeros, scales = random_layer(n, k, group)
    out = torch.full((k, n), float("nan"), dtype=dtype)
    got = fragment_dequant(fragment_pack(qweight, group), qzeros, scales, out)
    assert got is out
    rtol = 0.0 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got, awq_dequant_ref(qweight, qzeros, scales, dtype), atol=0, rtol=rtol)


def test_word_of_a_hand_worked_tile() -> None:
    # One 16 x 16 tile, group 32 (two words a lane): q[k, n] = (k + n) % 16. Lane 0, word 0 holds
    # (row n, k) = (0, 0) (0, 1) (8, 0) (8, 1) (0, 2) (0, 3) (8, 2) (8, 3) in nibbles 0 4 1 5 2 6 3 7:
    # q = 0 1 8 9 2 3 10 11.
    q = (torch.arange(32).view(32, 1) + torch.arange(16).view(1, 16)) % 16
    words = fragment_pack(pack_int4(q.to(torch.int32)), 32)
    nibbles = [(int(words.reshape(-1)[0]) >> (4 * i)) & 0xF for i in range(8)]
    assert nibbles == [0, 8, 2, 10, 1, 9, 3, 11]


def test_shapes_off_the_layout_are_refused() -> None:
    with pytest.raises(ValueError, match="K % 64 == 0"):
        fragment_pack(torch.zeros(96, 2, dtype=torch.int32), 128)


def test_kernel_contract_checked_on_the_host() -> None:
    qweight, qzeros, scales = random_layer(48, 128, 64)
    words = fragment_pack(qweight, 64)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="at least one row, got 0"):
        awq_mma(torch.randn(0, 128, dtype=torch.bfloat16), words, qzeros, scales)
    with pytest.raises(ValueError, match="bf16 x"):
        awq_mma(x.float(), words, qzeros, scales, tiles=MmaTiles())
    with pytest.raises(ValueError, match="num_warps 2 must divide the 3 column tiles"):
        awq_mma(x, words, qzeros, scales, tiles=MmaTiles(1, 2))
    with pytest.raises(ValueError, match="qzeros"):
        awq_mma(x, words, qzeros[:1], scales)
