"""The packed GEMM's epilogues (kernels/awq_parts.py) and the paired fragment layout on CPU (interpreter).

kernels/awq_mma.py's MMA is inline PTX and runs only on the GPU (tests/gpu/awq_fused.py compares the whole
kernel there), so here a small kernel hands the epilogue what the MMA leaves: a lane's four sums, read from
a known product Y at the lane's rows and (paired) columns, split over split-K shares as the kernel splits
them, and the results are compared with the separate kernels' references: the residual add and RMSNorm,
the SwiGLU, RoPE with the K/V store."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from lsp_dscoder.engine.awq import AwqLinear
from lsp_dscoder.kernels.awq_dequant import awq_dequant_ref, fragment_dequant
from lsp_dscoder.kernels.awq_format import pack_int4
from lsp_dscoder.kernels.awq_fragments import column, fragment_pack, fragment_unpack, word_order
from lsp_dscoder.kernels.awq_parts import mma_epilogue_args, mma_out, share_add, share_take, zero_totals
from lsp_dscoder.kernels.reference import rope_cos_sin
from lsp_dscoder.kernels.rope_store import rope_store_ref
from lsp_dscoder.kernels.skinny_parts import ResidualEpilogue, RmsScale, RopeEpilogue

EPS = 1e-6
BF16_ULP = 2**-7  # relative: one bf16 rounding apart (the interpreter's sigmoid and rsqrt are numpy's)


def bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 to bf16 as the interpreter converts: truncated (the GPU rounds to nearest)."""
    bits = x.float().contiguous().view(torch.int32) & -65536
    return bits.view(torch.float32).to(torch.bfloat16)


