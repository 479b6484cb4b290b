"""An INT4 AWQ checkpoint through the fast path against transformers on the same checkpoint dequantized
to bf16, and against the original: relative L2 of the logits and greedy-token agreement on real code.

    python -m tests.gpu.awq_parity AWQ_DIR ORIGINAL_DIR [--tokens 32] [--device cuda]

The fast path runs the packed layers (its dequantizing kernels; prefill, then one decode step per token,
CUDA graphs on CUDA). It decodes greedily; transformers then runs the prompt plus those tokens in one
forward (teacher forcing), so every position compares the same context. Prompts are this repository's
own source files, cut to 256 tokens at a line start.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.bench_build import transformers_twin
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.factory import assemble
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.generate import Runner
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.weights import Weights, dequantized_weights, load_weights

SOURCES = ("lsp_dscoder/session.py", "engine/kv_cache.py", "kernels/rms_norm.py", "lsp_dscoder/framing.py")


def prompts(tok: Tokenizer, root: Path, length: int) -> list[list[int]]:
    out = []
    for name in SOURCES:
        text = (root / name).read_text()
        ids = tok.encode(text[text.index("\n\n") + 2 :])[:length]  # past the module docstring's first line
        out.append(ids)
    return out


def fast_greedy(
    folder: Path, cfg: ModelConfig, device: torch.device, ids: list[int], n: int
) -> tuple[list[int], torch.Tensor]:
    """Our tokens and logits (n, V): the packed fast path's greedy continuation of ids."""
    dtype = dtype_for(device)
    weights = load_weights(folder, cfg, device, dtype, packed=True)
    assert weights.layers[0].quant is not None, "the AWQ layers were not kept packed"
    runner: Runner
    if device.type == "cuda":
        runner = assemble(cfg, weights, num_slots=1, max_context=1024, device=device, dtype=dtype).runner
        assert isinstance(runner, FastRunner), "the fast path did not start"
    else:  # TRITON_INTERPRET=1: the same kernels, eager (a dry run of this script)
        cache = KVCache(cfg, 1, 1024, device, dtype, pad=16)
        runner = FastRunner(Transformer(cfg, weights, cache.capacity), cache, graphs=False)
    logits = runner.prefill(torch.tensor(ids, device=device), 0, 0)
    tokens, rows = [], []
    for pos in range(len(ids), len(ids) + n):
        assert logits is not None
        rows.append(logits.float().squeeze(0))
        tokens.append(int(logits.argmax()))
        logits = runner.decode(tokens[-1], pos, 0)
    return tokens, torch.stack(rows)  # (n,), (n, V)


def dtype_for(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def hf_logits(
    raw: dict[str, Any], cfg: ModelConfig, w: Weights, ids: list[int], tokens: list[int]
) -> torch.Tensor:
    hf = transformers_twin(raw, cfg, w).to(w.embed.dtype)
    with torch.no_grad():
        out = hf(torch.tensor([ids + tokens[:-1]], device=w.embed.device)).logits[0].float()  # (T, V)
    return out[len(ids) - 1 :]  # the rows that predict tokens[0..n-1]


def compare(ours: torch.Tensor, ref: torch.Tensor, tokens: list[int]) -> dict[str, float]:
    rel = ((ours - ref).norm(dim=-1) / ref.norm(dim=-1)).median().item()
    agree = (ref.argmax(dim=-1).cpu() == torch.tensor(tokens)).float().mean().item()
    return {"rel_l2_median": rel, "greedy_agreement": agree}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("awq", type=Path)
    ap.add_argument("original", type=Path)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    raw = {k: v for k, v in json.loads((args.awq / "config.json").read_text()).items() if "quant" not in k}
    cfg = ModelConfig.from_file(args.awq / "config.json")
    dtype = dtype_for(device)
    deq = dequantized_weights(load_weights(args.awq, cfg, device, dtype, packed=True), dtype)
    orig_cfg = ModelConfig.from_file(args.original / "config.json")
    orig = load_weights(args.original, orig_cfg, device, dtype)
    tok = Tokenizer(args.awq)
    rows = []
    for n, ids in enumerate(prompts(tok, Path(__file__).resolve().parents[2], args.prompt_tokens)):
        tokens, ours = fast_greedy(args.awq, cfg, device, ids, args.tokens)
        row = {"prompt": SOURCES[n], "prompt_tokens": len(ids), "generated": len(tokens)}
        row["vs_dequantized_transformers"] = compare(ours, hf_logits(raw, cfg, deq, ids, tokens), tokens)
        row["vs_original_transformers"] = compare(ours, hf_logits(raw, orig_cfg, orig, ids, tokens), tokens)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for key in ("vs_dequantized_transformers", "vs_original_transformers"):
        rel = sorted(r[key]["rel_l2_median"] for r in rows)
        agree = sum(r[key]["greedy_agreement"] for r in rows) / len(rows)
        print(f"{key}: median rel. L2 per prompt {[f'{x:.3g}' for x in rel]}, greedy agreement {agree:.1%}")


if __name__ == "__main__":
    main()
