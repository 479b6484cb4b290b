"""Reference path against transformers' LlamaForCausalLM on the same weights (the correctness oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import BOUNDED_FROM, KEY_BLOCK, Transformer, bounded_shapes
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


def test_bounded_shapes_pad_queries_and_keys_and_mask_the_padding() -> None:
    end, mask = bounded_shapes(3, 5, 8, capacity=600, device=torch.device("cpu"))
    assert (end, tuple(mask.shape)) == (KEY_BLOCK, (4, KEY_BLOCK))
    causal = torch.ones(3, 8, dtype=torch.bool).tril(diagonal=5)  # query i sees keys 0..5+i
    assert torch.equal(mask[:3, :8], causal) and torch.equal(mask[3], mask[2])  # the padded query: the last
    assert not mask[:, 8:].any()  # keys past the step's end: never seen
    assert bounded_shapes(1, 599, 600, 600, torch.device("cpu"))[0] == 600  # never past the cache
    # Steps of 1-64 tokens ending anywhere in 600 rows meet 7 query and 3 key shapes, not thousands.
    shapes = {
        (m.shape[0], e)
        for t in range(1, 65)
        for end in range(t, 601, 7)
        for e, m in [bounded_shapes(t, end - t, end, 3 * KEY_BLOCK, torch.device("cpu"))]
    }
    assert len(shapes) == 7 * 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_attention_ignores_cache_rows_past_the_keys(
    shaped_model: Path, dtype: torch.dtype
) -> None:
    # On the CPU, a bf16/fp16 step of BOUNDED_FROM tokens or more reads keys up to the next multiple of
    # KEY_BLOCK: the rows past the step's end are zeroed and masked, so a cache full of NaN gives the very
    # logits of a zeroed one (shorter steps read only their own keys).
    cfg = ModelConfig.from_file(shaped_model / "config.json")
    w = load_weights(shaped_model, cfg, torch.device("cpu"), dtype)
    ids = torch.randint(0, cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(2))
    assert 37 - 26 >= BOUNDED_FROM > 3  # the prompt and the paste below are bounded, the keystroke is not
    runs = []
    for fill in (float("nan"), 0.0):
        cache = KVCache(cfg, 1, 64, torch.device("cpu"), dtype, pad=KEY_BLOCK)
        cache.buffer.fill_(fill)
        model = Transformer(cfg, w, cache.capacity)
        assert model.bounded
        prompt = model.forward_reference(ids[:26], 0, cache, 0, all_logits=True)  # bounded
        paste = model.forward_reference(ids[26:37], 26, cache, 0, all_logits=True)  # bounded, over a prefix
        keystroke = model.forward_reference(ids[37:40], 37, cache, 0, all_logits=True)
        decode = model.forward_reference(ids[40:], 40, cache, 0)
        runs.append(torch.cat([prompt, paste, keystroke, decode]))
    assert torch.isfinite(runs[0]).all()
    assert torch.equal(runs[0], runs[1])
