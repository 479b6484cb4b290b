"""`lsp-dscoder quantize SRC DST`: an INT4 AWQ checkpoint (AutoAWQ's GEMM format) from a bf16/fp16/fp32 one.

Layer by layer, so memory holds one full-precision layer at a time: the layer runs on the calibration
tokens (code), the activation-aware scales are searched and folded in (lsp_dscoder/quantize_search.py;
`--method rtn` skips this), and its seven linears are quantized per group and packed. The output has the
layout AutoAWQ writes: `quantization_config` in config.json, per linear `qweight`/`qzeros`/`scales`, fp16
embeddings, norms and LM head, safetensors sharded through an index when large, and the tokenizer files.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lsp_dscoder.engine.awq import GROUP_SIZES, AwqConfig, check_divisible
from lsp_dscoder.engine.checkpoint import resolve_model
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.errors import CheckpointError, EngineError
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.weights import INDEX, SINGLE, linear_shapes, shard_map
from lsp_dscoder.kernels.awq_format import pack_int4, quantize_groups
from lsp_dscoder.quantize_search import DenseLayer, ScaleChoice, run_layer
from lsp_dscoder.training.checkpoint import save_tensors

METHODS = ("awq", "rtn")
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")
# Default calibration: Python sources that every installation has (code, as the model will see).
DEFAULT_MODULES = ("argparse", "json.decoder", "dataclasses", "textwrap", "functools", "pathlib")
SHARD_BYTES = 4 * 2**30


@dataclass(frozen=True)
class QuantizeOptions:
    group_size: int = 128
    method: str = "awq"
    seq_len: int = 512
    max_sequences: int = 16
    grid: int = 20  # alphas tried by the search: 0, 1/grid, ..., (grid - 1)/grid
    device: str = "cpu"
    shard_bytes: int = SHARD_BYTES

    def __post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:  # what the reader accepts
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {self.group_size}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.seq_len < 2 or self.max_sequences < 1 or self.grid < 1:
            raise ValueError("seq_len must be >= 2, max_sequences and grid >= 1")


def calibration_ids(tok: Tokenizer, texts: list[str], opts: QuantizeOptions) -> list[torch.Tensor]:
    """Token sequences of up to seq_len, cut from the texts in order, at most max_sequences of them."""
    seqs: list[torch.Tensor] = []
    # A token is at least one character: no need to encode more of a text than could be used.
    budget = opts.seq_len * opts.max_sequences
    for text in texts:
        ids = tok.encode(text[:budget])
        for i in range(0, len(ids) - 1, opts.seq_len):
            if len(seqs) == opts.max_sequences:
                return seqs
            seqs.append(torch.tensor(ids[i : i + opts.seq_len], dtype=torch.long))
    if not seqs:
        raise ValueError("the calibration text holds no tokens")
    return seqs


def default_texts() -> list[str]:
    import importlib

    return [inspect.getsource(importlib.import_module(m)) for m in DEFAULT_MODULES]


def quantize_checkpoint(
    src: Path,
    dst: Path,
    opts: QuantizeOptions,
    texts: list[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[ScaleChoice]:
    """Write the AWQ checkpoint of `src` (a folder, or a repo id in the local Hugging Face cache) into
    `dst`, a new or empty folder; returns the scale choices (empty for RTN)."""
    src = resolve_model(src)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"{dst} exists and is not an empty folder: name a new one for the checkpoint")
    cfg = ModelConfig.from_file(src / "config.json")
    if cfg.quantization is not None:
        raise CheckpointError(f"{src} is already quantized ({cfg.quantization})")
    for name, (out, inp) in linear_shapes(cfg).items():
        check_divisible(name, out, inp, opts.group_size)
    dev = torch.device(opts.device)
    mapping = shard_map(src) or {k: src / SINGLE for k in _keys(src / SINGLE)}

    def get(name: str) -> torch.Tensor:
        if name not in mapping:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint in {src}")
        with safe_open(str(mapping[name]), framework="pt", device="cpu") as f:
            t: torch.Tensor = f.get_tensor(name)
        return t.to(dev, torch.float32)

    tok = Tokenizer(src)
    seqs = calibration_ids(tok, default_texts() if texts is None else texts, opts)
    embed = get("model.embed_tokens.weight")
    hidden = [embed[s.to(dev)] for s in seqs]  # (T, C) per sequence
    tensors = {
        "model.embed_tokens.weight": embed.half(),
        "model.norm.weight": get("model.norm.weight").half(),
    }
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = get("lm_head.weight").half()
    choices: list[ScaleChoice] = []
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        layer = DenseLayer(
            {name.split(".")[1]: get(p + name + ".weight") for name in linear_shapes(cfg)},
            get(p + "input_layernorm.weight"),
            get(p + "post_attention_layernorm.weight"),
        )
        hidden, made = run_layer(cfg, layer, hidden, opts.group_size, opts.method == "awq", opts.grid)
        choices += made
        tensors[p + "input_layernorm.weight"] = layer.input_norm.half()
        tensors[p + "post_attention_layernorm.weight"] = layer.post_norm.half()
        for name in linear_shapes(cfg):
            q, z, s = quantize_groups(layer.linears[name.split(".")[1]].T, opts.group_size)
            tensors[p + name + ".qweight"] = pack_int4(q).cpu()
            tensors[p + name + ".qzeros"] = pack_int4(z).cpu()
            tensors[p + name + ".scales"] = s.cpu()
        if log:
            alphas = ", ".join(f"{c.alpha:.2f}" for c in made) or "rtn"
            log(f"layer {n + 1}/{cfg.num_layers} quantized (alpha {alphas})")
    write_checkpoint(src, dst, {k: v.cpu().contiguous() for k, v in tensors.items()}, opts)
    return choices


def _keys(path: Path) -> list[str]:
    if not path.exists():
        raise CheckpointError(f"missing {SINGLE} or {INDEX} in checkpoint folder {path.parent}")
    with safe_open(str(path), framework="pt", device="cpu") as f:
        return list(f.keys())


def write_checkpoint(src: Path, dst: Path, tensors: dict[str, torch.Tensor], opts: QuantizeOptions) -> None:
    """config.json with quantization_config, the tensors (sharded past shard_bytes), the tokenizer."""
    dst.mkdir(parents=True, exist_ok=True)
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    raw["quantization_config"] = AwqConfig(group_size=opts.group_size).to_dict()
    raw["torch_dtype"] = "float16"  # AutoAWQ's dtype for everything that is not packed
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    save_tensors(dst, tensors, opts.shard_bytes, single=SINGLE)
    for name in COPIED:
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", type=Path, help="bf16/fp16/fp32 checkpoint folder")
    p.add_argument("dst", type=Path, help="folder for the AWQ checkpoint (created; must not hold files)")
    p.add_argument("--group-size", type=int, default=128, choices=GROUP_SIZES)
    p.add_argument("--method", default="awq", choices=METHODS, help="awq: activation-aware scales; rtn: none")
    p.add_argument("--calibration", type=Path, nargs="+", help="code files for calibration (default: stdlib)")
    p.add_argument("--seq-len", type=int, default=512, help="calibration sequence length in tokens")
    p.add_argument("--sequences", type=int, default=16, help="at most this many calibration sequences")
    p.add_argument("--device", default="cpu", help="where the search runs (cpu, cuda)")


def run(args: argparse.Namespace) -> int:
    try:
        opts = QuantizeOptions(
            group_size=args.group_size,
            method=args.method,
            seq_len=args.seq_len,
            max_sequences=args.sequences,
            device=args.device,
        )
        texts = None
        if args.calibration:
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in args.calibration]
        quantize_checkpoint(args.src, args.dst, opts, texts, log=lambda m: print(m, file=sys.stderr))
    except (EngineError, SafetensorError, ValueError, OSError) as e:  # a bad or unsupported checkpoint
        print(f"lsp-dscoder quantize: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.dst}", file=sys.stderr)
    return 0
