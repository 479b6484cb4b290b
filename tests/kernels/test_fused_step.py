"""The fast path's fused layer (the residual adds, norms, SwiGLU and RoPE with the K/V store in the skinny
GEMMs' epilogues) gives the reference path's logits, step after step, with only the launches it keeps
(Triton interpreter, CPU, float32, on a tiny random checkpoint). Decode attention's fused combine needs
splits, which the interpreter does not take: tests/kernels/test_decode_attention.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lsp_dscoder.engine import fast as fast_module
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.factory import ReferenceRunner
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import load_weights
from tests.tiny import cached_checkpoint

# As tests/engine/test_fast_path.py: fp32 end to end, sums in another order than PyTorch's (~1e-6 seen).
ATOL = 1e-4


@pytest.mark.slow
def test_fused_steps_match_reference(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = cached_checkpoint(
        tmp_path_factory.mktemp("fused"),
        "fused",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        num_hidden_layers=3,
    )
    cfg = ModelConfig.from_file(folder / "config.json")
    cpu = torch.device("cpu")
    cache = KVCache(cfg, 2, 64, cpu, torch.float32, pad=8)
    model = Transformer(cfg, load_weights(folder, cfg, cpu, torch.float32), cache.capacity)
    launches = {"rms_norm": 0, "silu_mul": 0, "rope_store": 0}
    for name in launches:
        monkeypatch.setattr(fast_module, name, counted(getattr(fast_module, name), name, launches))
    fast = FastRunner(model, cache, graphs=False, gemm="skinny", fused_residual=True)
    ref = ReferenceRunner(model, cache)
    ids = torch.randint(0, cfg.vocab_size, (14,), generator=torch.Generator().manual_seed(2))
    # slot 0 fast, slot 1 reference: a 9-token prefill, 3 more over it, two decode steps
    for a, b in ((0, 9), (9, 12)):
        torch.testing.assert_close(
            fast.prefill(ids[a:b], a, 0), ref.prefill(ids[a:b], a, 1), atol=ATOL, rtol=0
        )
    for pos in (12, 13):
        got, want = fast.decode(int(ids[pos]), pos, 0), ref.decode(int(ids[pos]), pos, 1)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # Per step, only the first layer's norm (no residual yet) and the final norm run as their own kernel;
    # no SwiGLU and no RoPE kernel runs in any of the 3 layers.
    assert launches == {"rms_norm": 4 * 2, "silu_mul": 0, "rope_store": 0}
    for layer in range(cfg.num_layers):  # the QKV epilogue stored the same K/V rows as the reference
        torch.testing.assert_close(cache.k(layer, 0)[:, :14], cache.k(layer, 1)[:, :14], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.v(layer, 0)[:, :14], cache.v(layer, 1)[:, :14], atol=1e-5, rtol=0)
    # The last O projection's block sums (one row: a decode step) are its residual rows' squares.
    sums = fast.sums[1][: fast.sum_blocks[1] * 16].view(-1, 16)
    assert torch.count_nonzero(sums[:, 1:]) == 0 and bool((sums[:, 0] > 0).all())
    assert not FastRunner(model, cache, graphs=False, gemm="cublas", fused_residual=True).residual_now


def counted(
    kernel: Callable[..., torch.Tensor], name: str, launches: dict[str, int]
) -> Callable[..., torch.Tensor]:
    def launch(*args: Any, **kwargs: Any) -> torch.Tensor:
        launches[name] += 1
        return kernel(*args, **kwargs)

    return launch
