"""The skinny GEMM on a CUDA GPU at DeepSeek-Coder layer shapes: correctness against its reference, weight
bandwidth against the measured copy bandwidth, and cuBLAS (what the fast path ran before) side by side.

    python -m lsp_dscoder.kernels.check_skinny --out DIR [--budget-s 120] [--models 1.3B,6.7B]

Timing as in check_gpu: several weight sets (together a few times the L2 cache, as a model's layers are),
one launch per set captured in a CUDA graph, median replay time per launch. "GB/s" counts the bytes a
launch must move (W once, x, y); "copy%" is that rate over the measured device copy rate (read + write).
The sweep tries other tiles per shape while time lasts, so the default can be checked against the best.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from .check_cases import randn, rel_err
from .check_gpu import capture, measure_floors
from .shapes import MODELS, Model
from .silu_mul import silu_mul
from .skinny_gemm import skinny_gemm, skinny_gemm_ref
from .skinny_plan import SkinnyConfig, SkinnyWorkspace, default_config

ROWS = (1, 4, 16)
SWEEP = (
    SkinnyConfig(16, 256, 1, 4, 4),
    SkinnyConfig(16, 256, 2, 4, 4),
    SkinnyConfig(16, 256, 4, 4, 4),
    SkinnyConfig(16, 512, 1, 4, 3),
    SkinnyConfig(16, 128, 2, 4, 6),
    SkinnyConfig(32, 256, 1, 4, 4),
    SkinnyConfig(32, 256, 2, 4, 4),
    SkinnyConfig(32, 512, 2, 8, 3),
    SkinnyConfig(64, 128, 4, 4, 4),
    SkinnyConfig(64, 256, 8, 8, 3),
)


def short(cfg: SkinnyConfig) -> str:
    return f"N{cfg.block_n} K{cfg.block_k} split{cfg.split_k} w{cfg.num_warps} st{cfg.num_stages}"


def matrices(m: Model) -> list[tuple[str, int, int, bool]]:
    """(name, N, K, swiglu) of one layer's GEMMs and the LM head."""
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    return [
        ("qkv", qkv, m.hidden, False),
        ("o", m.hidden, m.heads * m.head_dim, False),
        ("gate_up", 2 * m.inter, m.hidden, False),
        ("down", m.hidden, m.inter, True),
        ("lm_head", 32256, m.hidden, False),
    ]


def launches(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    outs: list[torch.Tensor],
    swiglu: bool,
    workspace: SkinnyWorkspace | None,
    cfg: SkinnyConfig | None,
) -> list[Callable[[], object]]:
    """One launch per weight set: the skinny GEMM, or without a workspace what the fast path ran before
    (cuBLAS)."""

    def one(w: torch.Tensor, o: torch.Tensor) -> object:
        # The down projection as the fast path runs it: the SwiGLU kernel, then the GEMM. (The kernel's
        # fused SwiGLU prologue measured slower: docs/kernels.md.)
        a = silu_mul(x) if swiglu else x
        if workspace is not None:
            return skinny_gemm(a, w, out=o, config=cfg, workspace=workspace)
        return torch.matmul(a, w.T, out=o)

    return [partial(one, w, o) for w, o in zip(weights, outs, strict=True)]


def graph_us(launches: list[Callable[[], object]]) -> float:
    """Median microseconds per launch of one CUDA graph holding all `launches`."""
    graph = capture(launches)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: list[float] = []
    for _ in range(25):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(launches))
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget-s", type=float, default=120.0, help="stop the tile sweep past this")
    parser.add_argument("--models", default="1.3B,6.7B")
    args = parser.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    bw, _ = measure_floors(dev)
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20)
    log(f"copy {bw / 1e12:.2f} TB/s (read+write); {torch.cuda.get_device_name(dev)}")
    log(
        f"{'model':5s} {'matrix':8s} {'M':>2s} {'cuBLAS us':>9s} {'skinny us':>9s} {'floor us':>8s} "
        f"{'GB/s':>6s} {'copy%':>5s} {'speedup':>7s} {'best sweep us':>13s} {'best config':34s} rel err"
    )
    failures = 0
    workspace = SkinnyWorkspace.allocate(32256, 8, dev)
    names = {n.lower() for n in args.models.split(",")}
    for model in (m for m in MODELS if m.name.lower() in names):
        for name, n, k, swiglu in matrices(model):
            w_bytes = n * k * 2
            sets = max(2, min(24, math.ceil(3 * l2 / w_bytes)))
            weights = [randn(n, k, dev=dev) for _ in range(sets)]
            for m in ROWS:
                x = randn(m, 2 * k if swiglu else k, dev=dev)
                outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in weights]
                io = w_bytes + x.numel() * 2 + m * n * 2
                floor = io / bw * 1e6

                ours = partial(launches, x, weights, outs, swiglu, workspace)
                cublas = partial(launches, x, weights, outs, swiglu, None)

                outs[0].fill_(float("nan"))
                ours(None)[0]()
                err = rel_err(outs[0], skinny_gemm_ref(silu_mul(x) if swiglu else x, weights[0]))
                ok = err < 1e-2
                failures += not ok
                t_cublas, t_ours = graph_us(cublas(None)), graph_us(ours(None))
                best_us, best = t_ours, f"default {short(default_config(m, n, k, dev))}"
                for cfg in SWEEP:
                    if time.time() - t0 > args.budget_s:
                        break
                    try:
                        us = graph_us(ours(cfg))
                    except Exception as exc:  # a config that does not compile must not end the run
                        log(f"  {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    if us < best_us:
                        best_us, best = us, short(cfg)
                log(
                    f"{model.name:5s} {name:8s} {m:2d} {t_cublas:9.2f} {t_ours:9.2f} {floor:8.2f} "
                    f"{io / t_ours / 1e3:6.0f} {100 * floor / t_ours:5.0f} {t_cublas / t_ours:6.2f}x "
                    f"{best_us:13.2f} {best[:34]:34s} {err:.1e}{'' if ok else ' WRONG'}"
                )
            del weights
            torch.cuda.empty_cache()
    log(f"done in {time.time() - t0:.0f} s, {failures} failing case(s)")
    if args.out:
        (args.out / "check_skinny.log").write_text("\n".join(lines) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
