"""The packed GEMM's epilogues (kernels/awq_parts.py) inside the compiled kernel (kernels/awq_mma.py)
against the separate kernels, at the layer shapes of DeepSeek-Coder 6.7B and 33B (GQA), run by hand on a
CUDA machine (the MMA is inline PTX; tests/kernels/test_awq_parts.py checks the epilogues on CPU):

    python -m tests.gpu.awq_fused

Each case prints the relative L2 distance and the largest relative error of every output against what
the separate kernels give from the reference product (dequantize, then matmul in fp32), and FAIL when the
distance is past a bf16 rounding or two; the exit status is the number of failures.
"""

from __future__ import annotations

import sys

import torch

from lsp_dscoder.kernels.awq_format import pack_int4
from lsp_dscoder.kernels.awq_fragments import fragment_pack
from lsp_dscoder.kernels.awq_gemm import awq_gemm_ref
from lsp_dscoder.kernels.awq_mma import awq_mma
from lsp_dscoder.kernels.reference import rope_cos_sin
from lsp_dscoder.kernels.rope_store import rope_store
from lsp_dscoder.kernels.silu_mul import silu_mul
from lsp_dscoder.kernels.skinny_parts import ResidualEpilogue, RmsScale, RopeEpilogue

EPS = 1e-6
TOL = 1e-2  # relative L2: the fused and separate paths round at different points (bf16 steps of 4e-3)
SHAPES = {"6.7B": (4096, 11008, 32, 32), "33B": (7168, 19200, 56, 8)}  # hidden, inter, heads, kv heads
D, GROUP, MAX_CTX = 128, 128, 4096
failures: list[str] = []


def layer(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = torch.device("cuda")
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, device=dev, generator=gen)
    z = torch.randint(0, 16, (k // GROUP, n), dtype=torch.int32, device=dev, generator=gen)
    s = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.002 + 0.001).half()
    return pack_int4(q), pack_int4(z), s


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    g, w = got.float(), want.float()
    rel = float((g - w).norm() / w.norm())
    worst = float(((g - w).abs() / w.abs().clamp_min(1e-3)).max())
    bad = not rel < TOL  # NaN fails too
    print(f"  {name:40s} rel L2 {rel:.2e}  max rel {worst:.2e}  {'FAIL' if bad else 'ok'}")
    if bad:
        failures.append(name)


def run(shape: str, m: int, pdl: bool, gen: torch.Generator) -> None:
    hidden, inter, heads, kv_heads = SHAPES[shape]
    dev = torch.device("cuda")
    print(f"{shape}, M {m}, pdl {pdl}")
    x = torch.randn(m, hidden, device=dev, generator=gen).to(torch.bfloat16)
    sums = torch.zeros(16, device=dev)
    sums[:m] = (torch.rand(m, device=dev, generator=gen) + 0.5) * hidden
    inv = torch.rsqrt(sums[:m] / hidden + EPS)[:, None]  # (M, 1)
    rms = RmsScale(sums, 1, EPS)

    # QKV: RoPE, the K/V store, the RMS scale, and the row totals zeroed for the O projection.
    n = (heads + 2 * kv_heads) * D
    qw, qz, s = layer(n, hidden, gen)
    ref = awq_gemm_ref(x.float(), qw, qz, s)  # (M, N) fp32
    frag = fragment_pack(qw, GROUP, pair=D // 2)
    check("qkv, columns paired, plain", awq_mma(x, frag, qz, s, pair=D // 2), ref)
    cos_sin = rope_cos_sin(MAX_CTX, D, 100000.0, 4.0, dev)
    start = torch.tensor([MAX_CTX - 20], dtype=torch.int32, device=dev)
    caches = [torch.zeros(kv_heads, MAX_CTX, D, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    zero = torch.full((16,), 3.0, device=dev)
    rope = RopeEpilogue(cos_sin, start, caches[0], caches[1], heads, kv_heads)
    q = awq_mma(x, frag, qz, s, pdl=pdl, pair=D // 2, rms=rms, rope=rope, zero=zero)
    q_want = rope_store((ref * inv).to(torch.bfloat16), cos_sin, start, caches[2], caches[3], heads, kv_heads)
    rows = slice(MAX_CTX - 20, MAX_CTX - 20 + m)
    check("qkv rope + rms: q", q.view(m, heads, D), q_want)
    check("qkv rope + rms: k cache rows", caches[0][:, rows], caches[2][:, rows])
    check("qkv rope + rms: v cache rows", caches[1][:, rows], caches[3][:, rows])
    untouched = bool((caches[0][:, : MAX_CTX - 20] == 0).all() and (caches[0][:, rows.stop :] == 0).all())
    zeroed = bool((zero == 0).all())
    print(f"  other cache rows untouched {untouched}, totals zeroed {zeroed}")
    if not (untouched and zeroed):
        failures.append(f"{shape} M {m}: cache rows or zeroing")

    # gate/up: the SwiGLU of paired columns after the RMS scale.
    qw, qz, s = layer(2 * inter, hidden, gen)
    ref = awq_gemm_ref(x.float(), qw, qz, s)
    act = awq_mma(x, fragment_pack(qw, GROUP, pair=inter), qz, s, pdl=pdl, pair=inter, rms=rms, glu=True)
    check("gate/up swiglu + rms", act, silu_mul((ref * inv).to(torch.bfloat16)))

    # down: the residual add, the next norm's weight, the row totals.
    a = torch.randn(m, inter, device=dev, generator=gen).to(torch.bfloat16)
    qw, qz, s = layer(hidden, inter, gen)
    ref = awq_gemm_ref(a.float(), qw, qz, s)
    residual = torch.randn(m, hidden, device=dev, generator=gen).to(torch.bfloat16)
    before = residual.clone()
    weight = (torch.rand(hidden, device=dev, generator=gen) + 0.5).to(torch.bfloat16)
    totals = torch.zeros(16, device=dev)
    add = ResidualEpilogue(residual, weight, totals)
    out = awq_mma(a, fragment_pack(qw, GROUP), qz, s, pdl=pdl, residual=add)
    h = (ref.to(torch.bfloat16).float() + before.float()).to(torch.bfloat16)
    check("down residual: residual", residual, h)
    check("down residual: weighted row", out, (h.float() * weight.float()).to(torch.bfloat16))
    check("down residual: row totals", totals[:m], (h.float() ** 2).sum(1))
    if bool(totals[m:].any()):
        failures.append(f"{shape} M {m}: totals past M")


def main() -> None:
    gen = torch.Generator(torch.device("cuda")).manual_seed(0)
    for shape in SHAPES:
        for m in (1, 4, 11, 16):
            run(shape, m, pdl=m == 4, gen=gen)
    print(f"{len(failures)} failures: {failures}")
    sys.exit(len(failures))


if __name__ == "__main__":
    main()
