"""How the remote backend reaches its endpoint: a typed config, checked where it is made, and built from
the server's settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsp_dscoder.remote_http import Endpoint
from lsp_dscoder.settings import RemotePrompt, Settings


@dataclass(frozen=True)
class RemoteConfig:
    endpoint: str  # http(s)://host:port, optionally with a path prefix
    tokenizer: Path  # checkpoint folder whose tokenizer files match the served model
    model: str | None = None  # the served model's name; None: the first one the endpoint lists
    api_key_env: str | None = None  # environment variable holding the API key (sent as a bearer token)
    token_ids: bool = True  # send the prompt as token ids and ask for generated ids; False: text
    max_context: int = 4096
    connect_timeout_s: float = 2.0
    first_token_timeout_s: float = 10.0
    read_timeout_s: float = 5.0
    extra: Mapping[str, Any] = field(default_factory=dict)  # more request fields (the remoteRequest setting)

    def __post_init__(self) -> None:
        Endpoint.parse(self.endpoint)  # ValueError naming the bad URL
        for name in ("connect_timeout_s", "first_token_timeout_s", "read_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")

    @staticmethod
    def from_settings(settings: Settings, tokenizer: Path) -> RemoteConfig:
        if settings.endpoint is None:
            raise ValueError("the remote backend needs an endpoint: set `endpoint` (or pass --endpoint URL)")
        return RemoteConfig(
            endpoint=settings.endpoint,
            tokenizer=tokenizer,
            model=settings.remote_model,
            api_key_env=settings.api_key_env,
            token_ids=settings.remote_prompt is RemotePrompt.TOKENS,
            max_context=settings.max_context,
            connect_timeout_s=settings.connect_timeout_ms / 1000.0,
            first_token_timeout_s=settings.first_token_timeout_ms / 1000.0,
            read_timeout_s=settings.read_timeout_ms / 1000.0,
            extra=dict(settings.remote_request or {}),
        )
