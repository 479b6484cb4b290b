"""rope_store against rope_store_ref (Triton interpreter, CPU); rope_cos_sin and the rotation against
transformers' LlamaRotaryEmbedding / apply_rotary_pos_emb."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.rope_store import rope_cos_sin, rope_store, rope_store_ref

# (atol, rtol) of kernel vs reference for q and the rotated k, per dtype. v is a copy: compared exactly.
TOL = {
    # Same two products and a sum in fp32; a fused multiply-add on the GPU moves the last bit.
    torch.float32: (1e-6, 1e-5),
    # One rounding, which the interpreter does by truncation (the GPU to nearest): one bf16 ulp apart at
    # most, and a bf16 ulp is at most 2**-7 of the value.
    torch.bfloat16: (1e-6, 2**-7),
}
MAX_CTX = 64


def _caches(n_kv: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Random (not zero) so a write at a wrong position cannot hide among equal values.
    return torch.randn(n_kv, MAX_CTX, head_dim).to(dtype), torch.randn(n_kv, MAX_CTX, head_dim).to(dtype)


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "head_dim", "n_tok", "start", "dtype"),
    [
        (4, 2, 16, 1, 0, torch.float32),  # GQA, one decode token at position 0
        (4, 2, 16, 17, 37, torch.bfloat16),  # GQA, a chunk crossing the 16-token tile
        (6, 1, 32, 3, 5, torch.bfloat16),  # 6:1 groups
        (3, 3, 16, 17, 5, torch.float32),  # MHA
        (2, 2, 128, 3, 60, torch.bfloat16),  # the real head size, ending at the cache's last row
    ],
)
def test_matches_reference(
    n_heads: int, n_kv: int, head_dim: int, n_tok: int, start: int, dtype: torch.dtype
) -> None:
    cos_sin = rope_cos_sin(MAX_CTX, head_dim, 10000.0, 4.0, "cpu")
    qkv = torch.randn(n_tok, (n_heads + 2 * n_kv) * head_dim).to(dtype)
    k_cache, v_cache = _caches(n_kv, head_dim, dtype)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    out = torch.full((n_tok, n_heads, head_dim), float("nan"), dtype=dtype)
    pos = torch.tensor([start], dtype=torch.int32)

    q = rope_store(qkv, cos_sin, pos, k_cache, v_cache, n_heads, n_kv, out=out)
    q_want = rope_store_ref(qkv, cos_sin, pos, k_want, v_want, n_heads, n_kv)

    atol, rtol = TOL[dtype]
    rows = slice(start, start + n_tok)
    torch.testing.assert_close(q, q_want, atol=atol, rtol=rtol)
    torch.testing.assert_close(k_cache[:, rows], k_want[:, rows], atol=atol, rtol=rtol)
    torch.testing.assert_close(v_cache, v_want, atol=0, rtol=0)
    # Rows outside start..start+T-1 are untouched, bit for bit.
    for cache, want in ((k_cache, k_want), (v_cache, v_want)):
        assert torch.equal(cache[:, :start], want[:, :start])
        assert torch.equal(cache[:, start + n_tok :], want[:, start + n_tok :])


def test_rows_past_the_cache_are_dropped() -> None:
    n_heads, n_kv, head_dim, n_tok = 2, 1, 16, 5
    cos_sin = rope_cos_sin(MAX_CTX, head_dim, 10000.0, 1.0, "cpu")
    qkv = torch.randn(n_tok, (n_heads + 2 * n_kv) * head_dim)
    k_cache, v_cache = _caches(n_kv, head_dim, torch.float32)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    pos = torch.tensor([MAX_CTX - 2], dtype=torch.int64)  # 3 of the 5 tokens fall past the end

    rope_store(qkv, cos_sin, pos, k_cache, v_cache, n_heads, n_kv)

    assert torch.equal(k_cache[:, :-2], k_before[:, :-2])
    assert torch.equal(v_cache[:, :-2], v_before[:, :-2])
    assert torch.equal(v_cache[0, -2:], qkv[:2, -head_dim:])


@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_cos_sin_is_llama_rotary_embedding(factor: float) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_theta=100000.0,
        rope_scaling=scaling,
        max_position_embeddings=MAX_CTX,
    )
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(MAX_CTX)[None])  # (1, L, D)

    cos_sin = rope_cos_sin(MAX_CTX, 32, 100000.0, factor, "cpu")

    assert torch.equal(cos_sin[:, :16], cos[0, :, :16])
    assert torch.equal(cos_sin[:, 16:], sin[0, :, :16])


def test_rotation_is_llama_rotate_half() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    n_heads, n_kv, head_dim, n_tok, start = 2, 1, 16, 3, 7
    cos_sin = rope_cos_sin(MAX_CTX, head_dim, 10000.0, 4.0, "cpu")
    qkv = torch.randn(n_tok, (n_heads + 2 * n_kv) * head_dim)
    k_cache, v_cache = _caches(n_kv, head_dim, torch.float32)
    q = rope_store_ref(qkv, cos_sin, torch.tensor([start]), k_cache, v_cache, n_heads, n_kv)

    heads = qkv.view(1, n_tok, -1, head_dim).transpose(1, 2)  # (1, H + 2 KVH, T, D)
    cos, sin = cos_sin[start : start + n_tok].chunk(2, -1)
    cos, sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]  # (1, T, D)
    q_hf, k_hf = apply_rotary_pos_emb(heads[:, :n_heads], heads[:, n_heads : n_heads + n_kv], cos, sin)

    torch.testing.assert_close(q, q_hf[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_cache[:, start : start + n_tok], k_hf[0], atol=1e-6, rtol=1e-6)


def test_contract_errors() -> None:
    cos_sin = rope_cos_sin(MAX_CTX, 16, 10000.0, 1.0, "cpu")
    qkv = torch.randn(3, 4 * 16)  # H=2, KVH=1, D=16
    k_cache, v_cache = _caches(1, 16, torch.float32)
    pos = torch.tensor([0])
    with pytest.raises(ValueError, match="qkv width"):
        rope_store(qkv, cos_sin, pos, k_cache, v_cache, 3, 1)
    with pytest.raises(ValueError, match="k_cache must be"):
        rope_store(qkv, cos_sin, pos, torch.randn(2, MAX_CTX, 8), v_cache, 2, 1)
    with pytest.raises(ValueError, match="k_cache must have dtype"):
        rope_store(qkv, cos_sin, pos, k_cache.double(), v_cache, 2, 1)
    with pytest.raises(ValueError, match="positions_start must hold exactly one element"):
        rope_store(qkv, cos_sin, torch.tensor([0, 1]), k_cache, v_cache, 2, 1)
    with pytest.raises(ValueError, match="positions_start must have dtype"):
        rope_store(qkv, cos_sin, torch.tensor([0.0]), k_cache, v_cache, 2, 1)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        rope_store(qkv, cos_sin[:10], pos, k_cache, v_cache, 2, 1)
    with pytest.raises(ValueError, match="cos_sin_cache must have dtype"):
        rope_store(qkv, cos_sin.double(), pos, k_cache, v_cache, 2, 1)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        rope_store(
            torch.randn(3, 4 * 24),
            rope_cos_sin(MAX_CTX, 24, 1e4, 1.0, "cpu"),
            pos,
            torch.randn(1, MAX_CTX, 24),
            torch.randn(1, MAX_CTX, 24),
            2,
            1,
        )
    with pytest.raises(ValueError, match="even head_dim"):
        rope_cos_sin(MAX_CTX, 15, 1e4, 1.0, "cpu")
