"""decode_attention against decode_attention_ref (Triton interpreter, CPU; 16-key tiles there)."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.decode_attention import decode_attention, decode_attention_ref
from lsp_dscoder.kernels.extend_attention import extend_attention

from .test_extend_attention import MAX_CTX, TOL, assert_matches, make_cache, poison_partials


@pytest.fixture(autouse=True)
def _poison_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN split partials: rows of splits past seq_len must never reach the output."""
    poison_partials(monkeypatch)


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "head_dim", "seq_len", "splits", "dtype"),
    [
        (4, 2, 16, 1, None, torch.float32),  # the first token attends only to itself
        (4, 2, 16, 37, None, torch.bfloat16),  # tail tile partial
        (4, 2, 16, 37, 3, torch.float32),  # three 16-key shares, the last one partial
        (4, 2, 16, 37, 1, torch.float32),  # one share: the current token's row in its third tile
        (6, 1, 32, 5, 4, torch.bfloat16),  # 6:1 groups; three of four splits past seq_len
        (3, 3, 16, MAX_CTX, 4, torch.bfloat16),  # MHA, the cache full
        (2, 2, 128, 21, 2, torch.float32),  # the real head size
    ],
)
def test_matches_reference(
    n_heads: int, n_kv: int, head_dim: int, seq_len: int, splits: int | None, dtype: torch.dtype
) -> None:
    q = torch.randn(n_heads, head_dim).to(dtype)
    caches = make_cache(n_kv, head_dim, seq_len, dtype)
    length = torch.tensor([seq_len], dtype=torch.int32)
    assert_matches(decode_attention, decode_attention_ref, q, caches, length, num_splits=splits)


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "seq_len", "splits"),
    [
        (4, 2, 37, 3),  # three 16-key shares, the last one partial
        (7, 1, 5, 4),  # 7:1 groups (the 33B shape's); three of four splits past seq_len
        (3, 3, 64, 4),  # MHA, the cache full
    ],
)
def test_fused_combine_matches_reference(n_heads: int, n_kv: int, seq_len: int, splits: int) -> None:
    """The last split to arrive merges the partials; the counters are back at zero for the next launch,
    so a second launch at another length (as a graph replay would) is right too."""
    q = torch.randn(n_heads, 16).to(torch.bfloat16)
    k_cache, v_cache = make_cache(n_kv, 16, MAX_CTX, torch.bfloat16)
    counts = torch.zeros(n_kv + 1, dtype=torch.int32)  # a spare counter: only the first n_kv are used
    atol, rtol = TOL[torch.bfloat16]
    for length in (seq_len, 17):
        at = torch.tensor([length], dtype=torch.int32)
        out = torch.full_like(q, float("nan"))

        decode_attention(q, k_cache, v_cache, at, 0.25, out=out, num_splits=splits, counts=counts)

        torch.testing.assert_close(
            out, decode_attention_ref(q, k_cache, v_cache, at, 0.25), atol=atol, rtol=rtol
        )
        assert counts.tolist() == [0] * (n_kv + 1)


def test_token_axis_and_extend_agree() -> None:
    """(1, H, D) keeps its shape and gives what extend_attention gives for one token at seq_len - 1."""
    q = torch.randn(1, 4, 16)
    k_cache, v_cache = make_cache(2, 16, 30, torch.float32)

    got = decode_attention(q, k_cache, v_cache, torch.tensor([30]), 0.25, num_splits=2)

    assert got.shape == (1, 4, 16)
    torch.testing.assert_close(
        got, extend_attention(q, k_cache, v_cache, torch.tensor([29]), 0.25), atol=1e-6, rtol=1e-5
    )


def test_contract_errors() -> None:
    q = torch.randn(4, 16)
    k_cache, v_cache = make_cache(2, 16, MAX_CTX, torch.float32)
    length = torch.tensor([5])
    with pytest.raises(ValueError, match=r"q must be \(H, D\) or \(1, H, D\)"):
        decode_attention(torch.randn(2, 4, 16), k_cache, v_cache, length, 0.25)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention(torch.randn(3, 16), k_cache, v_cache, length, 0.25)
    with pytest.raises(ValueError, match="seq_len must have dtype"):
        decode_attention(q, k_cache, v_cache, torch.tensor([5.0]), 0.25)
    with pytest.raises(ValueError, match="v_cache must have dtype"):
        decode_attention(q, k_cache, v_cache.to(torch.bfloat16), length, 0.25)
    with pytest.raises(ValueError, match="num_splits must be in"):
        decode_attention(q, k_cache, v_cache, length, 0.25, num_splits=MAX_CTX)
    with pytest.raises(ValueError, match="out must have shape"):
        decode_attention(q, k_cache, v_cache, length, 0.25, out=torch.empty(1, 4, 16))
