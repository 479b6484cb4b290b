"""Extend attention at prefill shapes on a CUDA GPU: each kernel variant (the keystroke kernel, the long-step
kernel with pointer or tensor-descriptor loads, tiles, key splits) against a reference and the FLOP floor.

    python -m lsp_dscoder.kernels.extend_sweep --out DIR                 # default against the short kernel
    python -m lsp_dscoder.kernels.extend_sweep --out DIR --plan tiles    # every variant
    python -m lsp_dscoder.kernels.extend_sweep --out DIR --warm 3/8      # compile only: part 3 of 8
    TRITON_INTERPRET=1 python -m lsp_dscoder.kernels.extend_sweep --tiny # CPU: exercises this script

Timing is check_gpu's (several buffer sets larger than L2 captured in one CUDA graph, median per launch).
The reference is fp32 attention at a few hundred query rows per case (first, middle and last blocks).
`--warm I/N` launches one case of every N-th distinct kernel build, so that N processes started together
fill Triton's cache in parallel before the timed run (a fresh machine compiles ~30 kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from . import extend_attention as ea
from .check_cases import attn_cost, rel_err
from .check_gpu import measure_floors, time_us
from .prefill_plan import PrefillTiles, prefill_splits, prefill_tiles
from .shapes import MODELS, Model

TINY = Model("tiny", 64, 4, 2, 40, 16)
Kernel = ea.Tiles | PrefillTiles | None


@dataclass(frozen=True)
class Case:
    name: str
    n_tok: int
    prefix: int
    max_ctx: int


@dataclass(frozen=True)
class Variant:
    label: str
    tiles: Kernel  # None: what extend_attention picks by itself
    splits: int | None = None


CASES = (
    Case("cold 4K", 4096, 0, 8192),
    Case("line 256 @4K", 256, 4096, 8192),
    Case("odd 1037 @4001", 1037, 4001, 8192),  # partial blocks, an unaligned diagonal: correctness
    Case("cold 16K", 16384, 0, 16384),
    Case("4K @4K", 4096, 4096, 8192),
)
TINY_CASES = (Case("cold", 40, 0, 64), Case("line", 17, 30, 64))


def variants(plan: str, case: Case, model: Model) -> Iterator[Variant]:
    """The default, the keystroke kernel at its own tiles, then (plan "tiles") the long-step tiles."""
    yield Variant("default", None)
    yield Variant("short", ea.tiles_for(case.n_tok * model.heads // model.kv_heads))
    chosen = prefill_tiles(case.n_tok, model.heads, torch.bfloat16, torch.device("cuda"))
    if chosen is not None:
        yield Variant("default, lazy rescale", dataclasses.replace(chosen, lazy=True))
    if plan == "default":
        return
    if case.name.startswith("odd"):
        for odd in (
            PrefillTiles(128, 64, 8, 2, True, 128),
            PrefillTiles(128, 64, 8, 3),
            PrefillTiles(64, 64, 4, 3),
        ):
            yield Variant(label(odd), odd)
            yield Variant(f"{label(odd)} S=3", odd, 3)
        return
    tma_tiles = (
        PrefillTiles(128, 64, 8, 3, True),
        PrefillTiles(128, 64, 8, 2, True, 128),  # two programs an SM (98 KB of shared memory each)
        PrefillTiles(64, 64, 4, 3, True),  # two programs an SM
        PrefillTiles(64, 64, 4, 2, True),
        PrefillTiles(128, 128, 8, 2, True),
        PrefillTiles(128, 128, 8, 3, True),
    )
    ptr_tiles = (
        PrefillTiles(128, 64, 8, 3),
        PrefillTiles(128, 64, 8, 2, False, 128),
        PrefillTiles(64, 64, 4, 3),
    )
    for tiles in tma_tiles + ptr_tiles:
        yield Variant(label(tiles), tiles)
    if case.n_tok <= 1024:
        for tiles in tma_tiles[1:3]:
            for splits in (1, 2, 4):
                yield Variant(f"{label(tiles)} S={splits}", tiles, splits)


def label(t: PrefillTiles) -> str:
    regs = f" r{t.maxnreg}" if t.maxnreg else ""
    return f"{'tma' if t.tma else 'ptr'} {t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}{regs}"


def check_rows(n_tok: int) -> torch.Tensor:
    """Query rows the reference is computed for: the first and last blocks and an unaligned middle run (a
    whole fp32 reference of a 16K-token case would take minutes)."""
    mid = max(0, n_tok // 2 - 37)
    picked = {*range(min(n_tok, 128)), *range(mid, min(n_tok, mid + 128)), *range(max(0, n_tok - 128), n_tok)}
    return torch.tensor(sorted(picked))


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float, rows: torch.Tensor
) -> torch.Tensor:
    """fp32 causal attention (R, H, D) of the given query rows of q (T, H, D) at positions prefix + row."""
    n_heads = q.shape[1]
    group = n_heads // k.shape[0]
    kv_len = prefix + q.shape[0]
    kf = k[:, :kv_len].float().repeat_interleave(group, 0)  # (H, L, D)
    vf = v[:, :kv_len].float().repeat_interleave(group, 0)  # (H, L, D)
    rows = rows.to(q.device)
    s = q[rows].float().transpose(0, 1) @ kf.transpose(1, 2) * scale  # (H, R, L)
    key_pos = torch.arange(kv_len, device=q.device)
    s.masked_fill_(key_pos[None, None, :] > (prefix + rows)[None, :, None], float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).transpose(0, 1)  # (R, H, D)


class CaseData:
    """One case's first buffer set and its reference, shared by every variant."""

    def __init__(self, m: Model, case: Case, dev: torch.device, with_ref: bool) -> None:
        self.m, self.case, self.dev = m, case, dev
        self.q, self.k, self.v = self.buffers()
        self.pos = torch.tensor([case.prefix], dtype=torch.int32, device=dev)
        self.scale = m.head_dim**-0.5
        self.rows = check_rows(case.n_tok).to(dev)
        self.ref = reference(self.q, self.k, self.v, case.prefix, self.scale, self.rows) if with_ref else None

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, c, dev = self.m, self.case, self.dev
        q = torch.randn(c.n_tok, m.heads, m.head_dim, device=dev).to(torch.bfloat16)
        k = torch.randn(m.kv_heads, c.max_ctx, m.head_dim, device=dev).to(torch.bfloat16)
        v = torch.randn(m.kv_heads, c.max_ctx, m.head_dim, device=dev).to(torch.bfloat16)
        return q, k, v

    def make(self, var: Variant) -> Callable[[], tuple[Callable[[], object], Callable[[], float]]]:
        first = [True]

        def make() -> tuple[Callable[[], object], Callable[[], float]]:
            q, k, v = (self.q, self.k, self.v) if first[0] else self.buffers()
            first[0] = False
            out = torch.empty_like(q)

            def launch() -> object:
                return ea.extend_attention(
                    q, k, v, self.pos, self.scale, out=out, num_splits=var.splits, tiles=var.tiles
                )

            return launch, lambda: rel_err(out[self.rows], self.ref) if self.ref is not None else 0.0

        return make


