"""The engine: DeepSeek-Coder checkpoints, a reusable KV buffer, streaming generation on one device thread."""

from lsp_dscoder.engine.api import (
    Completion,
    CompletionRequest,
    CompletionStats,
    SamplingParams,
    StopReason,
    TokenEvent,
)
from lsp_dscoder.engine.config import EngineConfig, ModelConfig
from lsp_dscoder.engine.engine import CompletionHandle, Engine

__all__ = [
    "Completion",
    "CompletionHandle",
    "CompletionRequest",
    "CompletionStats",
    "Engine",
    "EngineConfig",
    "ModelConfig",
    "SamplingParams",
    "StopReason",
    "TokenEvent",
]
