"""A whole fast-path step of an INT4 AWQ model next to bf16, at a real DeepSeek-Coder shape (random
weights), on the GPU: decode at a 4K position and a 4-token keystroke, CUDA graphs replayed, and the AWQ
step's logits against the reference path run on the same weights dequantized to bf16.

    python -m lsp_dscoder.quantize_bench [--shape 6.7b] [--group 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lsp_dscoder.bench import COMMON, SHAPES
from lsp_dscoder.engine.awq import AwqConfig
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import LayerWeights, Weights, quant_layer_weights, random_weights

CONTEXT = 4096


def step_ms(fn, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    """Median wall time of one call, synchronized (what a keystroke waits for)."""
    times = []
    for i in range(reps + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(cfg: ModelConfig, weights: Weights, dev: torch.device) -> dict[str, float]:
    cache = KVCache(cfg, 1, CONTEXT + 64, dev, torch.bfloat16, pad=16)
    runner = FastRunner(Transformer(cfg, weights, cache.capacity), cache, buckets=(1, 4, 16))
    runner.capture()
    ids = torch.randint(0, cfg.vocab_size, (CONTEXT,), device=dev)
    runner.prefill(ids, 0, 0)  # a real 4K prefix in the cache: attention reads it
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    runner.prefill(ids, 0, 0)
    torch.cuda.synchronize()
    cold = (time.perf_counter() - t0) * 1e3
    keys = ids[:4].clone()
    return {
        "decode @4K ms": step_ms(lambda: runner.decode(7, CONTEXT, 0)),
        "keystroke +4 @4K ms": step_ms(lambda: runner.prefill(keys, CONTEXT, 0)),
        "prefill 4K ms": cold,
        "GPU GiB": torch.cuda.max_memory_allocated(dev) / 2**30,
    }


def dequantized(weights: Weights, dtype: torch.dtype) -> Weights:
    layers: list[LayerWeights] = []
    for layer in weights.layers:
        assert layer.quant is not None
        layers.append(quant_layer_weights(layer.quant, (layer.input_norm, layer.post_norm), dtype, False))
    return Weights(weights.embed, layers, weights.norm, weights.lm_head)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="6.7b")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    dev = torch.device("cuda")
    raw = {**COMMON, **SHAPES[args.shape.lower()]}
    dense_cfg = ModelConfig.from_dict(raw, source=args.shape)
    awq_cfg = ModelConfig.from_dict(
        {**raw, "quantization_config": AwqConfig(args.group).to_dict()}, source=args.shape
    )
    awq_w = random_weights(awq_cfg, dev, torch.bfloat16)
    # Correctness first, while only the packed weights are resident: fast path on packed weights vs the
    # reference path on the same weights dequantized, 16 tokens from position 0.
    ref_w = dequantized(awq_w, torch.bfloat16)
    cache = KVCache(dense_cfg, 2, 256, dev, torch.bfloat16, pad=16)
    ids = torch.randint(0, dense_cfg.vocab_size, (16,), device=dev)
    fast = FastRunner(Transformer(awq_cfg, awq_w, cache.capacity), cache, graphs=False)
    got = fast.prefill(ids, 0, 0)
    assert got is not None  # never interrupted without an `interrupted` check
    want = Transformer(dense_cfg, ref_w, cache.capacity).forward_reference(ids, 0, cache, 1).float()
    rel = float((got.float() - want).norm() / want.norm())
    print(f"{args.shape} AWQ fast vs dequantized reference: rel L2 {rel:.2e}, argmax equal "
          f"{bool(got.argmax() == want.argmax())}")  # fmt: skip
    # The bf16 noise floor of the same comparison: the dense fast path on the dequantized weights.
    dense_fast = FastRunner(Transformer(dense_cfg, ref_w, cache.capacity), cache, graphs=False)
    base = dense_fast.prefill(ids, 0, 0)
    assert base is not None
    rel = float((base.float() - want).norm() / want.norm())
    print(f"{args.shape} bf16 fast vs reference on the same dense weights: rel L2 {rel:.2e}")
    del ref_w, cache, fast, dense_fast
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    rows = {"AWQ int4": measure(awq_cfg, awq_w, dev)}
    del awq_w
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    rows["bf16"] = measure(dense_cfg, random_weights(dense_cfg, dev, torch.bfloat16), dev)
    cols = list(rows["bf16"])
    print(f"\n| {args.shape} | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for name, vals in rows.items():
        print(f"| {name} | " + " | ".join(f"{vals[c]:.2f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
