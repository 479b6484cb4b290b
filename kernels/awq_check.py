"""GPU check of the AWQ kernels at the DeepSeek-Coder layer shapes (kernels/shapes.py): correctness against
`awq_gemm_ref`, and the streaming rate of each M <= 16 launch against the measured copy bandwidth. Prints
Markdown tables.

    python -m lsp_dscoder.kernels.awq_check [--models 1.3B 6.7B 33B] [--sweep 6.7B] [--prefill 6.7B]

Launches are timed inside a CUDA graph (no host overhead), each launch on the next of several copies of the
weights so that every one reads HBM, not the 50 MB L2. Bytes of a step: qweight + qzeros + scales + x + y.
`--warm N` compiles every variant first in N processes (Triton compiles one kernel per core).
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections.abc import Callable, Iterator

import torch
import triton

from .awq_dequant import awq_dequant, fragment_dequant
from .awq_format import pack_int4
from .awq_fragments import fragment_pack
from .awq_gemm import awq_gemm_ref, awq_skinny
from .awq_mma import awq_mma
from .awq_plan import AwqTiles, AwqWorkspace, GemvTiles, MmaTiles
from .check_gpu import replay_us
from .shapes import by_name
from .skinny_gemm import skinny_gemm
from .skinny_plan import SkinnyWorkspace

ROTATE_BYTES = 256 * 2**20  # more than L2 several times over
Packed = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Tiles = AwqTiles | GemvTiles | MmaTiles | None


def copy_bandwidth(device: torch.device) -> float:
    """Device copy rate in GB/s, read + write counted."""
    a = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    ms: float = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50)
    return 2 * a.numel() * 2 / ms / 1e6


def random_awq(n: int, k: int, group: int, device: torch.device) -> Packed:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, device=device)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32, device=device)
    s = (torch.rand(k // group, n, device=device) * 0.004 + 0.001).half()
    return pack_int4(q), pack_int4(z), s


def layer_shapes(name: str) -> list[tuple[str, int, int]]:
    m = by_name(name)
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    return [("qkv", qkv, m.hidden), ("o", m.hidden, m.heads * m.head_dim), ("gate_up", 2 * m.inter, m.hidden),
            ("down", m.hidden, m.inter)]  # fmt: skip


def graph_us(fn: Callable[[int], object], copies: int) -> float:
    """Median microseconds of one call inside a CUDA graph of `copies` calls, call i on copy i."""
    for i in range(copies):
        fn(i)  # compile, and allocate nothing inside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    return replay_us(graph, copies)


def split_for(blocks: int, parts: int, per_sm: int, cap: int = 32) -> int:
    """K shares giving about per_sm programs per SM, at most `parts` (groups, or parts of groups)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(cap, parts, int(triton.cdiv(per_sm * sms, blocks))))


