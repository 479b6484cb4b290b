"""`lsp-dscoder bench` (engine): the fast path against transformers on the same weights and the floors.

Scenarios (GPU time by CUDA events, median of repetitions): cold prefill of 512/2K/4K/8K tokens, a
keystroke (4 new tokens over 4K cached), a line change (256 over 4K), a decode step at 4K. A prompt runs
in the steps the engine takes (`prefill_steps`: 512 tokens, or a long prefill graph where the model has
them), so "graph replays/step" counts them. Floors come from the GEMM rate and copy bandwidth this command
measures itself. How a scenario is timed, and its floor: bench_measure.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from lsp_dscoder.bench_measure import measure, measure_floors
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.factory import Assembly
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import Weights

# name: (new tokens, cached prefix)
SCENARIOS = {
    "cold 512": (512, 0),
    "cold 2K": (2048, 0),
    "cold 4K": (4096, 0),
    "cold 8K": (8192, 0),
    "keystroke +4 @4K": (4, 4096),
    "line +256 @4K": (256, 4096),
    "decode @4K": (1, 4096),
}


def gemm_choice(runner: Any) -> dict[int, str]:
    """The fast path's choice per graph bucket, timed at warm-up (none for other runners)."""
    return dict(getattr(runner, "chosen", {}))


def choice_line(chosen: dict[int, str]) -> str:
    return "GEMM choice per graph bucket (tokens: choice): " + ", ".join(
        f"{b}: {c}" for b, c in chosen.items()
    )


def long_steps(runner: Any) -> dict[str, list[int]]:
    """The prefill steps past the engine's chunk that the fast path takes: as graphs, and eagerly."""
    return {
        "long": list(getattr(runner, "long_buckets", ())),
        "eager": list(getattr(runner, "eager_buckets", ())),
    }


def steps_line(steps: dict[str, list[int]]) -> str:
    return f"long prefill steps (tokens): graphs {steps['long'] or 'none'}, eager {steps['eager'] or 'none'}"


def start_engine(cfg: ModelConfig, weights: Weights, max_context: int, slots: int = 1) -> Assembly:
    """The fast path as the engine builds it, on CUDA in bf16."""
    return start_engine_measured(cfg, weights, max_context, slots)[0]


def start_engine_measured(
    cfg: ModelConfig, weights: Weights, max_context: int, slots: int = 1, **options: Any
) -> tuple[Assembly, dict[str, int]]:
    """start_engine, built piece by piece as engine/factory.py's `assemble` does (fast path only), with the
    GPU memory of each piece measured around its allocation: the KV buffer, the runner's own buffers (rotary
    table, split-K workspace), the CUDA-graph pool. `options` go to FastRunner (probes of variants)."""
    from lsp_dscoder.engine.fast import FastRunner
    from lsp_dscoder.engine.fast_choices import BUCKETS

    dev, dt = torch.device("cuda"), torch.bfloat16
    before = torch.cuda.memory_allocated()
    cache = KVCache(cfg, slots, max_context, dev, dt, pad=max(BUCKETS))
    kv = torch.cuda.memory_allocated() - before
    started = time.perf_counter()
    before = torch.cuda.memory_allocated()
    runner = FastRunner(Transformer(cfg, weights, cache.capacity), cache, **options)
    buffers = torch.cuda.memory_allocated() - before
    runner.capture()
    built = Assembly(runner.model, cache, runner, True, time.perf_counter() - started)
    return built, {"kv_buffer": kv, "runner_buffers": buffers, "graph_pool": runner.graph_pool_bytes}


def startup_times(shape: str) -> dict[str, float | None]:
    """Warm-up (kernel compile + graph capture) in a fresh process with an empty Triton cache, then again
    in a second fresh process with the cache the first one left: the second start."""
    out: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**os.environ, "TRITON_CACHE_DIR": cache_dir}
        for name in ("first start", "second start"):
            cmd = [sys.executable, "-m", "lsp_dscoder", "bench", "--startup-probe", shape]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            ok = res.returncode == 0
            out[name] = json.loads(res.stdout.strip().splitlines()[-1])["warmup_s"] if ok else None
    return out


def parity(built: Assembly, hf: Any, cfg: ModelConfig) -> dict[str, float]:
    """Logits of a 512-token prompt: fast vs reference vs transformers (bf16) vs transformers in fp32.
    The fp32 rows need an fp32 copy of the weights next to the bf16 ones: skipped where it does not fit
    (the 33B shape: 132 GB more)."""
    from lsp_dscoder.bench_build import share

    ids = torch.randint(2, cfg.vocab_size, (512,), device="cuda")
    fast = built.runner.prefill(ids, 0, 0)
    assert fast is not None  # None only when an interrupted check stops it; none is passed here
    ref = built.model.forward_reference(ids, 0, built.cache, 0)
    rows = {"fast vs reference": (fast, ref)}
    # A decode step and a 4-token step (graph replays: the skinny path and its fusions) against the
    # reference on the same cache: each reference step rewrites the rows the fast one wrote before it.
    step = built.runner.decode(int(ids[0]), 512, 0)
    assert step is not None  # as above
    rows["fast vs reference, decode step"] = (
        step,
        built.model.forward_reference(ids[:1], 512, built.cache, 0),
    )
    step = built.runner.prefill(ids[1:5], 513, 0)
    assert step is not None
    rows["fast vs reference, 4-token step"] = (
        step,
        built.model.forward_reference(ids[1:5], 513, built.cache, 0),
    )
    if hf is not None:
        with torch.no_grad():
            hf_bf16 = hf(ids[None], logits_to_keep=1).logits[0].float()
            rows["fast vs transformers"] = (fast, hf_bf16)
            free, _ = torch.cuda.mem_get_info()
            if free > 2.2 * sum(p.numel() * p.element_size() for p in hf.parameters()):
                truth = hf.float()(ids[None], logits_to_keep=1).logits[0].float()
                share(hf, cfg, built.model.w)  # back onto the bf16 tensors; the fp32 copies go
                rows |= {
                    "fast vs fp32": (fast, truth),
                    "reference vs fp32": (ref, truth),
                    "transformers bf16 vs fp32": (hf_bf16, truth),
                }
    return {k: float((a - b).norm() / b.norm()) for k, (a, b) in rows.items()}


