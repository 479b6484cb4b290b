"""The long-step extend kernel (extend_prefill.py) against extend_attention_ref (Triton interpreter, CPU).

Both load paths run here: pointers, and tensor descriptors (the interpreter reads a whole tile and fills rows
past the array with zeros, as TMA does). 16x16 tiles, so the shapes below cross query blocks, key tiles, the
causal diagonal at unaligned offsets and split boundaries.
"""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels import extend_attention as ea
from lsp_dscoder.kernels.extend_prefill import launch_prefill
from lsp_dscoder.kernels.prefill_plan import LONG_STEP, PrefillTiles

from .test_extend_attention import TOL, assert_matches, make_cache, poison_partials

SMALL = (16, 16, 4, 1)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize(
    ("n_heads", "n_kv", "head_dim", "n_tok", "prefix", "splits", "dtype"),
    [
        (3, 3, 16, 40, 0, None, torch.bfloat16),  # cold prompt: a partial last block, diagonal tiles only
        (4, 2, 16, 33, 13, None, torch.float32),  # an unaligned prefix: the diagonal crosses 3 key tiles
        (6, 1, 32, 21, 5, 3, torch.bfloat16),  # 6:1 groups, split three ways, a split past the keys
        (4, 4, 16, 17, 30, 2, torch.float32),  # a line over a prefix, split in two
        (2, 2, 128, 18, 9, None, torch.bfloat16),  # the real head size
    ],
)
def test_matches_reference(
    monkeypatch: pytest.MonkeyPatch,
    tma: bool,
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
    # NaN past prefix + n_tok: a descriptor reads whole tiles there, and the kernel must not let them in.
    caches = make_cache(n_kv, head_dim, prefix + n_tok, dtype)
    start = torch.tensor([prefix], dtype=torch.int32)
    tiles = PrefillTiles(*SMALL, tma=tma)
    # A NaN-filled out: every element must be written, none past T.
    assert_matches(
        ea.extend_attention, ea.extend_attention_ref, q, caches, start, num_splits=splits, tiles=tiles
    )


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize(("n_tok", "prefix", "splits"), [(40, 0, None), (21, 37, 3)])
def test_lazy_rescale_matches_reference(tma: bool, n_tok: int, prefix: int, splits: int | None) -> None:
    """Large scores (q x 8), so row maxima jump by more than 2^8 mid-row and the rescale branch runs."""
    q = (8 * torch.randn(n_tok, 4, 16)).to(torch.bfloat16)
    k_cache, v_cache = make_cache(2, 16, prefix + n_tok, torch.bfloat16)
    start = torch.tensor([prefix], dtype=torch.int32)
    tiles = PrefillTiles(*SMALL, tma=tma, lazy=True)

    got = ea.extend_attention(q, k_cache, v_cache, start, 0.25, num_splits=splits, tiles=tiles)

    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(
        got, ea.extend_attention_ref(q, k_cache, v_cache, start, 0.25), atol=atol, rtol=rtol
    )


def test_long_steps_take_this_kernel() -> None:
    """From LONG_STEP tokens extend_attention runs the long-step kernel: the same bits as launching it."""
    n_tok = LONG_STEP
    q = torch.randn(n_tok, 2, 16)
    k_cache, v_cache = torch.randn(1, n_tok + 8, 16), torch.randn(1, n_tok + 8, 16)
    start = torch.tensor([3])

    got = ea.extend_attention(q, k_cache, v_cache, start, 0.25)

    direct = launch_prefill(
        q, k_cache, v_cache, start, 0.25, torch.empty_like(q), 1, False, PrefillTiles(*SMALL)
    )
    assert torch.equal(got, direct)
    torch.testing.assert_close(
        got, ea.extend_attention_ref(q, k_cache, v_cache, start, 0.25), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("tma", [False, True])
def test_start_is_read_on_the_device(tma: bool) -> None:
    """One call shape, two positions (what a CUDA graph replay does), split so the shares move too."""
    q = torch.randn(20, 2, 16)
    k_cache, v_cache = make_cache(2, 16, 60, torch.float32)
    for prefix in (0, 40):
        start = torch.tensor([prefix])
        got = ea.extend_attention(
            q, k_cache, v_cache, start, 0.25, num_splits=2, tiles=PrefillTiles(*SMALL, tma)
        )
        want = ea.extend_attention_ref(q, k_cache, v_cache, start, 0.25)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_split_count_is_checked() -> None:
    q = torch.randn(17, 2, 16)
    k_cache, v_cache = make_cache(2, 16, 40, torch.float32)
    with pytest.raises(ValueError, match="num_splits must be in"):
        ea.extend_attention(
            q, k_cache, v_cache, torch.tensor([0]), 0.25, num_splits=5, tiles=PrefillTiles(*SMALL)
        )
