"""extend_attention against extend_attention_ref (Triton interpreter, CPU).

The interpreter runs 16x16 tiles, so these shapes cross row blocks, key tiles, the causal diagonal and
split boundaries at odd offsets.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from lsp_dscoder.kernels import split_kv
from lsp_dscoder.kernels.extend_attention import extend_attention, extend_attention_ref

# (atol, rtol) of kernel vs the fp32 reference, per dtype.
TOL = {
    # exp2 with a folded log2(e) and a different summation order: ~1e-6 seen, 10x margin.
    torch.float32: (1e-5, 1e-5),
    # Probabilities are rounded to bf16 before the PV product and the output once more (by truncation
    # in the interpreter, to nearest on the GPU); outputs are O(1), where a bf16 ulp is 2**-7: allow two.
    torch.bfloat16: (2**-6, 2**-6),
}
MAX_CTX = 64


def poison_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill the split partial buffers of every attention launcher with NaN: rows of splits that skip must
    never reach the output."""
    real = split_kv.alloc_partials

    def poisoned(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        part_o, part_lse = real(*args)
        return part_o.fill_(float("nan")), part_lse.fill_(float("nan"))

    monkeypatch.setattr(split_kv, "alloc_partials", poisoned)


def assert_matches(
    kernel: Callable[..., torch.Tensor],
    ref: Callable[..., torch.Tensor],
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    position: torch.Tensor,
    **options: object,
) -> None:
    """kernel into a NaN-filled out (every element must be written) against ref, within TOL of q's dtype."""
    out = torch.full_like(q, float("nan"))
    scale = q.shape[-1] ** -0.5

    got = kernel(q, *caches, position, scale, out=out, **options)

    atol, rtol = TOL[q.dtype]
    assert got is out
    torch.testing.assert_close(got, ref(q, *caches, position, scale), atol=atol, rtol=rtol)


def make_cache(
    n_kv: int, head_dim: int, kv_len: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K/V for positions < kv_len, NaN past them: any read of an unused row poisons the output."""
    k = torch.randn(n_kv, MAX_CTX, head_dim)
    v = torch.randn(n_kv, MAX_CTX, head_dim)
    k[:, kv_len:] = float("nan")
    v[:, kv_len:] = float("nan")
    return k.to(dtype), v.to(dtype)


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "head_dim", "n_tok", "prefix", "splits", "dtype"),
    [
        (4, 2, 16, 1, 0, None, torch.float32),  # first token of a document
        (4, 2, 16, 3, 5, None, torch.bfloat16),  # keystroke over a short prefix
        (4, 2, 16, 17, 37, None, torch.float32),  # rows span 3 tiles, keys 4
        (4, 2, 16, 17, 37, 3, torch.bfloat16),  # same, split three ways
        (6, 1, 32, 3, 37, 4, torch.float32),  # 6:1 groups (rows not a power of two), last split empty
        (6, 1, 32, 17, 5, None, torch.bfloat16),  # 6:1 groups, a chunk longer than its prefix
        (4, 2, 16, 1, 37, 4, torch.bfloat16),  # one token split four ways
        (3, 3, 16, 17, 0, None, torch.bfloat16),  # MHA cold prefill
        (2, 2, 128, 5, 21, 2, torch.bfloat16),  # the real head size
    ],
)
def test_matches_reference(
    monkeypatch: pytest.MonkeyPatch,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    n_tok: int,
    prefix: int,
    splits: int | None,
    dtype: torch.dtype,
) -> None:
    poison_partials(monkeypatch)
    q = torch.randn(n_tok, n_heads, head_dim).to(dtype)
    caches = make_cache(n_kv, head_dim, prefix + n_tok, dtype)
    start = torch.tensor([prefix], dtype=torch.int32)
    assert_matches(extend_attention, extend_attention_ref, q, caches, start, num_splits=splits)


def test_start_is_read_on_the_device() -> None:
    """One call shape, two positions: what a CUDA graph replay does."""
    q = torch.randn(3, 4, 16)
    k_cache, v_cache = make_cache(2, 16, 40, torch.float32)
    for prefix in (0, 37):
        start = torch.tensor([prefix])
        got = extend_attention(q, k_cache, v_cache, start, 0.25, num_splits=2)
        want = extend_attention_ref(q, k_cache, v_cache, start, 0.25)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_contract_errors() -> None:
    q = torch.randn(3, 4, 16)
    k_cache, v_cache = make_cache(2, 16, MAX_CTX, torch.float32)
    start = torch.tensor([0])
    with pytest.raises(ValueError, match="multiple of KV heads"):
        extend_attention(torch.randn(3, 5, 16), k_cache, v_cache, start, 0.25)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        extend_attention(torch.randn(3, 4, 24), k_cache, v_cache, start, 0.25)
    with pytest.raises(ValueError, match="k_cache head_dim"):
        extend_attention(q, torch.randn(2, MAX_CTX, 32), torch.randn(2, MAX_CTX, 32), start, 0.25)
    with pytest.raises(ValueError, match="v_cache must have shape"):
        extend_attention(q, k_cache, v_cache[:1], start, 0.25)
    with pytest.raises(ValueError, match="k_cache must have dtype"):
        extend_attention(q, k_cache.to(torch.bfloat16), v_cache, start, 0.25)
    with pytest.raises(ValueError, match="q must be contiguous"):
        extend_attention(torch.randn(4, 3, 16).transpose(0, 1), k_cache, v_cache, start, 0.25)
    with pytest.raises(ValueError, match="start must hold exactly one element"):
        extend_attention(q, k_cache, v_cache, torch.tensor([[0, 1]]), 0.25)
    with pytest.raises(ValueError, match="num_splits must be in"):
        extend_attention(q, k_cache, v_cache, start, 0.25, num_splits=0)
    with pytest.raises(ValueError, match="1..max_ctx"):
        extend_attention(torch.randn(MAX_CTX + 1, 4, 16), k_cache, v_cache, start, 0.25)
