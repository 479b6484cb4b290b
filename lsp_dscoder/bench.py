"""`lsp-dscoder bench`: the fast path against transformers on the same weights, and the hardware floors.

Scenarios (GPU time by CUDA events, median of repetitions): cold prefill of 512/2K/4K/8K tokens, a
keystroke (4 new tokens over 4K cached), a line change (256 over 4K), a decode step at 4K. Floors come
from the GEMM rate and copy bandwidth this command measures itself. Random weights with the exact
DeepSeek-Coder shapes unless --model is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lsp_dscoder.engine.config import ModelConfig

SHAPES = {
    "1.3b": dict(
        hidden_size=2048,
        intermediate_size=5504,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
    ),
    "6.7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
    ),
}
COMMON = dict(
    vocab_size=32256,
    max_position_embeddings=16384,
    rms_norm_eps=1e-6,
    rope_theta=100000.0,
    rope_scaling={"type": "linear", "factor": 4.0},
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
)
# name: (new tokens, cached prefix)
SCENARIOS = {
    "cold 512": (512, 0),
    "cold 2K": (2048, 0),
    "cold 4K": (4096, 0),
    "cold 8K": (8192, 0),
    "keystroke +4 @4K": (4, 4096),
    "line +256 @4K": (256, 4096),
    "decode @4K": (1, 4096),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="1.3b,6.7b", help="comma list of 1.3b, 6.7b (random weights)")
    p.add_argument("--model", help="benchmark this checkpoint folder instead of random weights")
    p.add_argument("--reps", type=int, default=20, help="repetitions per scenario (median reported)")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    p.add_argument("--no-startup", action="store_true", help="skip the cold/second start measurement")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--startup-probe", help=argparse.SUPPRESS)


def _events(fn, reps: int) -> float:
    """Median GPU milliseconds of fn() over reps runs (after warm-up)."""
    from lsp_dscoder.kernels.check_gpu import median_ms

    return median_ms(fn, reps)


def measure_floors() -> dict:
    """The measured ceilings (the kernels' check uses the same measurement)."""
    from lsp_dscoder.kernels.check_gpu import measure_floors as floors

    copy_bps, gemm_flops = floors(torch.device("cuda"))
    return {"gemm_tflops": gemm_flops / 1e12, "copy_tbps": copy_bps / 1e12}


def floor_ms(cfg: ModelConfig, new: int, prefix: int, floors: dict) -> tuple[float, str]:
    c, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    linear = layers * (c * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * c + 3 * c * i)
    attn = 4 * layers * cfg.q_size * new * (prefix + (new + 1) / 2)
    flops = 2 * new * linear + attn + 2 * c * v
    kv_bytes = layers * 2 * cfg.kv_size * 2 * (prefix + new)
    weight_bytes = 2 * (linear + c * v)
    t_flop = flops / (floors["gemm_tflops"] * 1e9)
    t_mem = (weight_bytes + kv_bytes) / (floors["copy_tbps"] * 1e9)
    return max(t_flop, t_mem), "FLOP" if t_flop > t_mem else "bytes"


def build(shape: str | None, model_path: str | None, with_hf: bool):
    """(ModelConfig, our Weights, transformers model or None) on CUDA in bf16, sharing the same values."""
    from lsp_dscoder.engine.weights import load_weights, random_weights, weights_from_tensors

    dev, dt = torch.device("cuda"), torch.bfloat16
    if model_path:
        cfg = ModelConfig.from_file(Path(model_path) / "config.json")
        weights = load_weights(Path(model_path), cfg, dev, dt)
        hf = None
        if with_hf:
            from transformers import LlamaForCausalLM

            hf = LlamaForCausalLM.from_pretrained(model_path, dtype=dt).to(dev).eval()
        return cfg, weights, hf
    raw = {**COMMON, **SHAPES[shape]}
    cfg = ModelConfig.from_dict(raw, source=f"{shape} shape")
    if not with_hf:
        return cfg, random_weights(cfg, dev, dt), None
    hf = transformers_model(raw, dev)
    sd = hf.state_dict()
    return cfg, weights_from_tensors(lambda n: sd[n], cfg, dev, dt), hf


def transformers_model(raw: dict, device: torch.device):
    """transformers' LlamaForCausalLM with seeded random bf16 weights, as from_pretrained would hold it.

    `.to(bfloat16)` also rounds the rotary inverse frequencies to bf16 (cos/sin off by up to ~0.17 at
    position 512), which from_pretrained does not do; the rotary module is rebuilt in float32 so that
    comparisons are against transformers as users run it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures")},
        attn_implementation="sdpa",
    )
    hf = LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    exact_rotary(hf)
    return hf


def exact_rotary(hf) -> None:
    """Put float32 rotary inverse frequencies (freshly computed from the config) back into `hf`."""
    rot = hf.model.rotary_emb
    fresh = type(rot)(config=hf.config)  # built on the CPU in float32
    for name in ("inv_freq", "original_inv_freq"):
        if hasattr(rot, name):
            setattr(rot, name, getattr(fresh, name).to(rot.inv_freq.device))


def start_engine(cfg: ModelConfig, weights, max_context: int, slots: int = 1):
    from lsp_dscoder.engine.fast import BUCKETS, FastRunner
    from lsp_dscoder.engine.kv_cache import KVCache
    from lsp_dscoder.engine.model import Transformer

    cache = KVCache(cfg, slots, max_context, torch.device("cuda"), torch.bfloat16, pad=max(BUCKETS))
    model = Transformer(cfg, weights, cache.capacity)
    t = time.perf_counter()
    runner = FastRunner(model, cache)
    runner.capture()
    return model, cache, runner, time.perf_counter() - t


def startup_times(shape: str) -> dict:
    """Warm-up (kernel compile + graph capture) in a fresh process with an empty Triton cache, then again
    in a second fresh process with the cache the first one left: the second start."""
    out = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**__import__("os").environ, "TRITON_CACHE_DIR": cache_dir}
        for name in ("first start", "second start"):
            cmd = [sys.executable, "-m", "lsp_dscoder", "bench", "--startup-probe", shape]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            out[name] = (
                json.loads(res.stdout.strip().splitlines()[-1])["warmup_s"] if res.returncode == 0 else None
            )
    return out


def parity(model, cache, runner, hf, cfg) -> dict:
    """Logits of a 512-token prompt: fast vs reference vs transformers (bf16) vs transformers in fp32."""
    ids = torch.randint(2, cfg.vocab_size, (512,), device="cuda")
    fast = runner.prefill(ids, 0, 0)
    ref = model.forward_reference(ids, 0, cache, 0)
    rows = {"fast vs reference": (fast, ref)}
    if hf is not None:
        with torch.no_grad():
            hf_bf16 = hf(ids[None], logits_to_keep=1).logits[0].float()
            truth = hf.float()(ids[None], logits_to_keep=1).logits[0].float()
            hf.to(torch.bfloat16)
            exact_rotary(hf)
        rows |= {
            "fast vs transformers": (fast, hf_bf16),
            "fast vs fp32": (fast, truth),
            "reference vs fp32": (ref, truth),
            "transformers bf16 vs fp32": (hf_bf16, truth),
        }
    return {k: float((a - b).norm() / b.norm()) for k, (a, b) in rows.items()}


def bench_model(label: str, cfg, weights, hf, reps: int) -> dict:
    floors = measure_floors()
    model, cache, runner, warmup = start_engine(cfg, weights, max_context=8192 + 64)
    result: dict = {"model": label, "floors": floors, "warmup_s": warmup, "rows": []}
    result["parity_rel_l2"] = parity(model, cache, runner, hf, cfg)
    for name, (new, prefix) in SCENARIOS.items():
        row = measure(runner, hf, cfg, new, prefix, reps, floors)
        result["rows"].append({"scenario": name, **row})
    return result


def measure(runner, hf, cfg: ModelConfig, new: int, prefix: int, reps: int, floors: dict) -> dict:
    ids = torch.randint(2, cfg.vocab_size, (prefix + new,), device="cuda")
    if prefix:
        runner.prefill(ids[:prefix], 0, 0)

    def step() -> torch.Tensor:
        if new == 1 and prefix:
            return runner.decode(int(ids[-1]), prefix, 0)
        return runner.prefill(ids[prefix:], prefix, 0)

    n = reps if new <= 512 else max(3, reps // 4)
    before = runner.counts["graph_replays"]
    ours = _events(lambda: step().argmax(-1), n)
    replays = (runner.counts["graph_replays"] - before) / (n + 1)
    t = time.perf_counter()
    for _ in range(5):
        int(step().argmax(-1).item())  # host view: launch + replay + sampling + sync
    host = (time.perf_counter() - t) / 5 * 1e3
    theirs = hf_time(hf, ids, new, prefix, reps) if hf is not None else None
    floor, bound = floor_ms(cfg, new, prefix, floors)
    return {
        "ours_ms": ours,
        "ours_host_ms": host,
        "transformers_ms": theirs,
        "floor_ms": floor,
        "bound": bound,
        "graph_replays_per_step": replays,
    }


def hf_time(hf, ids: torch.Tensor, new: int, prefix: int, reps: int) -> float:
    from transformers import DynamicCache

    with torch.no_grad():
        if not prefix:
            return _events(lambda: hf(ids[None], logits_to_keep=1), max(3, reps // 4))
        cache = DynamicCache()
        hf(ids[None, :prefix], past_key_values=cache, use_cache=True, logits_to_keep=1)

        def step():
            hf(ids[None, prefix:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(prefix)

        return _events(step, reps)


def print_table(r: dict) -> None:
    f = r["floors"]
    print(
        f"\n## {r['model']}  (bf16; measured floors: GEMM {f['gemm_tflops']:.0f} TFLOP/s, "
        f"copy {f['copy_tbps']:.2f} TB/s)"
    )
    print(
        "| scenario | ours ms (GPU) | ours ms (host, incl. sync) | transformers ms | floor ms | ours/floor | "
        "transformers/ours | graph replays/step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        hf, ours = row["transformers_ms"], row["ours_ms"]
        hf_text = f"{hf:.3f}" if hf else "n/a"
        speedup = f"{hf / ours:.1f}x" if hf else "n/a"
        print(
            f"| {row['scenario']} | {ours:.3f} | {row['ours_host_ms']:.3f} | {hf_text} | "
            f"{row['floor_ms']:.3f} ({row['bound']}) | {ours / row['floor_ms']:.2f} | {speedup} | "
            f"{row['graph_replays_per_step']:.0f} |"
        )
    starts = ", ".join(
        f"{k}: {v:.1f} s" if v is not None else f"{k}: failed" for k, v in r.get("startup", {}).items()
    )
    print(f"warm-up in this process: {r['warmup_s']:.1f} s; {starts}")
    print(
        "logits rel. L2 error (512-token prompt): "
        + ", ".join(f"{k} {v:.2e}" for k, v in r["parity_rel_l2"].items())
    )


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("lsp-dscoder: error: bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.startup_probe:
        cfg, weights, _ = build(args.startup_probe, None, with_hf=False)
        print(json.dumps({"warmup_s": start_engine(cfg, weights, 4096 + 64)[3]}))
        return 0
    with_hf = not args.no_transformers and _has_transformers()
    results = []
    for shape in [None] if args.model else args.shapes.split(","):
        cfg, weights, hf = build(shape, args.model, with_hf)
        r = bench_model(
            args.model or f"DeepSeek-Coder {shape} shape, random weights", cfg, weights, hf, args.reps
        )
        del weights, hf
        torch.cuda.empty_cache()
        if not args.no_startup and shape:
            r["startup"] = startup_times(shape)
        results.append(r)
        if not args.json:
            print_table(r)
    if args.json:
        print(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results},
                indent=2,
            )
        )
    return 0


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True
