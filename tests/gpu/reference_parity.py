"""GPU check of the reference path at DeepSeek-Coder 1.3B shapes (random weights, bf16), run by hand on
a CUDA machine: `python -m tests.gpu.reference_parity [--out DIR]`. Prints logits parity against
transformers on the same weights and the reference path's TTFT (cold 2K prompt, 4-token append)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lsp_dscoder.bench import COMMON, SHAPES, transformers_model
from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import weights_from_tensors
from tests.tiny import write_tokenizer

# The 1.3B shape as transformers' LlamaConfig keywords (the bench's table, without the checkpoint-only keys).
DS_13B = {k: v for k, v in {**COMMON, **SHAPES["1.3b"]}.items() if k not in ("model_type", "architectures")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, to check the script itself")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        DS_13B.update(
            hidden_size=128,
            intermediate_size=200,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
        torch.cuda.synchronize = lambda: None
    hf = transformers_model(DS_13B, dev)
    gpu = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name()
    results: dict = {"gpu": gpu, "torch": torch.__version__}
    folder = Path(tempfile.mkdtemp()) / "ds13b-random"
    hf.save_pretrained(folder)
    write_tokenizer(folder)
    mcfg = ModelConfig.from_file(folder / "config.json")
    sd = hf.state_dict()
    model = Transformer(mcfg, weights_from_tensors(lambda n: sd[n], mcfg, dev, torch.bfloat16), 4096)
    cache = KVCache(mcfg, 1, 4096, dev, torch.bfloat16)
    ids = torch.randint(0, 32256, (1024,), device=dev)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    ours = model.forward_reference(ids, 0, cache, 0, all_logits=True)
    rel = ((ours - ref).norm() / ref.norm()).item()
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    results["parity_1024_tokens"] = {
        "rel_l2": rel,
        "max_abs": (ours - ref).abs().max().item(),
        "argmax_agreement": agree,
        "ref_abs_max": ref.abs().max().item(),
    }
    print("parity", results["parity_1024_tokens"], flush=True)
    del model, cache
    if not args.dry_run:
        torch.cuda.empty_cache()

    # TTFT of the reference path through the engine (stats measured by the engine itself).
    ttft: dict[str, list[float]] = {"cold_2048": [], "append_4_over_2048": [], "decode_ms_per_token": []}
    with Engine(
        EngineConfig(model=folder, device=dev.type, dtype="bfloat16", max_context=4096, num_slots=2)
    ) as eng:

        def run(prompt, n=1):
            return eng.complete(CompletionRequest(tuple(prompt), SamplingParams(max_tokens=n)))

        run(torch.randint(2, 32000, (2048,)).tolist(), 4)  # warm-up (cuBLAS handles, allocator)
        for _ in range(5):
            prompt = torch.randint(2, 32000, (2048,)).tolist()
            cold = run(prompt)
            ttft["cold_2048"].append(cold.stats.ttft_s * 1e3)
            app = run(prompt + torch.randint(2, 32000, (4,)).tolist())
            assert app.stats.prefilled_tokens == 4, app.stats
            ttft["append_4_over_2048"].append(app.stats.ttft_s * 1e3)
            dec = run([*prompt, 5, 6, 7, 8, 9], 33)
            ttft["decode_ms_per_token"].append(1e3 / dec.stats.decode_tokens_per_s)
    results["engine_reference_ms_median"] = {k: statistics.median(v) for k, v in ttft.items()}
    print("engine reference path (ms, median of 5)", results["engine_reference_ms_median"], flush=True)

    # transformers on the same weights, same scenarios
    def timed(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    hf_t: dict[str, list[float]] = {"cold_2048": [], "append_4_over_2048": []}
    with torch.no_grad():
        for i in range(6):
            prompt = torch.randint(2, 32000, (1, 2048), device=dev)
            out = {}
            cold = timed(lambda p=prompt, o=out: o.update(r=hf(p, use_cache=True)))
            past = out["r"].past_key_values
            new = torch.randint(2, 32000, (1, 4), device=dev)
            app = timed(lambda n=new, pk=past: hf(n, past_key_values=pk, use_cache=True))
            if i:
                hf_t["cold_2048"].append(cold)
                hf_t["append_4_over_2048"].append(app)
    results["transformers_ms_median"] = {k: statistics.median(v) for k, v in hf_t.items()}
    print("transformers (ms, median of 5)", results["transformers_ms_median"], flush=True)
    if args.out:
        (args.out / "reference_parity.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
