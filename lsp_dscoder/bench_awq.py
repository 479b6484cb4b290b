"""`lsp-dscoder bench --quant awq`: the fast path on INT4 AWQ weights next to bf16 on the same weights, in
one run (GPU), at the DeepSeek-Coder shapes.

The bf16 weights are random (seeded per tensor name); the AWQ model is those weights quantized on the GPU
(round to nearest, group 128, kernels/awq_format.py), so both runs compute the same function and their
logits can be compared. Each AWQ step is set against the larger of its FLOPs at the measured GEMM rate and
its weight-read floor: the packed weights, zeros and scales, plus the bf16 LM head (embedding rows are a
few KB), plus the KV cache read, at the measured copy bandwidth. A 32-token paste is the step between a
keystroke and a line, where the engine's warm-up chooses between streaming the packed weights and
dequantizing them (engine/awq_fast.py).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch

from lsp_dscoder.bench_engine import choice_line, gemm_choice, long_steps, start_engine, steps_line
from lsp_dscoder.bench_measure import flop_ms, measure, measure_floors
from lsp_dscoder.engine.awq import AwqConfig
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.weights import Weights, expected_shapes, weights_from_tensors
from lsp_dscoder.kernels.awq_format import pack_int4, quantize_groups

SCENARIOS = {  # name: (new tokens, cached prefix)
    "keystroke +4 @4K": (4, 4096),
    "paste +32 @4K": (32, 4096),
    "line +256 @4K": (256, 4096),
    "decode @4K": (1, 4096),
    "cold 4K": (4096, 0),
}


def int4_bytes(cfg: ModelConfig, group: int) -> float:
    """Bytes a step reads from the weights of an AWQ model: per linear (out, in) in/2 * out of nibbles,
    plus fp16 scales and packed zeros per group; the LM head in bf16."""
    c, i = cfg.hidden_size, cfg.intermediate_size
    mats = [(cfg.q_size + 2 * cfg.kv_size, c), (c, cfg.q_size), (2 * i, c), (c, i)]
    per_layer = sum(o * k / 2 + (k // group) * o * (2 + 0.5) for o, k in mats)
    return cfg.num_layers * per_layer + 2 * c * cfg.vocab_size


def floor_ms(cfg: ModelConfig, new: int, prefix: int, weight_bytes: float, copy_tbps: float) -> float:
    kv = cfg.num_layers * 2 * cfg.kv_size * 2 * (prefix + new)
    return (weight_bytes + kv) / (copy_tbps * 1e9)


def seeded_dense(cfg: ModelConfig, device: torch.device) -> Callable[[str], torch.Tensor]:
    """name -> bf16 tensor, the same values on every call (a generator seeded by the name)."""
    shapes = expected_shapes(cfg)

    def get(name: str) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shapes[name], device=device, dtype=torch.bfloat16)
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
        t = torch.empty(shapes[name], device=device, dtype=torch.bfloat16)
        return t.normal_(0.0, 0.02, generator=gen)

    return get


def awq_weights(raw: dict[str, Any], group: int, device: torch.device) -> Weights:
    """The seeded dense weights of config `raw`, every layer matrix quantized on the device, kept packed."""
    cfg = ModelConfig.from_dict(raw, "bench shape")
    dense = seeded_dense(cfg, device)
    done: dict[str, tuple[torch.Tensor, ...]] = {}

    def get(name: str) -> torch.Tensor:
        base, part = name.rsplit(".", 1)
        if part not in ("qweight", "qzeros", "scales"):
            return dense(name)
        if base not in done:
            done.clear()  # one matrix at a time: its three parts are asked for in a row
            q, zeros, scales = quantize_groups(dense(base + ".weight").T, group)  # W.T (in, out)
            done[base] = (pack_int4(q), pack_int4(zeros), scales)
        return done[base][("qweight", "qzeros", "scales").index(part)]

    qcfg = ModelConfig.from_dict({**raw, "quantization_config": AwqConfig(group).to_dict()}, "bench shape")
    return weights_from_tensors(get, qcfg, device, torch.bfloat16, packed=True)


def run_one(cfg: ModelConfig, weights: Weights, reps: int, ids: torch.Tensor) -> dict[str, Any]:
    floors = measure_floors()
    torch.cuda.reset_peak_memory_stats()
    built = start_engine(cfg, weights, max_context=4096 + 256 + 64)
    logits = built.runner.prefill(ids, 0, 0)
    rows = {
        name: measure(built.runner, None, cfg, n, pre, reps, floors) for name, (n, pre) in SCENARIOS.items()
    }
    gib = torch.cuda.max_memory_allocated() / 2**30
    return {
        "rows": rows,
        "gib": gib,
        "warmup_s": built.warmup_s,
        "logits": logits,
        "floors": floors,
        "chosen": gemm_choice(built.runner),
        "long_steps": long_steps(built.runner),
    }


def bench_shape(shape: str, reps: int, group: int) -> dict[str, Any]:
    from lsp_dscoder.bench import hf_config

    dev = torch.device("cuda")
    raw = hf_config(shape)
    cfg = ModelConfig.from_dict(raw, source=f"{shape} shape")
    ids = torch.randint(2, cfg.vocab_size, (512,), device=dev, generator=torch.Generator(dev).manual_seed(1))
    began = time.perf_counter()
    awq = run_one(cfg, awq_weights(raw, group, dev), reps, ids)
    print(f"{shape}: AWQ measured after {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    torch.cuda.empty_cache()
    bf16 = run_one(cfg, weights_from_tensors(seeded_dense(cfg, dev), cfg, dev, torch.bfloat16), reps, ids)
    torch.cuda.empty_cache()
    a, b = awq.pop("logits").float(), bf16.pop("logits").float()
    parity = {"rel_l2": float((a - b).norm() / b.norm()), "argmax_equal": bool(a.argmax() == b.argmax())}
    copy = bf16["floors"]["copy_tbps"]
    w4 = int4_bytes(cfg, group)
    for name, (new, pre) in SCENARIOS.items():  # the packed weights' read, or the FLOPs
        t_mem, t_flop = floor_ms(cfg, new, pre, w4, copy), flop_ms(cfg, new, pre, bf16["floors"])
        awq["rows"][name]["floor_ms"] = max(t_mem, t_flop)
        awq["rows"][name]["bound"] = "INT4 bytes" if t_mem >= t_flop else "FLOP"
    return {"shape": shape, "group": group, "awq": awq, "bf16": bf16, "parity_vs_bf16": parity}


def print_table(r: dict[str, Any]) -> None:
    f = r["bf16"]["floors"]
    print(f"\n## {r['shape']} shape: AWQ INT4 (group {r['group']}) vs bf16, same weights "
          f"(copy {f['copy_tbps']:.2f} TB/s, GEMM {f['gemm_tflops']:.0f} TFLOP/s)")  # fmt: skip
    print("| scenario | bf16 ms | bf16 floor ms | AWQ ms | AWQ floor ms | AWQ/floor | bf16/AWQ |")
    print("|---|---|---|---|---|---|---|")
    for name in SCENARIOS:
        b, a = r["bf16"]["rows"][name], r["awq"]["rows"][name]
        print(f"| {name} | {b['ours_ms']:.3f} | {b['floor_ms']:.3f} | {a['ours_ms']:.3f} | "
              f"{a['floor_ms']:.3f} ({a['bound']}) | {a['ours_ms'] / a['floor_ms']:.2f} | "
              f"{b['ours_ms'] / a['ours_ms']:.2f}x |")  # fmt: skip
    print(f"| GPU memory GiB (peak) | {r['bf16']['gib']:.2f} | | {r['awq']['gib']:.2f} | | | |")
    p = r["parity_vs_bf16"]
    print(f"warm-up s: bf16 {r['bf16']['warmup_s']:.1f}, AWQ {r['awq']['warmup_s']:.1f}; 512-token prompt, "
          f"AWQ vs bf16 logits: rel. L2 {p['rel_l2']:.3f}, same argmax {p['argmax_equal']}")  # fmt: skip
    for kind in ("bf16", "awq"):
        print(f"{kind}: {choice_line(r[kind]['chosen'])}; {steps_line(r[kind]['long_steps'])}")


def run_awq(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for shape in (args.shapes or "1.3b,6.7b").split(","):
        r = bench_shape(shape, args.reps, args.group_size)
        results.append(r)
        if not args.json:
            print_table(r)
    return results
