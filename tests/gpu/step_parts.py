"""A step's graph in parts (engine/step_graphs.py), on the GPU: the same logits as one graph, what the
cuts cost a decode step, and how long a stale step keeps the GPU once the engine is told to stop.

    python -m tests.gpu.step_parts [--shapes 1.3b,6.7b,33b] [--ctx 4096] [--stops 40] [--parts 1,auto]
        [--ahead 1,0]

Random bf16 weights of the shape, the fast path as the engine builds it (buckets 1 and 4, cuBLAS GEMMs so
both runners compute the same kernels), one slot filled by a `ctx`-token prefill. For each part count of
`--parts` (default: 1 and the engine's own count; the first is the reference): the decode and 4-token
logits (compared bit for bit), the decode step's replay time by CUDA events (median of 30), and the stop:
a decode step is started, and after a random delay within one step `interrupted` starts saying yes;
"stop" is the time from then until the GPU is idle (what a new keystroke would wait for), mean and p90
over `--stops` steps.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from typing import Any

import torch

from lsp_dscoder.bench_build import build_shape, release
from lsp_dscoder.bench_engine import start_engine_measured


def _replay_ms(runner: Any, reps: int = 30) -> float:
    times = []
    for _ in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        runner.decode(7, runner.ctx, 0)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[3:])


def _stops(runner: Any, step_ms: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    waits = []
    for _ in range(n):
        torch.cuda.synchronize()
        flag = threading.Event()
        told: list[float] = []

        def tell(told: list[float] = told, flag: threading.Event = flag) -> None:
            told.append(time.perf_counter())
            flag.set()

        timer = threading.Timer(rng.uniform(0.0, step_ms / 1e3), tell)
        timer.start()
        out = runner.decode(7, runner.ctx, 0, flag.is_set)
        if out is not None:
            out.sum().item()  # a step that ended before the flag: the engine's sample waits for it
        timer.join()
        torch.cuda.synchronize()
        waits.append(1e3 * (time.perf_counter() - told[0]) if told else 0.0)
    return waits


def run_shape(
    shape: str, ctx: int, stops: int, counts: list[int | None], aheads: list[int]
) -> list[dict[str, Any]]:
    built = build_shape(shape, with_hf=False)
    cfg = built.cfg
    results: list[dict[str, Any]] = []
    first: dict[str, torch.Tensor] = {}
    for parts, ahead in [(p, a) for p in counts for a in aheads]:
        engine, _ = start_engine_measured(
            cfg, built.weights, ctx + 64, buckets=(1, 4), gemm="cublas", parts=parts
        )
        runner: Any = engine.runner
        runner.ahead = ahead
        gen = torch.Generator("cuda").manual_seed(0)
        ids = torch.randint(2, cfg.vocab_size, (ctx + 4,), device="cuda", generator=gen)
        runner.prefill(ids[:ctx], 0, 0)
        runner.ctx = ctx
        logits = {"decode": runner.decode(int(ids[ctx]), ctx, 0), "extend": runner.prefill(ids[ctx:], ctx, 0)}
        step_ms = _replay_ms(runner)
        waits = sorted(_stops(runner, step_ms, stops))
        r: dict[str, Any] = {
            "shape": shape,
            "parts": runner.parts,
            "ahead": ahead,
            "decode_step_ms": round(step_ms, 4),
            "stop_mean_ms": round(statistics.mean(waits), 3),
            "stop_p90_ms": round(waits[int(0.9 * len(waits))], 3),
        }
        for kind, value in logits.items():
            if kind in first:
                r[f"{kind}_bit_equal"] = bool(torch.equal(value, first[kind]))
                r[f"{kind}_max_abs_diff"] = float((value - first[kind]).abs().max())
            else:
                first[kind] = value.clone()
        results.append(r)
        print(json.dumps(r), flush=True)
        del engine, runner
        release()
    del built
    release()
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1.3b,6.7b,33b")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--stops", type=int, default=40)
    ap.add_argument("--parts", default="1,auto", help="part counts to compare, the first the reference")
    ap.add_argument("--ahead", default="1", help="parts queued behind the running one, to compare")
    args = ap.parse_args()
    counts = [None if c == "auto" else int(c) for c in args.parts.split(",")]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for shape in args.shapes.split(","):
        run_shape(shape, args.ctx, args.stops, counts, [int(a) for a in args.ahead.split(",")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
