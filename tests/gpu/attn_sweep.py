"""Attention kernels against their floors at 1K-16K context, with candidate tiles and split counts.

    python -m tests.gpu.attn_sweep [--budget-s 60] [--out DIR]

Decode (one token over L keys) against its KV-read floor at L = 1K/4K/16K, the default launch and other
split counts / tiles / the fused combine; extend for a cold prefill of 4K/8K/16K tokens and a 256-token line
over 4K against its FLOP floor, the default tiles and others. Timing as kernels/check_gpu.py: several
buffer sets (a few times L2) launched in one CUDA graph, median per launch. Every variant is checked
against the reference (rel. L2 < 1e-2) on its first launch.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.kernels import decode_attention as da
from lsp_dscoder.kernels import extend_attention as ea
from lsp_dscoder.kernels.check_cases import Make, attn_cost, kv_cache, randn, rel_err
from lsp_dscoder.kernels.check_gpu import measure_floors, time_us
from lsp_dscoder.kernels.shapes import MODELS, Model

MAX_CTX = 16384 + 512
DECODE_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("fused combine", {"fused": True}),
    *[(f"S={s}", {"num_splits": s}) for s in (8, 16, 32, 64)],
    *[(f"fused S={s}", {"fused": True, "num_splits": s}) for s in (8, 12, 16, 24, 32, 48, 64)],
    *[
        (f"tiles {t}", {"tiles": da.DecodeTiles(*t)})
        for t in ((32, 4, 3), (64, 4, 2), (64, 4, 4), (128, 4, 3), (128, 8, 3), (64, 8, 4), (128, 4, 2))
    ],
    *[
        (f"fused tiles {t} S={s}", {"fused": True, "tiles": da.DecodeTiles(*t), "num_splits": s})
        for t in ((64, 4, 2), (32, 4, 2))
        for s in (16, 32)
    ],
]
EXTEND_TILES = (
    (128, 128, 8, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 4),
    (128, 128, 8, 2),
    (64, 64, 4, 3),
    (64, 128, 4, 3),
)


def decode_case(m: Model, kv_len: int, dev: torch.device, fused: bool = False, **kw: Any) -> Make:
    def make() -> tuple[Any, Any]:
        if fused:
            kw["counts"] = torch.zeros(m.kv_heads, dtype=torch.int32, device=dev)
        q = randn(1, m.heads, m.head_dim, dev=dev)
        k, v = kv_cache(m, MAX_CTX, dev)
        pos, out, scale = torch.tensor([kv_len], device=dev), torch.empty_like(q), m.head_dim**-0.5
        return (
            lambda: da.decode_attention(q, k, v, pos, scale, out=out, **kw),
            lambda: rel_err(out, da.decode_attention_ref(q, k, v, pos, scale)),
        )

    return make


def extend_case(m: Model, n_tok: int, prefix: int, dev: torch.device, **kw: Any) -> Make:
    def make() -> tuple[Any, Any]:
        q = randn(n_tok, m.heads, m.head_dim, dev=dev)
        k, v = kv_cache(m, MAX_CTX, dev)
        pos, out, scale = torch.tensor([prefix], device=dev), torch.empty_like(q), m.head_dim**-0.5
        ref_check = n_tok <= 4096  # the fp32 reference at 16K tokens would take 8+ GB per head group

        def verify() -> float:
            return rel_err(out, ea.extend_attention_ref(q, k, v, pos, scale)) if ref_check else 0.0

        return lambda: ea.extend_attention(q, k, v, pos, scale, out=out, **kw), verify

    return make


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", choices=("decode", "extend"), default=None)
    args = ap.parse_args()
    begin = time.time()
    dev = torch.device("cuda")
    bw, rate = measure_floors(dev)
    print(f"copy {bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s", flush=True)
    rows: list[dict[str, Any]] = []
    # (priority, case): the defaults and the fused combine first, then the variants most likely to move a
    # benchmark row (the 256-token line over 4K, cold 4K), so a short budget still measures those.
    cases: list[tuple[int, str, Model, str, str, Make, tuple[float, float]]] = []
    if args.only != "extend":
        for kv_len in (1024, 4096, 16384):
            for m in MODELS:
                for n, (name, kw) in enumerate(DECODE_VARIANTS):
                    rank = 0 if n < 2 else 4 if kv_len <= 4096 else 6
                    make = decode_case(m, kv_len, dev, **kw)
                    cases.append((rank, "decode", m, f"L={kv_len}", name, make, attn_cost(m, 1, kv_len - 1)))
    if args.only != "decode":
        for n_tok, prefix in ((4096, 0), (256, 4096), (8192, 0), (16384, 0)):
            variants: list[tuple[str, dict[str, Any]]] = [("default", {})]
            variants += [(str(t), {"tiles": ea.Tiles(*t)}) for t in EXTEND_TILES]
            if n_tok == 256:
                variants += [(f"S={s}", {"num_splits": s}) for s in (1, 2, 4)]
                variants += [
                    (f"{t} S={s}", {"tiles": ea.Tiles(*t), "num_splits": s})
                    for t in ((64, 64, 4, 3),)
                    for s in (1, 2)
                ]
            for m in MODELS:
                for name, kw in variants:
                    rank = 1 if name == "default" else 2 if n_tok == 256 else 3 if n_tok == 4096 else 5
                    make = extend_case(m, n_tok, prefix, dev, **kw)
                    cases.append(
                        (rank, "extend", m, f"T={n_tok} p={prefix}", name, make, attn_cost(m, n_tok, prefix))
                    )
    cases.sort(key=lambda c: c[0])  # stable: within a priority, in the order above
    print("| op | model | shape | variant | us | floor us | x floor | rel err |", flush=True)
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for _, op, m, shape, variant, make, (io, flops) in cases:
        if time.time() - begin > args.budget_s:
            print(f"stopped at {time.time() - begin:.0f} s (budget)", flush=True)
            break
        floor = max(io / bw, flops / rate) * 1e6
        try:
            us, err = time_us(make, io, dev)
        except Exception as exc:  # one failing variant must not cost the others
            print(
                f"| {op} | {m.name} | {shape} | {variant} | FAILED {type(exc).__name__}: {str(exc)[:200]} |"
            )
            continue
        torch.cuda.empty_cache()
        row = {"op": op, "model": m.name, "shape": shape, "variant": variant, "us": us, "floor_us": floor}
        rows.append({**row, "err": err})
        flag = "" if err < 1e-2 else " WRONG"
        print(
            f"| {op} | {m.name} | {shape} | {variant} | {us:.1f} | {floor:.1f} | {us / floor:.2f} | "
            f"{err:.1e}{flag} |",
            flush=True,
        )
    if args.out:
        (args.out / f"attn_sweep_{args.only or 'all'}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