def variants(m: int, n: int, k: int, group: int) -> Iterator[Tiles]:
    """The sweep at one shape: None (the launcher's default) first, then tiles to compare with it."""
    yield None
    if m == 1:
        blocks = triton.cdiv(n // 8, 128)
        yield GemvTiles(8, split_for(blocks, 8 * k // group, 32, 512), 1, 8, 1, True, True)
    # (warps, programs per SM, depth)
    mma = ((1, 32, 1), (1, 16, 1), (1, 64, 1), (1, 32, 0))
    for warps, per_sm, depth in mma if m <= 8 else mma[:2]:
        blocks = triton.cdiv(n // 16, warps)
        yield MmaTiles(split_for(blocks, k // group, per_sm, 512), warps, depth)
    if m > 8:  # 9..16 rows in one launch
        yield MmaTiles(split_for(n // 16, k // group, 32, 512), 1, 1, one_pass=True)
    for bk, stages, pairs, per_sm in ((64, 3, True, 4), (32, 4, True, 2)) if m > 1 else ():
        split = split_for(triton.cdiv(n, 256), k // group, per_sm)
        yield AwqTiles(16, 256, min(bk, group), split, 4, stages, pairs)


def name_of(t: Tiles) -> str:
    if t is None:
        return "default"
    if isinstance(t, MmaTiles):
        return f"mma s{t.split_k}/w{t.num_warps}/depth{t.depth}" + ("/one pass" if t.one_pass else "")
    if isinstance(t, GemvTiles):
        how = ("" if t.atomic else "/lastsum") + ("/prefetch" if t.prefetch else "")
        return f"gemv k{t.block_k}/s{t.split_k}/w{t.num_warps}/sub{t.sub}/st{t.num_stages}{how}"
    pairs = "/pairs" if t.pairs else ""
    return f"tc n{t.block_n}/k{t.block_k}/s{t.split_k}/w{t.num_warps}/st{t.num_stages}{pairs}"


def skinny_rows(
    model: str, mat: str, n: int, k: int, group: int, copy: float, sweep: bool, dev: torch.device
) -> None:
    packed = random_awq(n, k, group, dev)
    wbytes = sum(t.numel() * t.element_size() for t in packed)
    q, z, s = packed
    rot = [packed] + [(q.clone(), z.clone(), s.clone()) for _ in range(max(2, ROTATE_BYTES // wbytes) - 1)]
    ws = AwqWorkspace.allocate(n, dev)
    dense = awq_gemm_ref(torch.eye(k, device=dev), *packed).T.to(torch.bfloat16).contiguous()  # (N, K)
    drot = [dense] + [dense.clone() for _ in range(max(2, ROTATE_BYTES // (n * k * 2)) - 1)]
    dws = SkinnyWorkspace.allocate(n, 8, dev)
    frags: list[torch.Tensor] = []
    for m in (1, 4, 16):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        want = awq_gemm_ref(x, *packed).float()
        io = x.numel() * 2 + m * n * 2

        def skinny(i: int, x: torch.Tensor = x) -> torch.Tensor:
            return skinny_gemm(x, drot[i % len(drot)], workspace=dws)

        def cublas(i: int, x: torch.Tensor = x) -> torch.Tensor:
            return x @ drot[i % len(drot)].T

        t_sk = graph_us(skinny, len(drot))
        t_cb = graph_us(cublas, len(drot))
        for tiles in variants(m, n, k, group) if sweep else [None]:
            try:
                if isinstance(tiles, MmaTiles) and not frags:
                    frags.extend(fragment_pack(r[0], group) for r in rot)
                got = _call(x, 0, out, tiles, rot, frags, group, ws).float()
                err = float((got - want).abs().max() / want.abs().max())

                def launch(
                    i: int, x: torch.Tensor = x, o: torch.Tensor = out, t: Tiles = tiles
                ) -> torch.Tensor:
                    return _call(x, i, o, t, rot, frags, group, ws)

                t = graph_us(launch, len(rot))
            except Exception as e:  # one failing variant must not end the table
                print(
                    f"| {model} | {mat} | {m} | {name_of(tiles)} | failed: {type(e).__name__}: {e} |||||",
                    flush=True,
                )
                continue
            gbs = (wbytes + io) / t / 1e3
            print(f"| {model} | {mat} {n}x{k} | {m} | {name_of(tiles)} | {err:.1e} | {t:.1f} | {gbs:.0f} | "
                  f"{100 * gbs / copy:.0f}% | {t_sk:.1f} | {t_cb:.1f} |", flush=True)  # fmt: skip


def _call(
    x: torch.Tensor,
    i: int,
    out: torch.Tensor,
    t: Tiles,
    rot: list[Packed],
    frags: list[torch.Tensor],
    group: int,
    ws: AwqWorkspace,
) -> torch.Tensor:
    """One launch on copy i of the weights (fragment layout copies for MmaTiles)."""
    if isinstance(t, MmaTiles):
        return awq_mma(x, frags[i], rot[i][1], rot[i][2], out=out, tiles=t, workspace=ws)
    return awq_skinny(x, *rot[i], out=out, tiles=t, workspace=ws)


def prefill_rows(model: str, mat: str, n: int, k: int, group: int, dev: torch.device) -> None:
    packed = random_awq(n, k, group, dev)
    buf = torch.empty(k, n, device=dev, dtype=torch.bfloat16)
    dense_t = awq_dequant(*packed, out=buf.clone())
    frag = fragment_pack(packed[0], group)
    for m in (512, 4096):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        want = awq_gemm_ref(x, *packed).float()
        fl = 2 * m * n * k / 1e6
        row = [model, mat, str(m)]
        for name, fn in (
            ("dequant+cublas", lambda x=x: x @ awq_dequant(*packed, out=buf)),
            ("fragments+cublas", lambda x=x: x @ fragment_dequant(frag, *packed[1:], out=buf)),
            ("bf16 cublas", lambda x=x: x @ dense_t),
        ):
            try:
                err = float((fn().float() - want).abs().max() / want.abs().max())

                def call(i: int, fn: Callable[[], torch.Tensor] = fn) -> torch.Tensor:
                    return fn()

                us = graph_us(call, 3)
                row.append(f"{err:.0e} {us:.0f} us {fl / us:.0f} TF/s")
            except Exception as e:  # report the variant, keep the table
                row.append(f"{name} failed: {type(e).__name__}")
        print("| " + " | ".join(row) + " |", flush=True)


def _warm(args: tuple[list[str], list[str], int, int, int]) -> int:
    """Compile (run once) every variant of this process's share, so the timed run finds them cached."""
    models, sweep, group, share, shares = args
    dev = torch.device("cuda")
    i = 0
    for model in models:
        for _mat, n, k in layer_shapes(model):
            packed = None
            ws = AwqWorkspace.allocate(n, dev)
            for m in (1, 4, 16):
                for tiles in variants(m, n, k, group) if model in sweep else [None]:
                    i += 1
                    if i % shares != share:
                        continue
                    packed = packed or random_awq(n, k, group, dev)
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                    try:
                        frags = [fragment_pack(packed[0], group)] if isinstance(tiles, MmaTiles) else []
                        _call(x, 0, out, tiles, [packed], frags, group, ws)
                    except Exception:  # the timed run reports the failure
                        continue
    torch.cuda.synchronize()
    return i


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["1.3B", "6.7B", "33B"])
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--sweep", nargs="*", default=[], help="models whose shapes also time the tile variants")
    ap.add_argument("--prefill", nargs="*", default=[], help="models whose prefill GEMMs are timed")
    ap.add_argument("--warm", type=int, default=0, help="compile in this many processes first")
    args = ap.parse_args()
    if args.warm:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(args.warm) as pool:
            pool.map(_warm, [(args.models, args.sweep, args.group, i, args.warm) for i in range(args.warm)])
    dev = torch.device("cuda")
    copy = copy_bandwidth(dev)
    print(f"copy bandwidth {copy:.0f} GB/s (read + write), {torch.cuda.get_device_name(dev)}\n")
    print("| model | matrix | M | tiles | max rel err | AWQ us | GB/s | % copy | bf16 skinny | bf16 cuBLAS |")
    print("| --- " * 10 + "|", flush=True)
    for model in args.models:
        for mat, n, k in layer_shapes(model):
            skinny_rows(model, mat, n, k, args.group, copy, model in args.sweep, dev)
    if args.prefill:
        print("\n| model | matrix | M | dequant+cuBLAS | fragments+cuBLAS | bf16 cuBLAS |")
        print("| --- " * 6 + "|", flush=True)
    for model in args.prefill:
        for mat, n, k in layer_shapes(model):
            prefill_rows(model, mat, n, k, args.group, dev)


if __name__ == "__main__":
    main()
