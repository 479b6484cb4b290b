"""Check every kernel against its reference at DeepSeek-Coder shapes on a CUDA GPU and time it against its
floor (bytes over the measured copy bandwidth, FLOPs over the measured bf16 matmul rate).

    python -m lsp_dscoder.kernels.check_gpu --out DIR          # GPU: table on stdout, full log in DIR
    TRITON_INTERPRET=1 python -m lsp_dscoder.kernels.check_gpu --tiny   # CPU: exercises this script

Without an install, link the folder as lsp_dscoder/kernels under a fresh directory P, put P on PYTHONPATH and
run from P, not from the checkout: `python -m` puts the working directory first on sys.path, and the
checkout's own lsp_dscoder/ (the server) has no kernels/ inside.

Timing: each case builds several independent buffer sets (together a few times the L2 cache, as a model's
layers are), captures one launch per set in a CUDA graph, and reports the median replay time per launch:
no Python launch overhead and no L2 reuse, as in the engine's captured decode step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from . import extend_attention as ea
from .check_cases import (
    Call,
    Make,
    attn_case,
    attn_cost,
    fused_decode_case,
    graph_replay_checks,
    randn,
    rms_case,
    rms_gemm_case,
    rope_case,
    silu_case,
    sums_case,
)
from .shapes import MODELS, Model

TINY = (Model("tiny", 64, 4, 2, 40, 16),)


def time_us(make: Make, set_bytes: float, dev: torch.device) -> tuple[float, float]:
    """(median microseconds per launch, reference error of the first launch)."""
    launch, verify = make()
    launch()
    err = verify()
    if dev.type != "cuda":
        t0 = time.perf_counter()
        launch()
        return (time.perf_counter() - t0) * 1e6, err
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20)
    launches = [launch] + [make()[0] for _ in range(max(1, min(15, math.ceil(3 * l2 / set_bytes) - 1)))]
    return replay_us(capture(launches), len(launches)), err


def capture(launches: list[Call]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of all `launches`, each run once first (compiles and autotuning stay outside it)."""
    for f in launches:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in launches:
            f()
    return graph


# Replays before timing and at least this much timed: a replay of a few large launches takes ~0.1 ms, and
# fifteen of them, the first timed on a set of weights, ran 7-8 % slower than the same code timed next
# (docs/awq.md "A register cap"; clocks or translation caches still settling).
WARM_S = 0.03
TIMED_S = 0.03


