"""Requests the engine tests build: a FIM prompt of the tiny checkpoints' tokenizer, a greedy request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lsp_dscoder.engine import CompletionRequest, Engine, SamplingParams


def fim_prompt(engine: Engine, before: str, after: str) -> tuple[int, ...]:
    t = engine.tokenizer
    return (t.bos_id, t.fim_begin_id, *t.encode(before), t.fim_hole_id, *t.encode(after), t.fim_end_id)


def req(ids: Sequence[int], max_tokens: int = 12, **kw: Any) -> CompletionRequest:
    return CompletionRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=max_tokens, **kw))
