"""The fast path's choices for small steps side by side (the skinny GEMM alone, with programmatic dependent
launch, with the fused layer (residual adds, norms, SwiGLU and RoPE in its epilogues), both, and what auto
picks), in one process on the same random weights (DeepSeek-Coder shapes, bf16): step times and logits,
run by hand on a CUDA machine.

    python -m tests.gpu.skinny_ab [--shapes 1.3B,6.7B] [--reps 20] [--quant awq] [--save LOGITS.pt]

Each step is one CUDA graph replay plus the argmax, timed with device events (median). All runners share
one KV slot, filled once by a 4K prefill; the logits of each step are compared with the reference path
(plain PyTorch) on the same cache, relative L2. With `--quant awq` the layer matrices are the bench's INT4
AWQ weights (lsp_dscoder/bench_awq.py: the same seeded weights quantized, group 128), which the reference
path cannot run (the dense matrices are not kept): the logits are compared with the plain variant's.
Packed layers keep the separate norm, RoPE and SwiGLU kernels (docs/awq.md), so there the "+res"
variants run what the plain ones run: a measure of the run-to-run spread.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from lsp_dscoder.bench import hf_config
from lsp_dscoder.bench_awq import awq_weights
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.fast_choices import BUCKETS
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import random_weights
from lsp_dscoder.kernels import shapes
from lsp_dscoder.kernels.check_gpu import measure_floors, median_ms

PREFIX = 4096
STEPS = {"decode @4K": 1, "keystroke +4 @4K": 4, "+16 @4K": 16}
# name -> FastRunner options; "skinny" is the plain skinny path, "auto" what ships (every choice timed at
# warm-up per bucket).
VARIANTS: dict[str, dict[str, object]] = {
    "skinny": {"gemm": "skinny", "pdl": False, "fused_residual": False},
    "+pdl": {"gemm": "skinny", "pdl": True, "fused_residual": False},
    "+res": {"gemm": "skinny", "pdl": False, "fused_residual": True},
    "+res+pdl": {"gemm": "skinny", "pdl": True, "fused_residual": True},
    "auto": {"fused_residual": None},
}
ROUNDS = 3  # the variants' timings interleaved, round by round


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def run_shape(m: shapes.Model, reps: int, copy_bw: float, quant: str | None) -> dict[str, torch.Tensor]:
    raw = hf_config(m.name.lower())  # the bench's config.json of the shape
    cfg = ModelConfig.from_dict(raw)
    dev = torch.device("cuda")
    cache = KVCache(cfg, 1, 8192 + 64, dev, torch.bfloat16, pad=max(BUCKETS))
    weights = awq_weights(raw, 128, dev) if quant else random_weights(cfg, dev, torch.bfloat16)
    model = Transformer(cfg, weights, cache.capacity)
    runners = {name: FastRunner(model, cache, **opts) for name, opts in VARIANTS.items()}  # type: ignore[arg-type]
    for r in runners.values():
        r.capture()
    gen = torch.Generator(dev).manual_seed(0)
    ids = torch.randint(2, cfg.vocab_size, (PREFIX + 16,), device=dev, generator=gen)
    runners["skinny"].prefill(ids[:PREFIX], 0, 0)
    w = model.w
    if quant:
        matrices = [t for layer in w.layers for t in layer.streamed()[:-2]]  # packed words, zeros, scales
    else:
        matrices = [t for layer in w.layers for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    weight_bytes = sum(t.numel() * t.element_size() for t in matrices) + w.lm_head.numel() * 2
    kv_bytes = 2 * cfg.num_layers * cfg.kv_size * PREFIX * 2
    floor = (weight_bytes + kv_bytes) / copy_bw * 1e3
    print(
        f"\n{m.name}: floor {floor:.3f} ms (weights {weight_bytes / 1e9:.2f} GB + KV {kv_bytes / 1e9:.2f} GB)"
    )
    print(f"auto chose per bucket: {runners['auto'].chosen}")
    names = list(runners)
    print(
        f"{'step (GPU ms)':17s} " + " ".join(f"{n:>9s}" for n in names) + f" {'auto/floor':>10s}"
        "  rel L2 to reference: " + " ".join(f"{n:>9s}" for n in names)
    )
    kept: dict[str, torch.Tensor] = {}
    for name, new in STEPS.items():
        new_ids = ids[PREFIX : PREFIX + new]

        def step(r: FastRunner, new_ids: torch.Tensor = new_ids, new: int = new) -> torch.Tensor:
            if new == 1:
                return r.decode(int(new_ids[0]), PREFIX, 0)
            return r.prefill(new_ids, PREFIX, 0)

        logits = {k: step(r) for k, r in runners.items()}
        kept |= {f"{m.name} {name} {k}": v.cpu() for k, v in logits.items()}
        ref = logits["skinny"] if quant else model.forward_reference(new_ids, PREFIX, cache, 0)
        same = " ".join(f"{n}:{bool((logits[n].argmax(-1) == ref.argmax(-1)).all())}" for n in names)
        samples: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(ROUNDS):
            for k, r in runners.items():
                samples[k].append(median_ms(lambda r=r: step(r).argmax(-1), reps))
        ms = {k: statistics.median(v) for k, v in samples.items()}
        print(
            f"{name:17s} "
            + " ".join(f"{ms[n]:9.3f}" for n in names)
            + f" {ms['auto'] / floor:10.2f}  "
            + " ".join(f"{rel(logits[n], ref):9.2e}" for n in names)
        )
        print("  rounds: " + "; ".join(f"{n} " + ", ".join(f"{x:.3f}" for x in samples[n]) for n in names))
        print(f"  same argmax as {'the plain variant' if quant else 'the reference'}: {same}")
    del runners, model, cache
    torch.cuda.empty_cache()
    return kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1.3B,6.7B")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quant", choices=["awq"], default=None)
    ap.add_argument("--save", type=Path, default=None, help="every step and variant's logits (torch.save)")
    args = ap.parse_args()
    copy_bw, _ = measure_floors(torch.device("cuda"))
    kept: dict[str, torch.Tensor] = {}
    for name in args.shapes.split(","):
        kept |= run_shape(shapes.by_name(name), args.reps, copy_bw, args.quant)
    if args.save:
        torch.save(kept, args.save)


if __name__ == "__main__":
    main()
