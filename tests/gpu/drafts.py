"""Draft tokens on a CUDA machine (docs/benchmarks.md, "Draft tokens"), run by hand:

    python -m tests.gpu.drafts [--cases 120] [--shapes 1.3b,6.7b]

1. What a drafting step costs: GPU ms of a decode step and of every-row steps of 4 and 8 tokens at 4K
   cached, the engine's graphs on random weights of each DeepSeek-Coder shape.
2. What drafting keeps: the bundled model completing FIM cases (one to three removed lines) with 0, 3 and
   7 drafts, twice each, one engine each: tokens/s after the first token, drafted and kept tokens, and how
   many completions equal the undrafted ones. The held-out list where its files are on this machine,
   else this machine's stdlib modules.
"""

from __future__ import annotations

import argparse
import glob
import random
import statistics
import sysconfig
from pathlib import Path

import torch

from lsp_dscoder.bench import hf_config
from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.fast_choices import BUCKETS
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import random_weights
from lsp_dscoder.eval_cases import Doc, fim_cases, load_heldout
from lsp_dscoder.kernels.check_gpu import median_ms

CACHED = 4096


def step_costs(shape: str, dev: torch.device) -> None:
    cfg = ModelConfig.from_dict(hf_config(shape))
    cache = KVCache(cfg, 1, 2 * CACHED + 64, dev, torch.bfloat16, pad=max(BUCKETS))
    model = Transformer(cfg, random_weights(cfg, dev, torch.bfloat16), cache.capacity)
    runner = FastRunner(model, cache)
    runner.capture()
    ids = torch.randint(2, cfg.vocab_size, (CACHED + 8,), device=dev)
    pos = 0
    while pos < CACHED:
        n = runner.chunk(CACHED - pos, pos, 512)
        runner.prefill(ids[pos : pos + n], pos, 0)
        pos += n
    steps = {
        "decode": lambda: runner.decode(int(ids[CACHED]), CACHED, 0),
        "every-row 4": lambda: runner.verify(ids[CACHED : CACHED + 4], CACHED, 0),
        "every-row 8": lambda: runner.verify(ids[CACHED : CACHED + 8], CACHED, 0),
    }
    ms: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3):  # rounds interleaved
        for name, step in steps.items():
            ms[name].append(median_ms(lambda step=step: step().argmax(-1), 20))
    cells = "; ".join(f"{k} {statistics.median(v):.3f}" for k, v in ms.items())
    print(f"{shape} @{CACHED}, GPU ms: {cells}")


def documents() -> tuple[str, list[Doc]]:
    docs = load_heldout(None, default_model_path())
    if len(docs) >= 20:
        return "the held-out list", docs
    files = sorted(glob.glob(str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")))[::3]
    docs = [{"id": f, "text": Path(f).read_text(errors="replace")} for f in files]
    return f"{len(files)} stdlib modules", docs


def completions(n: int, dev: torch.device) -> None:
    where, docs = documents()
    cases = fim_cases(docs, n, random.Random(0))
    print(f"{n} FIM cases from {where}")
    outs: dict[int, tuple[tuple[int, ...], ...]] = {}
    for drafts in (0, 3, 7, 0, 3, 7):
        at = {"model": default_model_path(), "device": str(dev), "dtype": "bfloat16", "max_context": 4096}
        config = EngineConfig(**at, draft_tokens=drafts)
        with Engine(config) as eng:
            tok, done = eng.tokenizer, []
            for c in cases:
                before, after = tok.encode(c.prefix[-6000:])[-2500:], tok.encode(c.suffix[:2000])[:1000]
                ids = [tok.bos_id, tok.fim_begin_id, *before, tok.fim_hole_id, *after, tok.fim_end_id]
                params = SamplingParams(max_tokens=64, temperature=0)
                done.append(eng.complete(CompletionRequest(prompt_ids=ids, params=params)))
        after_first = sum(len(r.token_ids) - 1 for r in done if len(r.token_ids) > 1)
        decode_s = sum(r.stats.total_s - (r.stats.ttft_s or 0.0) for r in done if len(r.token_ids) > 1)
        drafted = sum(r.stats.drafted_tokens for r in done)
        kept = sum(r.stats.accepted_tokens for r in done)
        outs.setdefault(drafts, tuple(r.token_ids for r in done))
        same = sum(a == b for a, b in zip(outs[0], outs[drafts], strict=True))
        print(
            f"drafts {drafts}: {sum(len(r.token_ids) for r in done)} tokens, {after_first / decode_s:.0f} "
            f"tokens/s after the first, drafted {drafted}, kept {kept}, equal to drafts 0: {same} of {n}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=120)
    ap.add_argument("--shapes", default="1.3b,6.7b")
    args = ap.parse_args()
    dev = torch.device("cuda")
    for shape in args.shapes.split(","):
        step_costs(shape, dev)
        torch.cuda.empty_cache()
    completions(args.cases, dev)


if __name__ == "__main__":
    main()
