"""Tiny random DeepSeek-Coder-format checkpoints for tests: a real byte-level BPE tokenizer with the
DeepSeek special tokens, and a LlamaForCausalLM saved with transformers' `save_pretrained`."""

from __future__ import annotations

import json
import os
from pathlib import Path

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
FIM_BEGIN = "<｜fim▁begin｜>"
FIM_HOLE = "<｜fim▁hole｜>"
FIM_END = "<｜fim▁end｜>"
SPECIAL_TOKENS = [BOS, EOS, FIM_BEGIN, FIM_HOLE, FIM_END]

_CORPUS_MODULES = ("os", "json", "argparse", "dataclasses", "textwrap", "functools")


def _corpus() -> list[str]:
    import importlib
    import inspect

    texts = [inspect.getsource(importlib.import_module(m)) for m in _CORPUS_MODULES]
    texts.append("héllo wörld 你好世界 😀 🎉 naïve café ✓ → λ")
    return texts


def write_tokenizer(folder: Path, vocab_size: int = 384) -> None:
    """Train a small byte-level BPE (deterministic) and save tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "add_bos_token": True,
                "add_eos_token": False,
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": EOS,
                "model_max_length": 16384,
                "tokenizer_class": "LlamaTokenizerFast",
            },
            ensure_ascii=False,
            indent=2,
        )
    )


def make_checkpoint(
    folder: Path,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 176,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int | None = None,
    head_dim: int | None = None,
    rope_scaling: dict | None = None,
    rope_theta: float = 100000.0,
    vocab_size: int = 384,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    max_shard_size: str | None = None,
) -> Path:
    """Save a random LlamaForCausalLM + tokenizer in DeepSeek-Coder's checkpoint format."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    write_tokenizer(folder, vocab_size=vocab_size)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads or num_attention_heads,
        head_dim=head_dim or hidden_size // num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # Larger-than-default init so that logits differ clearly between tokens.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    return folder


def cached_checkpoint(root: Path, name: str, **kwargs) -> Path:
    """make_checkpoint once per (root, name); reused across a test session."""
    folder = root / name
    if not (folder / "config.json").exists():
        make_checkpoint(folder, **kwargs)
    return folder


def default_tiny(root: Path | None = None) -> Path:
    """The tiny GQA checkpoint most LSP/editor tests run against (shared across processes via env)."""
    env = os.environ.get("LSP_DSCODER_TEST_MODEL")
    if env:
        return Path(env)
    assert root is not None
    return cached_checkpoint(root, "tiny-gqa", num_attention_heads=4, num_key_value_heads=2)


if __name__ == "__main__":
    # `python -m tests.tiny OUT_DIR`: write the default tiny checkpoint (used by the editor tests).
    import sys

    out = Path(sys.argv[1])
    make_checkpoint(out, num_attention_heads=4, num_key_value_heads=2)
    print(out)