def replay_us(graph: torch.cuda.CUDAGraph, launches: int) -> float:
    """Median microseconds per launch of `graph` (`launches` launches a replay), after WARM_S of replays;
    at least 15 replays and TIMED_S are timed."""
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    for _ in range(max(3, math.ceil(WARM_S / one))):
        graph.replay()
    torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(max(15, math.ceil(TIMED_S / one))):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def median_ms(fn: Call, reps: int = 10) -> float:
    """Median of device-event timings after warm-up (for the large, single-launch floor measurements)."""
    for _ in range(3):
        fn()
    times: list[float] = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_floors(dev: torch.device) -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s), both on random data."""
    if dev.type != "cuda":
        return 1e11, 1e12
    a = torch.randn(2**28, device=dev)  # 1 GiB
    b = torch.empty_like(a)
    bw = 2 * a.numel() * 4 / (median_ms(lambda: b.copy_(a)) * 1e-3)
    x, y = randn(8192, 8192, dev=dev), randn(8192, 8192, dev=dev)
    rate = 2 * 8192**3 / (median_ms(lambda: x @ y) * 1e-3)
    return bw, rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--budget-s", type=float, default=230.0, help="skip the tuning sweeps past this")
    args = parser.parse_args()
    t_begin = time.time()
    dev = torch.device("cpu" if args.tiny else "cuda")
    models = TINY if args.tiny else MODELS
    tokens: tuple[int, ...]
    if args.tiny:
        tokens, prefixes, max_ctx = (1, 3, 17), (0, 37), 64
    else:
        tokens, prefixes, max_ctx = (1, 4, 256, 4096), (0, 4096), 8192
    lines: list[str] = []
    log_file = (args.out / "gpu_check.log").open("w") if args.out else None

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        if log_file:
            log_file.write(line + "\n")
            log_file.flush()

    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        log(
            f"{p.name}, {p.multi_processor_count} SMs, L2 {getattr(p, 'L2_cache_size', 0) >> 20} MiB, "
            f"torch {torch.__version__}, triton {triton.__version__}"
        )
    bw, rate = measure_floors(dev)
    log(f"floors: copy {bw / 1e12:.2f} TB/s (read+write), bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    header = ("op", "model", "shape", "us", "floor", "x", "bound", "rel err", "copy%")
    log("{:8s} {:5s} {:22s} {:>9s} {:>8s} {:>5s} {:5s} {:>8s} {:>6s}".format(*header))
    failures = 0

    def run(op: str, m: Model, shape: str, make: Make, io: float, flops: float) -> None:
        nonlocal failures
        try:
            us, err = time_us(make, io, dev)
        except Exception as exc:  # one failing case must not cost the rest of the run
            failures += 1
            log(f"{op:8s} {m.name:5s} {shape:22s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            return
        floor_io, floor_fl = io / bw * 1e6, flops / rate * 1e6
        floor = max(floor_io, floor_fl)
        ok = err < 1e-2
        failures += not ok
        log(
            f"{op:8s} {m.name:5s} {shape:22s} {us:9.1f} {floor:8.1f} {us / floor:5.1f} "
            f"{'mem' if floor_io >= floor_fl else 'math':5s} {err:8.1e} {100 * floor_io / us:6.0f}"
            f"{'' if ok else '  WRONG'}"
        )
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    for m in models:
        qkv_w = (m.heads + 2 * m.kv_heads) * m.head_dim
        for t in tokens:
            run("rmsnorm", m, f"T={t}", rms_case(m, t, dev), 2 * t * m.hidden * 4 + 2 * m.hidden, 0.0)
            run("silu", m, f"T={t}", silu_case(m, t, dev), 2 * t * m.inter * 3, 0.0)
            if t <= 16:  # what the INT4 GEMM of a small step leaves (kernels/split_sums.py)
                for op, width in (("rmsnorm", m.hidden), ("silu", 2 * m.inter), ("rope", qkv_w)):
                    run(op + "+", m, f"T={t} sums", sums_case(m, op, t, dev), t * width * 6, 0.0)
            start = min(prefixes[-1], max_ctx - t)
            run(
                "rope",
                m,
                f"T={t} start={start}",
                rope_case(m, t, start, max_ctx, dev),
                2 * t * qkv_w * 2 + t * m.head_dim * 4,
                0.0,
            )
            for prefix in prefixes:
                if prefix + t <= max_ctx:
                    run(
                        "extend",
                        m,
                        f"T={t} prefix={prefix}",
                        attn_case(m, t, prefix, max_ctx, dev, False),
                        *attn_cost(m, t, prefix),
                    )
        for kv_len in (max_ctx // 16, max_ctx // 2, max_ctx):
            run(
                "decode",
                m,
                f"L={kv_len}",
                attn_case(m, 1, kv_len - 1, max_ctx, dev, True),
                *attn_cost(m, 1, kv_len - 1),
            )
            cost = attn_cost(m, 1, kv_len - 1)
            run("decode+", m, f"L={kv_len} own combine", fused_decode_case(m, kv_len, max_ctx, dev), *cost)
        for t in tokens[:2]:  # the skinny steps: decode and a keystroke
            for name, n_out in (("qkv", qkv_w), ("gate_up", 2 * m.inter)):
                glu = name == "gate_up"
                io = 2 * (n_out * m.hidden + t * (3 * m.hidden + (n_out // 2 if glu else n_out)))
                run(
                    "rmsgemm",
                    m,
                    f"{name}{'+glu' if glu else ''} T={t}",
                    rms_gemm_case(m, t, n_out, dev, glu),
                    io,
                    2.0 * t * n_out * m.hidden,
                )
    for m in models:
        try:
            failures += graph_replay_checks(m, max_ctx, dev, log) >= 1e-2
        except Exception as exc:  # logged; the sweeps below still run
            failures += 1
            log(f"graph replay {m.name} FAILED {type(exc).__name__}: {str(exc)[:300]}")

    # Tuning sweeps: other tiles for prefill, other split counts for short queries, while time lasts.
    m67, m33 = models[min(1, len(models) - 1)], models[-1]
    big_t, prefix = tokens[-1], prefixes[-1]
    sweeps: list[tuple[str, Model, str, Make, tuple[float, float], tuple[int, ...] | None]] = []
    tiles: tuple[int, ...] | None
    for tiles in ((128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4)):
        for m, t, pre in ((m67, big_t, 0), (m33, big_t, prefix)):
            sweeps.append(
                (
                    "extend*",
                    m,
                    f"T={t} p={pre} {tiles}",
                    attn_case(m, t, pre, max_ctx, dev, False),
                    attn_cost(m, t, pre),
                    tiles,
                )
            )
    for splits in (2, 4) if args.tiny else (4, 8, 16, 32):
        for m, t, decode in ((m67, 4, False), (m67, 1, True), (m33, 1, True)):
            sweeps.append(
                (
                    ("decode*" if decode else "extend*"),
                    m,
                    f"T={t} p={prefix} S={splits}",
                    attn_case(m, t, prefix - (1 if decode else 0), max_ctx, dev, decode, splits),
                    attn_cost(m, t, prefix),
                    None,
                )
            )
    default_tiles = ea.tiles_for
    for op, m, shape, make, cost, tiles in sweeps:
        if dev.type == "cuda" and time.time() - t_begin > args.budget_s:
            log(f"sweep stopped at {time.time() - t_begin:.0f} s (budget {args.budget_s:.0f} s)")
            break
        if tiles is not None and not args.tiny:  # the interpreter keeps its own small tiles

            def swept_tiles(rows: int, tiles: tuple[int, ...] = tiles) -> ea.Tiles:
                return ea.Tiles(*tiles) if rows > 64 else default_tiles(rows)

            ea.tiles_for = swept_tiles
        run(op, m, shape, make, *cost)
        ea.tiles_for = default_tiles
    log(f"done in {time.time() - t_begin:.0f} s, {failures} failing case(s)")
    if log_file:
        log_file.close()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