def build_key(m: Model, case: Case, var: Variant, dev: torch.device) -> tuple[object, ...]:
    """What makes a distinct compiled kernel (roughly: a few keys compile the same kernel twice)."""
    tiles = var.tiles or prefill_tiles(case.n_tok, m.heads, torch.bfloat16, dev)
    tiles = tiles or ea.tiles_for(case.n_tok * m.heads // m.kv_heads)
    split = var.splits
    if split is None and isinstance(tiles, PrefillTiles) and dev.type == "cuda":
        blocks = -(-case.n_tok // tiles.block_m)
        split = prefill_splits(blocks * m.heads, case.max_ctx, tiles, dev)
    return (m.name, repr(tiles), split == 1)


def graph_replay_check(m: Model, tiles: PrefillTiles, dev: torch.device) -> float:
    """Capture a 256-token step at position 7, replay it at 4000 (what the engine's graphs do): rel err."""
    data = CaseData(m, Case("replay", 256, 7, 8192), dev, with_ref=False)
    out = torch.empty_like(data.q)

    def call() -> object:
        return ea.extend_attention(data.q, data.k, data.v, data.pos, data.scale, out=out, tiles=tiles)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    data.pos.fill_(4000)
    graph.replay()
    rows = data.rows
    return rel_err(out[rows], reference(data.q, data.k, data.v, 4000, data.scale, rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--plan", choices=("default", "tiles"), default="default")
    parser.add_argument("--models", default="1.3B,6.7B,33B")
    parser.add_argument("--cases", default=None, help="case names, comma-separated (default: all)")
    parser.add_argument("--warm", default=None, help="I/N: compile part I of N, time nothing")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop timing past this")
    args = parser.parse_args()
    t_begin = time.time()
    dev = torch.device("cpu" if args.tiny else "cuda")
    models = [TINY] if args.tiny else [m for m in MODELS if m.name in args.models.split(",")]
    cases = [
        c
        for c in (TINY_CASES if args.tiny else CASES)
        if args.cases is None or c.name in args.cases.split(",")
    ]
    # Case-major: every model's cold prompt first, so a cut-off run still has the rows that matter most.
    plan = [(c, m, var) for c in cases for m in models for var in variants(args.plan, c, m)]

    if args.warm:
        part, parts = (int(x) for x in args.warm.split("/"))
        seen: dict[tuple[object, ...], int] = {}
        for c, m, var in plan:
            seen.setdefault(build_key(m, c, var, dev), len(seen))
        bufs: CaseData | None = None
        for c, m, var in plan:
            index = seen.pop(build_key(m, c, var, dev), None)  # the first case of each build only
            if index is None or index % parts != part:
                continue
            if bufs is None or (bufs.m, bufs.case) != (m, c):
                bufs = None  # freed before the next case's buffers are made
                bufs = CaseData(m, c, dev, with_ref=False)
            try:
                bufs.make(var)()[0]()
            except Exception as exc:  # reported again, with the error, by the timed run
                print(
                    f"warm {m.name} {c.name} {var.label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True
                )
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(f"warm {args.warm} done in {time.time() - t_begin:.0f} s", flush=True)
        return

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    rows_file = (args.out / "extend_sweep.jsonl").open("w") if args.out else None
    bw, rate = measure_floors(dev)
    head = f"floors: copy {bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s"
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        head = f"{p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}; {head}"
    print(head, flush=True)
    if dev.type == "cuda":
        for m in models:
            for tiles in (PrefillTiles(128, 64, 8, 2, True, 128), PrefillTiles(64, 64, 4, 3)):
                try:
                    err = graph_replay_check(m, tiles, dev)
                    print(f"graph replay {m.name} {label(tiles)}: captured at 7, at 4000: rel err {err:.1e}")
                except Exception as exc:  # reported; the timings still run
                    print(
                        f"graph replay {m.name} {label(tiles)}: FAILED {type(exc).__name__}: {str(exc)[:300]}"
                    )
    print(f"{'model':5s} {'case':13s} {'variant':26s} {'us':>9s} {'floor':>8s} {'x':>5s} {'rel err':>8s}")
    data_now: tuple[str, str] | None = None
    d: CaseData | None = None
    for c, m, var in plan:
        if time.time() - t_begin > args.budget_s:
            print(f"stopped at {time.time() - t_begin:.0f} s (budget {args.budget_s:.0f} s)", flush=True)
            break
        if data_now != (m.name, c.name):
            d, data_now = None, (m.name, c.name)  # the last case's buffers freed before the next are made
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            d = CaseData(m, c, dev, with_ref=True)
        assert d is not None
        io, flops = attn_cost(m, c.n_tok, c.prefix)
        floor = flops / rate * 1e6
        try:
            us, err = time_us(d.make(var), io, dev)
        except Exception as exc:  # one failing variant must not cost the rest of the run
            print(f"{m.name:5s} {c.name:13s} {var.label:26s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        print(
            f"{m.name:5s} {c.name:13s} {var.label:26s} {us:9.1f} {floor:8.1f} {us / floor:5.2f} {err:8.1e}",
            flush=True,
        )
        if rows_file:
            row = {
                "model": m.name,
                "case": c.name,
                "variant": var.label,
                "us": us,
                "floor_us": floor,
                "err": err,
            }
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
    print(f"done in {time.time() - t_begin:.0f} s", flush=True)


if __name__ == "__main__":
    main()
