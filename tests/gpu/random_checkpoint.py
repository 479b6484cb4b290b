"""Write a checkpoint folder with DeepSeek-Coder 1.3B shapes, random weights (bf16) and the bundled
tokenizer: `python -m tests.gpu.random_checkpoint OUT [--device cuda]`. For end-to-end timing at the real
size where no real checkpoint can be downloaded."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lsp_dscoder.bundled import default_model_path
from tests.gpu.reference_parity import DS_13B


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (for a quick dry run)")
    args = ap.parse_args()
    raw = dict(DS_13B)
    if args.layers:
        raw["num_hidden_layers"] = args.layers
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**raw)).to(args.device, torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    model.save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path() / name, args.out / name)
    print(args.out)


if __name__ == "__main__":
    main()
