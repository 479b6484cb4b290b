"""The bundled model's shape and its checkpoint in DeepSeek-Coder's format (config.json keys, bf16 shards).

transformers 5 writes rope settings as `rope_parameters`; DeepSeek-Coder's config.json has top-level
`rope_theta` and `rope_scaling: {"type": "linear", "factor": 4.0}`, which every loader (ours and
transformers 4.x/5.x) reads, so config.json is written in that form.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lsp_dscoder.training.fim import SpecialIds


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    head_dim: int = 128  # as in every DeepSeek-Coder model

    def __post_init__(self) -> None:
        if self.hidden_size != self.num_attention_heads * self.head_dim:
            raise ValueError(f"hidden_size {self.hidden_size} != heads x head_dim in {self}")


SHAPES = {
    # 19.3M parameters: 38.5 MB in bf16, under the 40 MB package budget together with the tokenizer.
    "bundled": ModelShape(hidden_size=384, num_hidden_layers=8, num_attention_heads=3, intermediate_size=896),
    "tiny": ModelShape(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, head_dim=32
    ),
}


@dataclass(frozen=True)
class RopeSettings:
    theta: float = 100000.0
    linear_factor: float = 4.0
    max_position_embeddings: int = 4096


def llama_config(shape: ModelShape, vocab_size: int, ids: SpecialIds, rope: RopeSettings):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=rope.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=rope.theta,
        rope_scaling={"type": "linear", "factor": rope.linear_factor},
        tie_word_embeddings=False,
        bos_token_id=ids.bos,
        eos_token_id=ids.eos,
    )


def deepseek_config_json(config) -> dict:
    """config.json with DeepSeek-Coder's keys (rope_theta and rope_scaling at top level, "type")."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": config.initializer_range,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": {"factor": config.rope_parameters["factor"], "type": "linear"},
        "rope_theta": config.rope_parameters["rope_theta"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": config.vocab_size,
    }


@torch.no_grad()
def round_to_bf16(model: torch.nn.Module) -> None:
    """Round the fp32 master weights to bf16 values in place, so evaluation sees the shipped weights."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())


def save(model, config, folder: Path, max_shard_bytes: int) -> None:
    """bf16 safetensors shards + index (the Hugging Face layout), config.json and generation_config.json.

    Written with safetensors directly so that the layout does not depend on the transformers version.
    """
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    save_tensors(folder, state, max_shard_bytes)
    (folder / "config.json").write_text(json.dumps(deepseek_config_json(config), indent=2) + "\n")
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_tensors(
    folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int, single: str | None = None
) -> None:
    """Safetensors shards of at most `max_shard_bytes` (a larger tensor gets one of its own) and their
    `model.safetensors.index.json`; with `single` given, tensors that fit in one shard go to that one file
    without an index."""
    from safetensors.torch import save_file as save_shard

    def save_file(shard: dict[str, torch.Tensor], path: str, metadata: dict[str, str]) -> None:
        save_shard(shard, path, metadata=metadata)
        os.chmod(path, 0o666 & ~_umask())  # as open() would create it (safetensors leaves 0600)

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if single is not None and len(shards) == 1:
        save_file(shards[0], str(folder / single), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / filename), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


@torch.no_grad()
def reload_check(model: torch.nn.Module, folder: Path) -> float:
    """Load the folder back through transformers: linear rope read back, every tensor the saved bf16 one.

    Returns the largest absolute difference between a reloaded tensor and the bf16 in-memory one (0.0).
    """
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if reloaded.config.rope_parameters.get("rope_type") != "linear":
        raise RuntimeError(f"rope scaling not read back: {reloaded.config.rope_parameters}")
    mine = model.state_dict()
    worst = 0.0
    for name, tensor in reloaded.state_dict().items():
        diff = (tensor.float() - mine[name].to(torch.bfloat16).float().cpu()).abs().max().item()
        worst = max(worst, diff)
    return worst
