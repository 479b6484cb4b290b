"""Typed configuration: `ModelConfig` read from a checkpoint's config.json, `EngineConfig` for the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.engine.awq import QUANT_CONFIG_FILE, AwqConfig
from lsp_dscoder.engine.errors import CheckpointError, UnsupportedModelError
from lsp_dscoder.engine.lookup import DRAFT_MAX

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
    quantization: AwqConfig | None = None  # INT4 AWQ linear layers (engine/awq.py); None: dense

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_macs(self) -> int:
        """Multiply-adds of every layer's linear maps for one token (QKV, O, gate/up, down; no LM head)."""
        c = self.hidden_size
        per_layer = c * (self.q_size + 2 * self.kv_size) + self.q_size * c + 3 * c * self.intermediate_size
        return self.num_layers * per_layer

    @classmethod
    def from_dict(cls, raw: Any, source: str = "config.json") -> ModelConfig:
        if not isinstance(raw, dict):
            raise ConfigValueError(f"{source} must hold a JSON object, not a JSON {_json_kind(raw)}")
        if "auto_map" in raw:
            raise UnsupportedModelError(
                f"{source} asks for custom model code (auto_map); lsp-dscoder never runs remote code "
                "(trust_remote_code) and supports only LlamaForCausalLM checkpoints such as DeepSeek-Coder"
            )
        archs = raw.get("architectures") or []
        archs = [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]
        model_type = raw.get("model_type")
        if model_type != "llama" or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            found = f"architectures {archs or 'missing'}, model_type {model_type!r}"
            if not any(a in SUPPORTED_ARCHITECTURES for a in archs):  # the usual case: name the architecture
                found = f"architecture {', '.join(archs) or model_type or 'unknown'}"
                if not archs:
                    found += " (no 'architectures' list)"
            raise UnsupportedModelError(
                f"unsupported {found} in {source}: lsp-dscoder runs Llama-architecture "
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
            hidden = _int(raw, "hidden_size", source)
            heads = _int(raw, "num_attention_heads", source)
            theta, factor = _rope(raw, source)
            eos = raw.get("eos_token_id")
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            return cls(
                vocab_size=_int(raw, "vocab_size", source),
                hidden_size=hidden,
                intermediate_size=_int(raw, "intermediate_size", source),
                num_layers=_int(raw, "num_hidden_layers", source),
                num_heads=heads,
                num_kv_heads=_int(raw, "num_key_value_heads", source, default=heads),
                head_dim=_int(raw, "head_dim", source, default=hidden // heads),
                rms_norm_eps=_float(raw, "rms_norm_eps", source, 1e-6),
                rope_theta=theta,
                rope_scaling_factor=factor,
                max_position_embeddings=_int(raw, "max_position_embeddings", source, default=4096),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                bos_token_id=_token_id(raw.get("bos_token_id"), "bos_token_id", source),
                eos_token_id=_token_id(eos, "eos_token_id", source),
                quantization=_quantization(raw, source),
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
        quant_file = path.parent / QUANT_CONFIG_FILE  # AutoAWQ's older layout keeps it apart
        if isinstance(raw, dict) and "quantization_config" not in raw and quant_file.exists():
            try:
                raw = {**raw, "quantization_config": json.loads(quant_file.read_text(encoding="utf-8"))}
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{quant_file} is not valid JSON: {e}") from None
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


class ConfigValueError(CheckpointError, ValueError):
    """A config.json value that cannot describe a model (names the field and the value)."""


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _int(raw: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    """A positive integer field (JSON null or absent: the default, if there is one)."""
    value = raw[key] if default is None else raw.get(key)
    if value is None and default is not None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigValueError(f"{source}: {key}={json.dumps(value)} must be a positive integer")
    return value


def _float(raw: dict[str, Any], key: str, source: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigValueError(f"{source}: {key}={json.dumps(value)} must be a positive number")
    return float(value)


def _token_id(value: Any, key: str, source: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigValueError(f"{source}: {key}={json.dumps(value)} must be a token id (an integer >= 0)")
    return value


def _quantization(raw: dict[str, Any], source: str) -> AwqConfig | None:
    value = raw.get("quantization_config")
    return None if value is None else AwqConfig.from_dict(value, source)


def _rope(raw: dict[str, Any], source: str) -> tuple[float, float]:
    """(theta, linear factor) from either `rope_scaling` (transformers 4) or `rope_parameters` (5)."""
    key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise ConfigValueError(f"{source}: {key}={json.dumps(params)} must be a JSON object")
    theta = _float({"rope_theta": raw.get("rope_theta", 10000.0), **params}, "rope_theta", source, 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, 1.0
    if kind == "linear":
        if "factor" not in params:
            raise ConfigValueError(f"{source}: linear rope scaling without a factor")
        return theta, _float(params, "factor", source, 1.0)
    raise UnsupportedModelError(f"{source}: rope scaling {kind!r} is not supported (linear or none)")


def resolve(device: str = "auto", dtype: str | None = "auto") -> tuple[str, str]:
    """The one place that fills in device and dtype defaults (serve, complete, eval, bench): "auto" is
    cuda when a GPU is visible, else cpu; an "auto" (or None) dtype is bfloat16 on cuda, float32 on cpu."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype in (None, "auto"):
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


# Tokens a prefill step takes at most, unless the runner has longer steps that run faster
# (engine/step_graphs.py next_chunk); the engine checks for a stop between steps.
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class EngineConfig:
    """How to run a checkpoint. `max_context` sizes the KV buffer allocated once at start."""

    model: Path
    device: str = "cpu"
    dtype: str = "float32"
    max_context: int = 4096
    num_slots: int = 4
    prefill_chunk: int = PREFILL_CHUNK
    fast_path: bool | None = None  # None: on when the device is CUDA and Triton is importable
    # Greedy decoding's draft tokens a step (engine/lookup.py), 0 to 7. None: FAST_PATH_DRAFTS on the fast
    # path, where a step of eight tokens costs about what one does; none on the reference path.
    draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if self.draft_tokens is not None and not 0 <= self.draft_tokens <= DRAFT_MAX:
            raise ValueError(f"draft_tokens must be in [0, {DRAFT_MAX}], got {self.draft_tokens}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
