"""GPU check of the AWQ kernels: correctness against `awq_gemm_ref` and streaming rate against the measured
copy bandwidth, at the DeepSeek-Coder layer shapes (kernels/shapes.py). Prints Markdown tables.

    python -m lsp_dscoder.kernels.awq_check [--models 1.3B 6.7B] [--group 128]

Bytes of a skinny step: qweight + qzeros + scales + x + y. Copies of each matrix are cycled so that the
timed launches read HBM, not the 50 MB L2 (a 1.3B O projection packs to 2 MB).
"""

from __future__ import annotations

import argparse

import torch
import triton

from .awq_format import pack_int4
from .awq_gemm import AwqTiles, awq_gemm, awq_gemm_ref, awq_skinny
from .shapes import by_name
from .skinny_gemm import skinny_gemm

ROTATE_BYTES = 256 * 2**20  # more than L2 many times over


def copy_bandwidth(device: torch.device) -> float:
    """Device copy rate in GB/s, read + write counted."""
    a = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    ms: float = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50)
    return 2 * a.numel() * 2 / ms / 1e6


def random_awq(
    n: int, k: int, group: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, device=device)
    z = torch.randint(0, 16, (k // group, n), dtype=torch.int32, device=device)
    s = (torch.rand(k // group, n, device=device) * 0.004 + 0.001).half()
    return pack_int4(q), pack_int4(z), s


def layer_shapes(name: str) -> list[tuple[str, int, int]]:
    m = by_name(name)
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    return [("qkv", qkv, m.hidden), ("o", m.hidden, m.heads * m.head_dim), ("gate_up", 2 * m.inter, m.hidden),
            ("down", m.hidden, m.inter)]  # fmt: skip


def time_rotating(fn, copies: int) -> float:  # type: ignore[no-untyped-def]
    """Median ms of one call, each call on the next copy of the weights."""
    state = {"i": 0}

    def step() -> None:
        fn(state["i"] % copies)
        state["i"] += 1

    ms: float = triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median")
    return ms


SWEEP = (  # (block_n, block_k, split_k, warps, stages) tried at M=1 with --sweep
    (128, 128, 2, 4, 4),
    (128, 128, 8, 4, 4),
    (128, 64, 8, 4, 4),
    (256, 128, 4, 8, 3),
    (256, 128, 2, 4, 4),
)
HEAD_SKINNY = (
    "| model | matrix | N x K | M | max rel err | AWQ us | AWQ GB/s | % copy "
    "| bf16 skinny us | bf16 cuBLAS us |"
)


def dense_of(packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor], k: int) -> torch.Tensor:
    """The same weights as bf16 (N, K), for the bf16 kernels' times."""
    eye = torch.eye(k, dtype=torch.float32, device=packed[0].device)
    return awq_gemm_ref(eye, *packed).T.to(torch.bfloat16).contiguous()


def skinny_rows(model: str, mat: str, n: int, k: int, group: int, copy: float, sweep: bool) -> None:
    packed = random_awq(n, k, group, packed_device())
    wbytes = sum(t.numel() * t.element_size() for t in packed)
    qw, qz, sc = packed
    rot = [packed] + [(qw.clone(), qz.clone(), sc.clone()) for _ in range(max(2, ROTATE_BYTES // wbytes) - 1)]
    dense = dense_of(packed, k)
    drot = [dense] + [dense.clone() for _ in range(max(2, ROTATE_BYTES // (n * k * 2)) - 1)]
    for m in (1, 4, 16):
        x = torch.randn(m, k, device=dense.device, dtype=torch.bfloat16)
        want = awq_gemm_ref(x, *packed).float()
        err = float((awq_skinny(x, *packed).float() - want).abs().max() / want.abs().max())
        t_awq = time_rotating(lambda i, x=x: awq_skinny(x, *rot[i]), len(rot))
        t_sk = time_rotating(lambda i, x=x: skinny_gemm(x, drot[i]), len(drot))
        t_cb = time_rotating(lambda i, x=x: x @ drot[i].T, len(drot))
        gbs = (wbytes + x.numel() * 2 + m * n * 2) / t_awq / 1e6
        print(
            f"| {model} | {mat} | {n} x {k} | {m} | {err:.1e} | {t_awq * 1e3:.1f} | {gbs:.0f} | "
            f"{100 * gbs / copy:.0f}% | {t_sk * 1e3:.1f} | {t_cb * 1e3:.1f} |",
            flush=True,
        )
    if sweep:
        x = torch.randn(1, k, device=dense.device, dtype=torch.bfloat16)
        for bn, bk, split, warps, stages in SWEEP:
            tiles = AwqTiles(16, bn, min(bk, group), split, warps, stages)
            t = time_rotating(lambda i, tl=tiles: awq_skinny(x, *rot[i], tiles=tl), len(rot))
            gbs = (wbytes + k * 2 + n * 2) / t / 1e6
            print(f"| sweep {bn}/{bk}/{split}/{warps}/{stages} | {mat} | | 1 | | {t * 1e3:.1f} | {gbs:.0f} | "
                  f"{100 * gbs / copy:.0f}% | | |", flush=True)  # fmt: skip


def packed_device() -> torch.device:
    return torch.device("cuda")


def gemm_rows(model: str, mat: str, n: int, k: int, group: int) -> None:
    packed = random_awq(n, k, group, packed_device())
    dense = dense_of(packed, k)
    for m in (512, 4096):
        x = torch.randn(m, k, device=dense.device, dtype=torch.bfloat16)
        want = awq_gemm_ref(x, *packed).float()
        err = float((awq_gemm(x, *packed).float() - want).abs().max() / want.abs().max())
        t_awq = triton.testing.do_bench(lambda x=x: awq_gemm(x, *packed), return_mode="median")
        t_cb = triton.testing.do_bench(lambda x=x: x @ dense.T, return_mode="median")
        fl = 2 * m * n * k / 1e9
        print(f"| {model} | {mat} | {m} | {err:.1e} | {fl / t_awq:.0f} | {fl / t_cb:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["1.3B", "6.7B"])
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--sweep", nargs="*", default=[], help="models whose shapes also time a few tiles at M=1")
    args = ap.parse_args()
    dev = packed_device()
    copy = copy_bandwidth(dev)
    print(f"copy bandwidth {copy:.0f} GB/s (read + write), {torch.cuda.get_device_name(dev)}\n")
    print(HEAD_SKINNY)
    print("| --- " * 10 + "|")
    for model in args.models:
        for mat, n, k in layer_shapes(model):
            skinny_rows(model, mat, n, k, args.group, copy, model in args.sweep)
    print("\n| model | matrix | M | max rel err | AWQ GEMM TFLOP/s | bf16 cuBLAS TFLOP/s |")
    print("| --- " * 6 + "|")
    for model in args.models:
        for mat, n, k in layer_shapes(model):
            gemm_rows(model, mat, n, k, args.group)


if __name__ == "__main__":
    main()
