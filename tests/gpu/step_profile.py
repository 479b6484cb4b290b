"""Where one decode step's GPU time goes: every kernel of the captured graph timed by the profiler (CUPTI),
per position within a layer against that kernel's own byte floor, and the gaps between kernels.

    python -m tests.gpu.step_profile [--shapes 1.3b,6.7b] [--ctx 4096] [--tokens 1] [--variants ...]
                                     [--quant awq]

Random weights of the DeepSeek-Coder shape (bf16; with `--quant awq` the bench's INT4 weights, and the
GEMMs' floors in packed bytes), the fast path as `lsp-dscoder bench` builds it, one KV
slot filled by a `ctx`-token prefill, then the step's graph (bucket `tokens`, 1: decode) replayed: its
time by CUDA events (median of 30), then 5 replays under the profiler. "gaps" = replay span - sum of
kernel times: the time the GPU spends between kernels of the graph. Floors: bytes the kernel must move /
the measured copy rate. Variants (FastRunner options) run on the same weights and prompt; their logits
are compared with the first variant's.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.bench import hf_config
from lsp_dscoder.bench_awq import awq_weights
from lsp_dscoder.bench_build import build_shape, release
from lsp_dscoder.bench_engine import start_engine_measured
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.kernels.check_gpu import measure_floors
from lsp_dscoder.kernels.split_kv import choose_num_splits

GEMMS = ("qkv", "o", "gate_up", "down")  # the GEMMs of a layer in launch order
# Kernel name -> role; every other kernel of a layer is one of its GEMMs (cuBLAS or the skinny kernel).
NAMED = {"rms_norm": "norm", "rope": "rope", "decode": "attn", "extend": "attn", "combine": "combine"}
NAMED |= {"silu_mul": "silu"}


def roles_of(window: list[dict[str, Any]]) -> list[str]:
    """Roles of one layer's kernels, from their names; GEMMs in launch order."""
    roles, gemms = [], iter(GEMMS)
    for k in window:
        named = [role for key, role in NAMED.items() if key in k["name"]]
        roles.append(named[0] if named else next(gemms, "other"))
    return roles


def role_bytes(cfg: ModelConfig, ctx: int, splits: int, quant: str | None) -> dict[str, float]:
    """Bytes each kernel of a layer must move at T=1 (weights once, KV read, activations); INT4 AWQ weights
    (group 128): half a byte a weight plus a scale and a zero nibble a group."""
    c, i = cfg.hidden_size, cfg.intermediate_size
    qkv_n = cfg.q_size + 2 * cfg.kv_size
    wb = (0.5 + 2.5 / 128) if quant else 2.0  # bytes a weight
    return {
        "norm": 2 * (4 * c + c),
        "qkv": wb * qkv_n * c,
        "rope": 2 * 2 * qkv_n,
        "attn": 2 * 2 * cfg.kv_size * ctx + 4 * splits * cfg.q_size,
        "combine": 4 * splits * cfg.q_size + 2 * cfg.q_size,
        "o": wb * cfg.q_size * c,
        "gate_up": wb * 2 * i * c,
        "silu": 2 * 3 * i,
        "down": wb * i * c,
    }


def kernels_of(trace: Path) -> list[dict[str, Any]]:
    events = json.loads(trace.read_text())["traceEvents"]
    ks = [e for e in events if e.get("cat") == "kernel"]
    return sorted(ks, key=lambda e: float(e["ts"]))