@triton.jit
def _epilogue_kernel(y_ptr, out_ptr, acc_ptr, count_ptr, M, res_ptr, norm_w_ptr, sums_ptr, zero_ptr,
                     cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, eps, N: tl.constexpr, K: tl.constexpr,
                     PAIR: tl.constexpr, SPLIT: tl.constexpr, RMS: tl.constexpr, GLU: tl.constexpr,
                     RESIDUAL: tl.constexpr, ROPE: tl.constexpr, ZERO: tl.constexpr, H: tl.constexpr,
                     KVH: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """kernels/awq_mma.py after its loop, with Y / SPLIT as each share's sums (exact: SPLIT is 1 or 2)."""
    nt = tl.program_id(0)
    share = tl.program_id(1)
    zero_totals(zero_ptr, nt, share, ZERO)
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    c_lo = column(nt, 0, g, PAIR)
    c_hi = column(nt, 1, g, PAIR)
    head = (nt * 8) // PAIR if ROPE else 0
    ok = (nt + 0 * lane) < N // 16  # a lane vector, as in the kernel
    for mb in tl.static_range(2):
        r0 = mb * 8 + 2 * t
        ok0 = r0 < M
        ok1 = r0 + 1 < M
        v0 = tl.load(y_ptr + r0 * N + c_lo, mask=ok0, other=0.0) / SPLIT
        v1 = tl.load(y_ptr + (r0 + 1) * N + c_lo, mask=ok1, other=0.0) / SPLIT
        v2 = tl.load(y_ptr + r0 * N + c_hi, mask=ok0, other=0.0) / SPLIT
        v3 = tl.load(y_ptr + (r0 + 1) * N + c_hi, mask=ok1, other=0.0) / SPLIT
        if SPLIT > 1:
            share_add(v0, v1, v2, v3, acc_ptr, r0, c_lo, c_hi, ok, M, N)
        else:
            mma_out(v0, v1, v2, v3, mb * 8, r0, c_lo, c_hi, ok, M, N, K, eps, head, out_ptr, sums_ptr,
                    res_ptr, norm_w_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, 32, RMS, GLU,
                    RESIDUAL, ROPE, H, KVH, D)  # fmt: skip
    if SPLIT > 1:
        arrived = tl.atomic_add(count_ptr + nt, 1)
        if arrived == SPLIT - 1:
            for mb in tl.static_range(2):
                r0 = mb * 8 + 2 * t
                v0, v1, v2, v3 = share_take(acc_ptr, r0, c_lo, c_hi, ok, M, N)
                mma_out(v0, v1, v2, v3, mb * 8, r0, c_lo, c_hi, ok, M, N, K, eps, head, out_ptr, sums_ptr,
                        res_ptr, norm_w_ptr, cos_sin_ptr, start_ptr, k_ptr, v_ptr, max_ctx, 32, RMS, GLU,
                        RESIDUAL, ROPE, H, KVH, D)  # fmt: skip
            tl.atomic_xchg(count_ptr + nt, 0)


def run_epilogue(y: torch.Tensor, pair: int, split: int, k: int = 64, zero: torch.Tensor | None = None,
                 **epi: object) -> torch.Tensor:  # fmt: skip
    """The epilogue on product y (M, N) fp32, through the launcher's own contract and arguments."""
    m, n = y.shape
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    shape, args = mma_epilogue_args(x, n, pair, 1, epi.get("residual"), epi.get("rms"), bool(epi.get("glu")),
                                    epi.get("rope"), zero)  # type: ignore[arg-type]  # fmt: skip
    out = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    acc = torch.zeros(m, n)
    counts = torch.zeros(n // 16, dtype=torch.int32)
    _epilogue_kernel[(n // 16, split)](y, out, acc, counts, m, N=n, K=k, PAIR=pair, SPLIT=split, **args)
    assert not acc.any() and not counts.any()  # left zero for the next launch
    return out


def inv_rms(sums: torch.Tensor, m: int, k: int) -> torch.Tensor:
    return torch.rsqrt(sums[:m] / k + EPS)[:, None]  # (M, 1)


@pytest.mark.parametrize(("m", "split"), [(1, 1), (3, 2), (11, 2), (16, 1)])
@pytest.mark.parametrize(("n", "pair"), [(48, 0), (96, 48), (128, 16)])
def test_plain_store_puts_each_column_back(m: int, split: int, n: int, pair: int) -> None:
    y = torch.randn(m, n)
    out = run_epilogue(y, pair, split)
    assert torch.equal(out, bf16(y))


@pytest.mark.parametrize(("m", "split"), [(1, 2), (5, 1), (13, 2)])
def test_swiglu_of_paired_gate_and_up_scaled_by_the_row_totals(m: int, split: int) -> None:
    inter, k = 48, 64
    y = torch.randn(m, 2 * inter)
    sums = torch.zeros(16)
    sums[:m] = torch.rand(m) * k + 1.0
    out = run_epilogue(y, inter, split, k, glu=True, rms=RmsScale(sums, 1, EPS))
    scaled = y * inv_rms(sums, m, k)
    gate = bf16(scaled[:, :inter]).float()
    up = bf16(scaled[:, inter:]).float()
    want = bf16(gate * torch.sigmoid(gate) * up)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=2 * BF16_ULP)


@pytest.mark.parametrize(("m", "split"), [(1, 1), (4, 2), (12, 2)])
def test_residual_add_writes_the_weighted_row_and_adds_its_squares(m: int, split: int) -> None:
    n = 48
    y = torch.randn(m, n)
    residual = torch.randn(m, n).to(torch.bfloat16)
    before = residual.clone()
    weight = (torch.rand(n) + 0.5).to(torch.bfloat16)
    sums = torch.full((16,), 7.0)  # another launch's totals, zeroed by this one (zero=)
    totals = torch.zeros(16)
    out = run_epilogue(y, 0, split, zero=sums, residual=ResidualEpilogue(residual, weight, totals))
    assert not sums.any()
    h = bf16(bf16(y).float() + before.float())
    assert torch.equal(residual, h)
    assert torch.equal(out, bf16(h.float() * weight.float()))
    torch.testing.assert_close(totals[:m], (h.float() ** 2).sum(1), atol=0, rtol=1e-5)
    assert not totals[m:].any()  # rows past M untouched


@pytest.mark.parametrize(("m", "split", "start"), [(1, 1, 7), (3, 2, 0), (9, 1, 20), (4, 2, 27)])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 1)])
def test_rope_rotates_and_stores_q_k_v(m: int, split: int, start: int, heads: int, kv_heads: int) -> None:
    d, max_ctx, k = 32, 30, 64
    n = (heads + 2 * kv_heads) * d
    y = torch.randn(m, n)
    sums = torch.zeros(16)
    sums[:m] = torch.rand(m) * k + 1.0
    cos_sin = rope_cos_sin(max_ctx, d, 10000.0, 1.0, torch.device("cpu"))
    k_cache = torch.full((kv_heads, max_ctx, d), float("nan"), dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    pos = torch.tensor([start], dtype=torch.int32)
    rope = RopeEpilogue(cos_sin, pos, k_cache, v_cache, heads, kv_heads)
    q = run_epilogue(y, d // 2, split, k, rope=rope, rms=RmsScale(sums, 1, EPS))
    qkv = bf16(y * inv_rms(sums, m, k))
    rows = max(0, min(m, max_ctx - start))  # positions past the cache are dropped
    k_want = torch.full((kv_heads, max_ctx + m, d), float("nan"), dtype=torch.bfloat16)
    v_want = k_want.clone()
    cs = torch.cat((cos_sin, cos_sin[:m]))  # rows past max_ctx only feed the dropped positions
    q_want = rope_store_ref(qkv, cs, pos, k_want, v_want, heads, kv_heads)
    q = q.view(m, heads, d)
    torch.testing.assert_close(q[:rows], q_want[:rows], atol=1e-6, rtol=BF16_ULP)
    assert q[rows:].isnan().all()
    torch.testing.assert_close(k_cache, k_want[:, :max_ctx], atol=1e-6, rtol=BF16_ULP, equal_nan=True)
    assert torch.equal(v_cache.isnan(), v_want[:, :max_ctx].isnan())
    assert torch.equal(v_cache[:, start : start + rows], v_want[:, start : start + rows])


def test_epilogue_contract() -> None:
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gate and up columns paired"):
        mma_epilogue_args(x, 96, 0, 1, None, None, True, None, None)
    with pytest.raises(ValueError, match="blocks 1"):
        mma_epilogue_args(x, 96, 48, 1, None, RmsScale(torch.zeros(32), 2, EPS), True, None, None)
    kc = torch.zeros(1, 8, 32, dtype=torch.bfloat16)
    table = rope_cos_sin(8, 32, 1e4, 1.0, torch.device("cpu"))
    rope = RopeEpilogue(table, torch.zeros(1, dtype=torch.int32), kc, kc, 2, 1)
    with pytest.raises(ValueError, match="dims j and j \\+ 16 paired"):
        mma_epilogue_args(x, 128, 0, 1, None, None, False, rope, None)
    with pytest.raises(ValueError, match="zero holds 8"):
        mma_epilogue_args(x, 48, 0, 1, None, None, False, None, torch.zeros(8))


def random_layer(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32)
    s = (torch.rand(k // group, n) * 0.09 + 0.01).half()
    return pack_int4(q), pack_int4(z), s


@pytest.mark.parametrize(("n", "pair"), [(32, 8), (96, 48), (128, 16), (256, 64)])
def test_paired_layout_round_trips_and_dequantizes_in_order(n: int, pair: int) -> None:
    k, group = 128, 64
    qweight, qzeros, scales = random_layer(n, k, group)
    order = word_order(n, pair)
    assert sorted(order.tolist()) == list(range(n // 8))
    # Tile 0 holds columns 0..7 and pair..pair+7.
    assert order[:2].tolist() == [0, pair // 8]
    words = fragment_pack(qweight, group, pair=pair)
    in_order = fragment_unpack(fragment_pack(qweight, group), k, n, group)
    assert torch.equal(fragment_unpack(words, k, n, group, pair), in_order)
    got = fragment_dequant(words, qzeros, scales, torch.empty(k, n), pair=pair)
    assert torch.equal(got, awq_dequant_ref(qweight, qzeros, scales, torch.float32))
    layer = AwqLinear(qweight, qzeros, scales, group)
    frag = layer.to_fragments(pair)
    assert frag.pair == pair and torch.equal(frag.awq_qweight(), qweight)
    assert torch.equal(frag.dequantized(torch.float32), layer.dequantized(torch.float32))
    with pytest.raises(ValueError, match=f"paired by {pair}, not 0"):
        frag.to_fragments()


def test_pairs_off_the_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="pair must be 0 or a multiple of 8"):
        word_order(96, 12)
    with pytest.raises(ValueError, match="pair must be 0 or a multiple of 8"):
        word_order(96, 32)  # 96 is not whole blocks of 64
