"""The engine: DeepSeek-Coder checkpoints, a reusable KV buffer, streaming generation on one device thread.

Names are imported on first use (PEP 562): `lsp_dscoder.engine.api` and the other torch-free modules
load without torch, which the remote backend never needs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import (
        Completion,
        CompletionRequest,
        CompletionStats,
        SamplingParams,
        StopReason,
        TokenEvent,
    )
    from lsp_dscoder.engine.config import EngineConfig, ModelConfig
    from lsp_dscoder.engine.engine import Engine
    from lsp_dscoder.engine.handle import CompletionHandle

_WHERE = {
    **dict.fromkeys(
        ("Completion", "CompletionRequest", "CompletionStats", "SamplingParams", "StopReason", "TokenEvent"),
        "api",
    ),
    "EngineConfig": "config",
    "ModelConfig": "config",
    "CompletionHandle": "handle",
    "Engine": "engine",
}
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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
