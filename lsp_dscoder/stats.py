"""Per-request records, the one log line each request gets, and the aggregates `dscoder/stats` returns."""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("lsp_dscoder.requests")
_RECENT = 64
_WINDOW = 1024


class Source(enum.Enum):
    ENGINE = "engine"  # a new engine request
    MEMORY = "memory"  # typed through a running or finished suggestion: no prefill
    NONE = "none"  # answered without the engine (not ready, superseded while debouncing)


class Outcome(enum.Enum):
    OK = "ok"
    EMPTY = "empty"  # nothing to suggest
    CANCELLED = "cancelled"  # $/cancelRequest: answered -32800
    SUPERSEDED = "superseded"  # a newer request or an edit that does not continue the suggestion
    NOT_READY = "not_ready"
    ERROR = "error"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def percentiles(values: deque[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else None
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


class RequestRecord:
    """One completion request. Logged once, when its response is out and (for an engine request) the
    engine's completion stats have arrived."""

    def __init__(self, stats: Stats, request_id: Any, uri: str, version: int | None) -> None:
        self._stats = stats
        self.request_id = request_id
        self.uri = uri
        self.version = version
        self.started = stats.clock()
        self.source = Source.NONE
        self.outcome: Outcome | None = None
        self.first_partial_s: float | None = None
        self.response_s: float | None = None
        self.prompt_s: float | None = None  # building the prompt
        self.engine: dict[str, Any] | None = None
        self.stop_rule: str | None = None
        self._logged = False

    def partial_sent(self) -> None:
        if self.first_partial_s is None:
            self.first_partial_s = self._stats.clock() - self.started

    def responded(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.response_s = self._stats.clock() - self.started
        self._maybe_finish()

    def completed(self, engine_stats: dict[str, Any] | None, stop_rule: str | None) -> None:
        self.engine = engine_stats or {}
        self.stop_rule = stop_rule
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        waiting_for_engine = self.source is Source.ENGINE and self.engine is None
        if self._logged or self.outcome is None or waiting_for_engine:
            return
        self._logged = True
        self._stats.finish(self)

    def as_dict(self) -> dict[str, Any]:
        e = self.engine or {}
        return {
            "requestId": self.request_id,
            "uri": self.uri,
            "version": self.version,
            "source": self.source.value,
            "outcome": self.outcome.value if self.outcome else None,
            "firstPartialMs": _ms(self.first_partial_s),
            "responseMs": _ms(self.response_s),
            "promptMs": _ms(self.prompt_s),
            "queueMs": _ms(e.get("queue_s")),
            "engineTtftMs": _ms(e.get("ttft_s")),
            "promptTokens": e.get("prompt_tokens"),
            "reusedTokens": e.get("reused_tokens"),
            "prefilledTokens": e.get("prefilled_tokens"),
            "generatedTokens": e.get("generated_tokens"),
            "decodeTokensPerS": None if (rate := e.get("decode_tokens_per_s")) is None else round(rate, 1),
            "stopReason": e.get("stop_reason"),
            "stopRule": self.stop_rule,
        }

    def log_line(self) -> str:
        d = self.as_dict()
        keys = ("source", "outcome", "firstPartialMs", "promptMs", "queueMs", "engineTtftMs", "responseMs")
        keys += ("promptTokens",)
        keys += ("reusedTokens", "prefilledTokens", "generatedTokens", "decodeTokensPerS", "stopReason")
        fields = " ".join(f"{k}={d[k]}" for k in (*keys, "stopRule") if d[k] is not None)
        return f"request id={self.request_id} uri={self.uri} v={self.version} {fields}"


class Stats:
    """Aggregates over finished requests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.first_partial_ms: deque[float] = deque(maxlen=_WINDOW)
        self.engine_ttft_ms: deque[float] = deque(maxlen=_WINDOW)
        self.recent: deque[dict[str, Any]] = deque(maxlen=_RECENT)

    def begin(self, request_id: Any, uri: str, version: int | None) -> RequestRecord:
        return RequestRecord(self, request_id, uri, version)

    def finish(self, record: RequestRecord) -> None:
        d = record.as_dict()
        log.info("%s", record.log_line())
        self.counts["requests"] += 1
        self.counts[f"source_{d['source']}"] += 1
        self.counts[f"outcome_{d['outcome']}"] += 1
        for key in ("promptTokens", "reusedTokens", "prefilledTokens", "generatedTokens"):
            self.tokens[key] += d[key] or 0
        if d["firstPartialMs"] is not None:
            self.first_partial_ms.append(d["firstPartialMs"])
        if d["engineTtftMs"] is not None:
            self.engine_ttft_ms.append(d["engineTtftMs"])
        self.recent.append(d)

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "tokens": dict(self.tokens),
            "firstPartialMs": percentiles(self.first_partial_ms),
            "engineTtftMs": percentiles(self.engine_ttft_ms),
            "recent": list(self.recent),
        }
