"""Typed configuration: `ModelConfig` read from a checkpoint's config.json, `EngineConfig` for the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lsp_dscoder.engine.errors import CheckpointError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling_factor: float  # linear scaling: positions are divided by this; 1.0 = none
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        if "auto_map" in raw:
            raise UnsupportedModelError(
                f"{source} asks for custom model code (auto_map); lsp-dscoder never runs remote code "
                "(trust_remote_code) and supports only LlamaForCausalLM checkpoints such as DeepSeek-Coder"
            )
        archs = raw.get("architectures") or []
        if raw.get("model_type") != "llama" or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            found = ", ".join(archs) or raw.get("model_type") or "unknown"
            raise UnsupportedModelError(
                f"unsupported architecture {found} in {source}: lsp-dscoder runs Llama-architecture "
                "DeepSeek-Coder checkpoints (LlamaForCausalLM, e.g. deepseek-coder-1.3b/6.7b/33b-base); "
                "DeepSeek-V2 MoE and other architectures are not supported"
            )
        for key in ("attention_bias", "mlp_bias"):
            if raw.get(key):
                raise UnsupportedModelError(f"{source}: {key}=true is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"{source}: hidden_act={raw['hidden_act']!r} is not supported (silu only)"
            )
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            theta, factor = _rope(raw, source)
            eos = raw.get("eos_token_id")
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            return cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling_factor=factor,
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=eos,
            ).validated(source)
        except KeyError as e:
            raise CheckpointError(f"{source} lacks the required key {e.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"missing {path.name} in checkpoint folder {path.parent}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(raw, source=str(path))

    def validated(self, source: str) -> ModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"{source}: head_dim={self.head_dim} must be even for rotary embeddings")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"{source}: {name}={getattr(self, name)} must be positive")
        return self


def _rope(raw: dict, source: str) -> tuple[float, float]:
    """(theta, linear factor) from either `rope_scaling` (transformers 4) or `rope_parameters` (5)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, 1.0
    if kind == "linear":
        return theta, float(params["factor"])
    raise UnsupportedModelError(f"{source}: rope scaling {kind!r} is not supported (linear or none)")


@dataclass(frozen=True)
class EngineConfig:
    """How to run a checkpoint. `max_context` sizes the KV buffer allocated once at start."""

    model: Path
    device: str = "cpu"
    dtype: str = "float32"
    max_context: int = 4096
    num_slots: int = 4
    prefill_chunk: int = 512
    fast_path: bool | None = None  # None: on when the device is CUDA and Triton is importable

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
