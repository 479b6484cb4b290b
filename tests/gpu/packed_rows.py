"""Steps of 17-64 rows on INT4 AWQ weights (GPU): the tensor-core kernel streaming the packed weights once
per 16 rows against dequantizing every matrix into bf16 for cuBLAS (engine/awq_fast.py offers it up to
32 rows).

    python -m tests.gpu.packed_rows [--models 1.3B,6.7B,33B] [--rows 16,24,32,48,64] [--engine 6.7b]

First per layer matrix at the DeepSeek-Coder shapes: µs per product inside a CUDA graph, each launch on
the next of several copies of the weights (larger than L2 together), with the streamed product checked
against `awq_gemm_ref`. Then whole models (random weights, quantized as `bench --quant awq` does): the
runner's warm-up choice per bucket, and both choices' graphs replayed over a 4K-token prefix, their logits
compared with each other.
"""

from __future__ import annotations

import argparse

import torch

from lsp_dscoder.bench_awq import awq_weights
from lsp_dscoder.bench_engine import start_engine
from lsp_dscoder.bench_measure import prefill_steps
from lsp_dscoder.engine.awq_fast import STREAM_ROWS
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.warmup import capture_one, replay_ms
from lsp_dscoder.kernels.awq_check import ROTATE_BYTES, graph_us, layer_shapes, random_awq
from lsp_dscoder.kernels.awq_dequant import fragment_dequant
from lsp_dscoder.kernels.awq_fragments import fragment_pack
from lsp_dscoder.kernels.awq_gemm import awq_gemm_ref
from lsp_dscoder.kernels.awq_mma import awq_mma
from lsp_dscoder.kernels.awq_plan import AwqWorkspace

GROUP = 128


def matrices(models: list[str], rows: list[int]) -> None:
    print("| model | matrix N x K | rows | streamed µs | dequant+cuBLAS µs | bf16 cuBLAS µs | err |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        for mat, n, k in layer_shapes(model):
            one_matrix(model, mat, n, k, rows)
            torch.cuda.empty_cache()


def one_matrix(model: str, mat: str, n: int, k: int, rows: list[int]) -> None:
    dev = torch.device("cuda")
    packed = random_awq(n, k, GROUP, dev)
    frag = (fragment_pack(packed[0], GROUP), *packed[1:])
    wbytes = sum(t.numel() * t.element_size() for t in packed)
    rot = [frag] + [tuple(t.clone() for t in frag) for _ in range(max(2, ROTATE_BYTES // wbytes) - 1)]
    dense = awq_gemm_ref(torch.eye(k, device=dev), *packed).to(torch.bfloat16)  # (K, N)
    drot = [dense] + [dense.clone() for _ in range(max(2, ROTATE_BYTES // (n * k * 2)) - 1)]
    buf = torch.empty(k, n, device=dev, dtype=torch.bfloat16)
    ws = AwqWorkspace.allocate(n, dev)
    for m in rows:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        want = awq_gemm_ref(x, *packed).float()
        got = awq_mma(x, *rot[0], out=y, workspace=ws).float()
        err = float((got - want).abs().max() / want.abs().max())
        t_s = graph_us(lambda i, x=x, y=y: awq_mma(x, *rot[i], out=y, workspace=ws), len(rot))
        t_d = graph_us(lambda i, x=x, y=y: torch.mm(x, fragment_dequant(*rot[i], out=buf), out=y), len(rot))
        t_b = graph_us(lambda i, x=x, y=y: torch.mm(x, drot[i], out=y), len(drot))
        cells = f"{t_s:.1f} | {t_d:.1f} | {t_b:.1f} | {err:.1e}"
        print(f"| {model} | {mat} {n}x{k} | {m} | {cells} |", flush=True)


def engine(shape: str, buckets: list[int]) -> None:
    from lsp_dscoder.bench import hf_config

    dev = torch.device("cuda")
    raw = hf_config(shape)
    cfg = ModelConfig.from_dict(raw, source=f"{shape} shape")
    runner = start_engine(cfg, awq_weights(raw, GROUP, dev), max_context=4096 + 256 + 64).runner
    prefix = 4096
    gen = torch.Generator(dev).manual_seed(3)
    ids = torch.randint(2, cfg.vocab_size, (prefix + max(buckets),), device=dev, generator=gen)
    prefill_steps(runner, ids[:prefix], 0)  # the prefix in the engine's own steps
    print(f"\n{shape} INT4, warm-up's choice per bucket: {runner.chosen}")
    print(
        "| bucket | dequant + cuBLAS ms | streamed ms | logits rel. L2 (streamed vs dequant) | same argmax |"
    )
    print("|---|---|---|---|---|")
    for b in buckets:
        out = {}
        for choice in ("cublas", "packed"):
            runner._use(choice)
            graph = capture_one(runner, b, 0)
            runner.ids[:b].copy_(ids[prefix : prefix + b])
            runner.start.fill_(prefix)
            ms = replay_ms(runner, b, graph, reps=30)
            runner.last.fill_(b - 1)
            runner.start.fill_(prefix)
            graph.replay(runner.part_done, runner.stream, None, runner.ahead)
            out[choice] = (ms, graph.logits.float().clone())
        (t_d, l_d), (t_s, l_s) = out["cublas"], out["packed"]
        rel = float((l_s - l_d).norm() / l_d.norm())
        same = bool(l_s.argmax() == l_d.argmax())
        print(f"| {b} | {t_d:.3f} | {t_s:.3f} | {rel:.2e} | {same} |", flush=True)
    runner._use(runner.eager_choice)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="1.3B,6.7B,33B")
    ap.add_argument("--rows", default="16,24,32,48,64")
    ap.add_argument("--engine", default="6.7b", help="shapes whose whole model is run ('' for none)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.models:
        matrices(args.models.split(","), rows)
    for shape in filter(None, args.engine.split(",")):
        engine(shape, [b for b in (32, 64) if b <= STREAM_ROWS])
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
