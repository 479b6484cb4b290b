"""`lsp-dscoder bench`: the engine against transformers and the hardware floors (GPU), or with
`--protocol`, keystrokes through a real server process timed by a raw JSON-RPC client (CPU or GPU).

Random weights with the exact DeepSeek-Coder shapes (the table in `kernels/shapes.py`) unless --model is
given. This module holds the command line and the model builders; the measurements live in
`bench_engine.py` and `bench_protocol.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.weights import Weights
from lsp_dscoder.kernels import shapes

# transformers' LlamaConfig keywords: per shape, and those every DeepSeek-Coder config shares
SHAPES = {
    m.name.lower(): dict(
        hidden_size=m.hidden,
        intermediate_size=m.inter,
        num_hidden_layers=m.layers,
        num_attention_heads=m.heads,
        num_key_value_heads=m.kv_heads,
    )
    for m in shapes.MODELS
}
COMMON = dict(
    vocab_size=shapes.VOCAB_SIZE,
    max_position_embeddings=shapes.MAX_POSITIONS,
    rms_norm_eps=shapes.RMS_NORM_EPS,
    rope_theta=shapes.ROPE_THETA,
    rope_scaling={"type": "linear", "factor": shapes.ROPE_LINEAR_FACTOR},
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", action="store_true", help="keystrokes through `lsp-dscoder --stdio`")
    p.add_argument(
        "--shapes",
        help="comma list of 1.3b, 6.7b, 33b: random weights of that shape (engine default 1.3b,6.7b; "
        "--protocol default: the bundled model)",
    )
    p.add_argument("--model", help="benchmark this checkpoint folder instead of random weights")
    p.add_argument("--reps", type=int, default=20, help="repetitions per scenario (median reported)")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    p.add_argument("--no-startup", action="store_true", help="skip the cold/second start measurement")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--startup-probe", help=argparse.SUPPRESS)
    p.add_argument("--quant", choices=["none", "awq"], default="none", help="awq: INT4 AWQ next to bf16")
    p.add_argument("--group-size", type=int, default=128, help="--quant awq: quantization group size")
    p.add_argument("--backend", choices=["local", "remote"], default="local", help="remote: see --endpoint")
    p.add_argument("--endpoint", help="remote: OpenAI-compatible server (default: start llama.cpp's)")
    p.add_argument("--remote-model", help="remote: the served model's name")
    from lsp_dscoder.bench_protocol import add_protocol_arguments

    add_protocol_arguments(p.add_argument_group("--protocol"))


def hf_config(shape: str) -> dict[str, Any]:
    """config.json of a DeepSeek-Coder shape ("1.3b"); ValueError for an unknown one."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    return {**COMMON, **SHAPES[shape]}


def build(shape: str | None, model_path: str | None, with_hf: bool) -> tuple[ModelConfig, Weights, Any]:
    """(ModelConfig, our Weights, transformers model or None) on CUDA in bf16, sharing the same values."""
    from lsp_dscoder.engine.weights import load_weights, random_weights, weights_from_tensors

    dev, dt = torch.device("cuda"), torch.bfloat16
    if model_path:
        cfg = ModelConfig.from_file(Path(model_path) / "config.json")
        weights = load_weights(Path(model_path), cfg, dev, dt)
        hf = None
        if with_hf:
            from transformers import LlamaForCausalLM

            loaded: Any = LlamaForCausalLM.from_pretrained(model_path, dtype=dt)
            hf = loaded.to(dev).eval()
        return cfg, weights, hf
    assert shape is not None
    raw = hf_config(shape)
    cfg = ModelConfig.from_dict(raw, source=f"{shape} shape")
    if not with_hf:
        return cfg, random_weights(cfg, dev, dt), None
    hf = transformers_model(raw, dev)
    sd = hf.state_dict()
    return cfg, weights_from_tensors(lambda n: sd[n], cfg, dev, dt), hf


def transformers_model(raw: dict[str, Any], device: torch.device) -> Any:
    """transformers' LlamaForCausalLM with seeded random bf16 weights, as from_pretrained would hold it.

    `.to(bfloat16)` also rounds the rotary inverse frequencies to bf16 (cos/sin off by up to ~0.17 at
    position 512), which from_pretrained does not do; the rotary module is rebuilt in float32 so that
    comparisons are against transformers as users run it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    keys: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    keys["attn_implementation"] = "sdpa"
    config = LlamaConfig(**keys)
    hf: Any = LlamaForCausalLM(config)
    hf = hf.to(device, torch.bfloat16).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    exact_rotary(hf)
    return hf


def exact_rotary(hf: Any) -> None:
    """Put float32 rotary inverse frequencies (freshly computed from the config) back into `hf`."""
    rot = hf.model.rotary_emb
    fresh = type(rot)(config=hf.config)  # built on the CPU in float32
    for name in ("inv_freq", "original_inv_freq"):
        if hasattr(rot, name):
            setattr(rot, name, getattr(fresh, name).to(rot.inv_freq.device))


def run(args: argparse.Namespace) -> int:
    if args.backend == "remote":
        from lsp_dscoder.bench_remote import run_remote

        return run_remote(args)
    if args.protocol:
        from lsp_dscoder.bench_protocol import run_protocol

        return run_protocol(args)
    if not torch.cuda.is_available():
        print(
            "lsp-dscoder: error: bench needs a CUDA GPU (bench --protocol runs on CPU too)", file=sys.stderr
        )
        return 2
    if args.quant == "awq":
        from lsp_dscoder.bench_awq import run_awq

        awq = run_awq(args)
        if args.json:
            print(json.dumps({"gpu": torch.cuda.get_device_name(), "results": awq}, indent=2))
        return 0
    from lsp_dscoder.bench_engine import bench_model, print_table, run_engine, start_engine

    if args.startup_probe:
        cfg, weights, _ = build(args.startup_probe, None, with_hf=False)
        print(json.dumps({"warmup_s": start_engine(cfg, weights, 4096 + 64).warmup_s}))
        return 0
    if not args.model:  # random weights drawn on the GPU, one shape at a time (33B fits next to transformers)
        return run_engine(args)
    cfg, weights, hf = build(None, args.model, not args.no_transformers and _has_transformers())
    r = bench_model(args.model, cfg, weights, hf, args.reps)
    if args.json:
        gpu = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        print(json.dumps({**gpu, "results": [r]}, indent=2))
    else:
        print_table(r)
    return 0


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True