def bench_model(
    label: str, cfg: ModelConfig, weights: Weights, hf: Any, reps: int, memory: dict[str, int] | None = None
) -> dict[str, Any]:
    """The scenario table of one model. `memory`: bytes already measured (weights), to which the engine's
    pieces and the peak are added."""
    started = time.perf_counter()

    def progress(what: str) -> None:  # on stderr: the tables stay on stdout
        print(f"[{label}] {what} at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    floors = measure_floors()
    torch.cuda.reset_peak_memory_stats()
    built, pieces = start_engine_measured(cfg, weights, max_context=8192 + 64)
    progress(f"warm-up done ({built.warmup_s:.1f} s)")
    result: dict[str, Any] = {"model": label, "floors": floors, "warmup_s": built.warmup_s, "rows": []}
    result["gemm_choice"] = gemm_choice(built.runner)
    result["long_steps"] = long_steps(built.runner)
    result["parity_rel_l2"] = parity(built, hf, cfg)
    progress("parity done")
    for name, (new, prefix) in SCENARIOS.items():
        row = measure(built.runner, hf, cfg, new, prefix, reps, floors)
        result["rows"].append({"scenario": name, **row})
        progress(f"{name}: ours {row['ours_ms']:.3f} ms, transformers {row['transformers_ms']} ms")
    result["memory_bytes"] = {**(memory or {}), **pieces, "peak": torch.cuda.max_memory_allocated()}
    return result


def run_engine(args: Any) -> int:
    """The engine benchmark over random-weight shapes (args as `lsp-dscoder bench` parses them): one shape
    at a time, each model and its transformers twin freed before the next is built."""
    from lsp_dscoder.bench import _has_transformers
    from lsp_dscoder.bench_build import build_shape, release

    with_hf = not args.no_transformers and _has_transformers()
    results = []
    for shape in (args.shapes or "1.3b,6.7b").split(","):
        release()
        started = time.perf_counter()
        built = build_shape(shape, with_hf)
        print(f"[{shape}] built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        memory = {"weights": built.weight_bytes, "transformers_twin": built.twin_bytes}
        label = f"DeepSeek-Coder {shape} shape, random weights"
        r = bench_model(label, built.cfg, built.weights, built.hf, args.reps, memory)
        del built
        release()
        if not args.no_startup:
            r["startup"] = startup_times(shape)
        results.append(r)
        if not args.json:
            print_table(r)
    if args.json:
        gpu = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        print(json.dumps({**gpu, "results": results}, indent=2))
    return 0


def print_table(r: dict[str, Any]) -> None:
    f = r["floors"]
    print(
        f"\n## {r['model']}  (bf16; measured floors: GEMM {f['gemm_tflops']:.0f} TFLOP/s, "
        f"copy {f['copy_tbps']:.2f} TB/s)"
    )
    print(
        "| scenario | ours ms (GPU) | ours ms (host, incl. sync) | transformers ms | floor ms | ours/floor | "
        "transformers/ours | graph replays / eager forwards |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        hf, ours = row["transformers_ms"], row["ours_ms"]
        hf_text = f"{hf:.3f}" if hf else "n/a"
        speedup = f"{hf / ours:.1f}x" if hf else "n/a"
        print(
            f"| {row['scenario']} | {ours:.3f} | {row['ours_host_ms']:.3f} | {hf_text} | "
            f"{row['floor_ms']:.3f} ({row['bound']}) | {ours / row['floor_ms']:.2f} | {speedup} | "
            f"{row['graph_replays_per_step']:.0f} / {row['eager_forwards_per_step']:.0f} |"
        )
    starts = ", ".join(
        f"{k}: {v:.1f} s" if v is not None else f"{k}: failed" for k, v in r.get("startup", {}).items()
    )
    print(f"warm-up in this process: {r['warmup_s']:.1f} s; {starts}")
    if r.get("gemm_choice"):
        print(choice_line(r["gemm_choice"]))
    if "long_steps" in r:
        print(steps_line(r["long_steps"]))
    if "memory_bytes" in r:
        print(
            "GPU memory (GB, measured around each allocation): "
            + ", ".join(f"{k.replace('_', ' ')} {v / 1e9:.2f}" for k, v in r["memory_bytes"].items())
        )
    print(
        "logits rel. L2 error (512-token prompt): "
        + ", ".join(f"{k} {v:.2e}" for k, v in r["parity_rel_l2"].items())
    )


def main() -> int:
    """`python -m lsp_dscoder.bench_engine` takes `lsp-dscoder bench`'s options (random-weight shapes)."""
    import argparse

    from lsp_dscoder.bench import add_arguments

    parser = argparse.ArgumentParser(prog="python -m lsp_dscoder.bench_engine")
    add_arguments(parser)
    return run_engine(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
