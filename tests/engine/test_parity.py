"""Reference path against transformers' LlamaForCausalLM on the same weights (the correctness oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import load_weights
from tests.tiny import make_checkpoint

# float32 on CPU: both sides do the same math in a different order (fused QKV GEMM, SDPA vs eager
# softmax); observed differences are ~1e-6 on logits of magnitude ~3, so 1e-4 leaves a wide margin
# while still catching any real error (a wrong rope or mask moves logits by >1e-2).
ATOL_F32 = 1e-4


def load(folder: Path, dtype=torch.float32, ctx: int = 128) -> tuple[Transformer, KVCache]:
    cfg = ModelConfig.from_file(folder / "config.json")
    w = load_weights(folder, cfg, torch.device("cpu"), dtype)
    cache = KVCache(cfg, 2, ctx, torch.device("cpu"), dtype)
    return Transformer(cfg, w, cache.capacity), cache


def hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids[None]).logits[0]


def test_logits_match_transformers(shaped_model: Path) -> None:
    model, cache = load(shaped_model)
    ids = torch.randint(0, model.cfg.vocab_size, (37,), generator=torch.Generator().manual_seed(1))
    ours = model.forward_reference(ids, 0, cache, 0, all_logits=True)
    ref = hf_logits(shaped_model, ids)
    assert ours.shape == ref.shape == (37, model.cfg.vocab_size)
    torch.testing.assert_close(ours, ref, atol=ATOL_F32, rtol=0)
    # the last-position-only LM head gives the same row
    last = model.forward_reference(ids, 0, cache, 1)
    torch.testing.assert_close(last, ref[-1:], atol=ATOL_F32, rtol=0)


def test_chunked_prefill_over_cached_prefix_matches(shaped_model: Path) -> None:
    model, cache = load(shaped_model)
    ids = torch.randint(0, model.cfg.vocab_size, (30,), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(shaped_model, ids)
    parts = [
        model.forward_reference(ids[a:b], a, cache, 1, all_logits=True)
        for a, b in ((0, 11), (11, 12), (12, 30))
    ]
    torch.testing.assert_close(torch.cat(parts), ref, atol=ATOL_F32, rtol=0)


def test_sharded_checkpoint_loads_identically(tmp_path: Path) -> None:
    folder = make_checkpoint(
        tmp_path / "sharded", hidden_size=64, num_attention_heads=4, max_shard_size="40KB"
    )
    assert (folder / "model.safetensors.index.json").exists()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    model, cache = load(folder)
    ids = torch.arange(3, 20)
    torch.testing.assert_close(
        model.forward_reference(ids, 0, cache, 0, all_logits=True),
        hf_logits(folder, ids),
        atol=ATOL_F32,
        rtol=0,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_close_to_float32(shaped_model: Path, dtype: torch.dtype) -> None:
    # bf16 keeps 8 mantissa bits: per-op relative error ~4e-3, accumulated over a few layers the
    # relative L2 error of the logits stays well under 3e-2 (fp16: 11 bits, tighter).
    model, cache = load(shaped_model, dtype)
    ids = torch.arange(5, 40)
    ours = model.forward_reference(ids, 0, cache, 0, all_logits=True)
    ref = hf_logits(shaped_model, ids)
    rel = (ours - ref).norm() / ref.norm()
    assert rel < (3e-2 if dtype == torch.bfloat16 else 5e-3), float(rel)