def layer_windows(ks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The kernels of each layer: from the QKV GEMM (or the norm before it, when separate) to the next. The
    layer's anchor is its RoPE kernel, or its attention kernel where RoPE runs in the QKV GEMM's epilogue."""
    anchor = "rope" if any("rope" in k["name"] for k in ks) else "attention"
    starts = []
    for n, k in enumerate(ks):
        if anchor == "rope" and "rope" in k["name"]:
            starts.append(n - 2 if "rms_norm" in ks[n - 2]["name"] else n - 1)
        elif anchor == "attention" and ("_decode_kernel" in k["name"] or "_extend_kernel" in k["name"]):
            starts.append(n - 1)
    return [ks[a:b] for a, b in zip(starts, [*starts[1:], len(ks)], strict=True)]


VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "fused combine": {"fused_combine": True},
    "skinny": {"gemm": "skinny", "pdl": False, "fused_residual": False},
    "skinny+PDL": {"gemm": "skinny", "pdl": True, "fused_residual": False},
    "fused layer": {"gemm": "skinny", "pdl": False, "fused_residual": True},
    "fused layer+PDL": {"gemm": "skinny", "pdl": True, "fused_residual": True},
}


def profile_shape(
    shape: str, ctx: int, tokens: int, variants: list[str], out: Path | None, quant: str | None = None
) -> list[dict[str, Any]]:
    copy_bps, _ = measure_floors(torch.device("cuda"))
    if quant:  # the bench's seeded weights, quantized (lsp_dscoder/bench_awq.py)
        raw = hf_config(shape)
        cfg, weights = ModelConfig.from_dict(raw), awq_weights(raw, 128, torch.device("cuda"))
    else:
        built = build_shape(shape, with_hf=False)
        cfg, weights = built.cfg, built.weights
    results: list[dict[str, Any]] = []
    first: torch.Tensor | None = None
    for name in variants:
        r = profile_variant(cfg, weights, ctx, tokens, VARIANTS[name], copy_bps, quant)
        logits = r.pop("logits")
        if first is None:
            first = logits
        else:  # the same prompt and weights: the variants' decode logits must agree
            r["logits_rel_l2_vs_first"] = float((logits - first).norm() / first.norm())
        results.append({"shape": shape, "variant": name, **r})
        report(results[-1])  # as it comes: a run cut short keeps what it measured
        if out:
            path = out / f"profile_{shape}_T{tokens}_{name.replace(' ', '_')}.json"
            path.write_text(json.dumps(results[-1], indent=1))
    del weights, first
    release()
    return results


def profile_variant(
    cfg: ModelConfig,
    weights: Any,
    ctx: int,
    tokens: int,
    options: dict[str, Any],
    copy_bps: float,
    quant: str | None = None,
) -> dict[str, Any]:
    max_context = max(8192, ctx) + 64
    engine, memory = start_engine_measured(cfg, weights, max_context, buckets=(tokens,), **options)
    runner: Any = engine.runner
    seeded = torch.Generator("cuda").manual_seed(0)
    ids = torch.randint(2, cfg.vocab_size, (ctx + tokens,), device="cuda", generator=seeded)
    runner.prefill(ids[:ctx], 0, 0)
    # One replay of the step's graph, which also sets its position inputs for the replays below.
    logits = runner.decode(int(ids[-1]), ctx, 0) if tokens == 1 else runner.prefill(ids[ctx:], ctx, 0)
    step = runner.graphs[(0, tokens)]
    times = []
    for _ in range(33):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step.replay(runner.part_done, runner.stream)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    graph_us = statistics.median(times[3:])
    reps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step.replay(runner.part_done, runner.stream)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        ks = kernels_of(trace)
    per = len(ks) // reps
    result: dict[str, Any] = {
        "ctx": ctx,
        "tokens": tokens,
        "copy_tbps": copy_bps / 1e12,
        "graph_us": graph_us,
        "kernels_per_step": per,
        "chosen_gemm": runner.chosen.get(tokens),
        "memory": memory,
        "logits": logits,  # compared across variants, then dropped
    }
    if per == 0:
        # Kernel times from eager forwards of the same step instead (their gaps are the host's launches).
        result["error"] = "the profiler saw no kernels in the graph replays: kernels of eager forwards"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                runner.forward(runner.ids[:tokens], runner.start, runner.last, 0)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            ks = kernels_of(trace)
        result["kernels_per_step"] = len(ks) // reps
    if len(ks) < reps:
        result["error"] = "the profiler saw no kernels"
        return result
    splits = choose_num_splits(cfg.num_kv_heads, engine.cache.capacity, 64, torch.device("cuda"), None)
    result |= analyse(ks, reps, role_bytes(cfg, ctx, splits, quant), copy_bps)
    del runner, engine
    release()
    return result


def analyse(ks: list[dict[str, Any]], reps: int, floors: dict[str, float], copy_bps: float) -> dict[str, Any]:
    """Replay span, kernel sum, and the kernels of a middle layer by position (`ks`: `reps` replays)."""
    per = len(ks) // reps
    spans, sums = [], []
    for r in range(reps):
        step = ks[r * per : (r + 1) * per]
        spans.append(float(step[-1]["ts"]) + float(step[-1]["dur"]) - float(step[0]["ts"]))
        sums.append(sum(float(k["dur"]) for k in step))
    result: dict[str, Any] = {"span_us": statistics.median(spans), "kernel_sum_us": statistics.median(sums)}
    # Layer 0 also holds the residual copy, the last one the final norm and the LM head.
    windows = layer_windows(ks[:per])[1:-1]
    # Layers whose window holds another kernel too (a copy the profiler placed among them) are left out:
    # the table averages the layers with the usual kernel count, and says how many those were.
    lengths = collections.Counter(len(w) for w in windows)
    if lengths:
        usual = lengths.most_common(1)[0][0]
        windows = [w for w in windows if len(w) == usual]
    result["layers_averaged"] = len(windows)
    result["window"] = [(k["name"][:80], float(k["dur"])) for k in windows[0]] if windows else []
    rows = []
    if windows:
        for pos, role in enumerate(roles_of(windows[0])):
            us = statistics.mean(float(w[pos]["dur"]) for w in windows)
            gaps = [float(w[pos]["ts"]) - float(w[pos - 1]["ts"]) - float(w[pos - 1]["dur"]) for w in windows]
            floor_us = floors.get(role, 0.0) / copy_bps * 1e6
            rows.append(
                {
                    "role": role,
                    "kernel": windows[0][pos]["name"][:60],
                    "us": us,
                    "gap_before_us": statistics.mean(gaps) if pos > 0 else None,
                    "floor_us": floor_us,
                    "x_floor": us / floor_us if floor_us else None,
                }
            )
    result["layer"] = rows
    return result


def report(r: dict[str, Any]) -> None:
    print(
        f"\n## {r['shape']} ({r['variant']}) {r['tokens']} token(s) @{r['ctx']}: "
        f"graph {r['graph_us']:.1f} us (events), "
        f"{r['kernels_per_step']} kernels, GEMM {r['chosen_gemm']}, copy {r['copy_tbps']:.2f} TB/s"
    )
    if "error" in r:
        print(r["error"])
    gaps = r["span_us"] - r["kernel_sum_us"]
    print(
        f"span {r['span_us']:.1f} us, kernels {r['kernel_sum_us']:.1f} us, gaps {gaps:.1f} us "
        f"({gaps / max(1, r['kernels_per_step'] - 1):.2f} us per edge), launch+tail "
        f"{r['graph_us'] - r['span_us']:.1f} us"
    )
    if not r["layer"]:
        print("kernels of one layer:", r["window"])
    print("| role | kernel | us | gap before us | floor us | x floor |")
    print("|---|---|---|---|---|---|")
    for row in r["layer"]:
        gap = "" if row["gap_before_us"] is None else f"{row['gap_before_us']:.2f}"
        print(
            f"| {row['role']} | {row['kernel']} | {row['us']:.2f} | {gap} | {row['floor_us']:.2f} | "
            f"{row['x_floor'] or 0:.1f} |"
        )
    total = sum(row["us"] for row in r["layer"])
    total_floor = sum(row["floor_us"] for row in r["layer"])
    print(
        f"layer (mean of {r.get('layers_averaged', 0)}): kernels {total:.1f} us, floor {total_floor:.1f} us; "
        f"memory {r['memory']}"
    )
    if "logits_rel_l2_vs_first" in r:
        print(f"step logits vs the first variant: rel. L2 {r['logits_rel_l2_vs_first']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1.3b,6.7b")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=1, help="tokens of the step (1: decode)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quant", choices=["awq"], default=None, help="INT4 AWQ layers (group 128)")
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        profile_shape(shape, args.ctx, args.tokens, args.variants.split(","), args.out, args.quant)


if __name__ == "__main__":
    main()
