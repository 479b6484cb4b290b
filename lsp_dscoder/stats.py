"""Per-request records, the one log line each request gets, and the aggregates `dscoder/stats` returns."""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import CompletionStats

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

    def pick(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else None

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
        self.first_partial_early = False  # sent from the engine's thread (first_text.py)
        self.response_s: float | None = None
        self.prompt_s: float | None = None  # building the prompt
        self.early_s: float | None = None  # its suggestion was started from its didChange this much before
        self.engine: CompletionStats | None = None
        self.stop_rule: str | None = None
        self._engine_done = False
        self._logged = False

    def partial_sent(self, early: bool = False) -> None:
        """A partial went out; `early`: from the engine's thread, before the event loop had the text."""
        if self.first_partial_s is None:
            self.first_partial_s = self._stats.clock() - self.started
            self.first_partial_early = early

    def responded(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.response_s = self._stats.clock() - self.started
        self._maybe_finish()

    def completed(self, engine: CompletionStats | None, stop_rule: str | None) -> None:
        """The engine request ended: its stats (None if it failed)."""
        self.engine, self._engine_done = engine, True
        self.stop_rule = stop_rule
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        waiting_for_engine = self.source is Source.ENGINE and not self._engine_done
        if self._logged or self.outcome is None or waiting_for_engine:
            return
        self._logged = True
        self._stats.finish(self)

    def as_dict(self) -> dict[str, Any]:
        e = self.engine
        rate = None if e is None or e.decode_tokens_per_s is None else round(e.decode_tokens_per_s, 1)
        stop = None if e is None else getattr(e.stop_reason, "value", e.stop_reason)
        return {
            "requestId": self.request_id,
            "uri": self.uri,
            "version": self.version,
            "source": self.source.value,
            "outcome": self.outcome.value if self.outcome else None,
            "firstPartialMs": _ms(self.first_partial_s),
            "firstPartialEarly": self.first_partial_early if self.first_partial_s is not None else None,
            "responseMs": _ms(self.response_s),
            "promptMs": _ms(self.prompt_s),
            "earlyMs": _ms(self.early_s),
            "queueMs": None if e is None else _ms(e.queue_s),
            "stoppingMs": None if e is None else _ms(e.stopping_s),
            "engineTtftMs": None if e is None else _ms(e.ttft_s),
            "engineTextMs": None if e is None else _ms(e.text_s),
            "promptTokens": None if e is None else e.prompt_tokens,
            "reusedTokens": None if e is None else e.reused_tokens,
            "prefilledTokens": None if e is None else e.prefilled_tokens,
            "generatedTokens": None if e is None else e.generated_tokens,
            "decodeTokensPerS": rate,
            "stepsToText": None if e is None else e.steps_to_text,
            "draftedTokens": None if e is None else e.drafted_tokens,
            "acceptedTokens": None if e is None else e.accepted_tokens,
            "stopReason": stop,
            "stopRule": self.stop_rule,
        }

    def log_line(self, d: dict[str, Any] | None = None) -> str:
        """The request's log line; `d` is its `as_dict()` when the caller has it already."""
        d = self.as_dict() if d is None else d
        keys = (
            *("source", "outcome", "firstPartialMs", "firstPartialEarly", "promptMs", "earlyMs", "queueMs"),
            *("stoppingMs", "engineTtftMs"),
            "engineTextMs",
            "responseMs",
            *("promptTokens", "reusedTokens", "prefilledTokens", "generatedTokens", "decodeTokensPerS"),
            *("stepsToText", "draftedTokens", "acceptedTokens"),
            *("stopReason", "stopRule"),
        )
        quiet = {"draftedTokens", "acceptedTokens"}  # 0 on most requests (no drafts): left out then
        shown = ((k, d[k]) for k in keys if d[k] is not None and not (k in quiet and d[k] == 0))
        fields = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in shown)
        return f"request id={self.request_id} uri={self.uri} v={self.version} {fields}"


class Stats:
    """Aggregates over finished requests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.first_partial_ms: deque[float] = deque(maxlen=_WINDOW)
        self.engine_ttft_ms: deque[float] = deque(maxlen=_WINDOW)
        self.engine_text_ms: deque[float] = deque(maxlen=_WINDOW)
        self.recent: deque[dict[str, Any]] = deque(maxlen=_RECENT)

    def begin(self, request_id: Any, uri: str, version: int | None) -> RequestRecord:
        return RequestRecord(self, request_id, uri, version)

    def finish(self, record: RequestRecord) -> None:
        d = record.as_dict()
        if log.isEnabledFor(logging.INFO):  # stderr logs warnings only by default: no line to build
            log.info("%s", record.log_line(d))
        self.counts["requests"] += 1
        self.counts[f"source_{d['source']}"] += 1
        self.counts[f"outcome_{d['outcome']}"] += 1
        if d["firstPartialEarly"]:
            self.counts["first_partials_early"] += 1
        for key in ("promptTokens", "reusedTokens", "prefilledTokens", "generatedTokens"):
            self.tokens[key] += d[key] or 0
        if d["firstPartialMs"] is not None:
            self.first_partial_ms.append(d["firstPartialMs"])
        if d["engineTtftMs"] is not None:
            self.engine_ttft_ms.append(d["engineTtftMs"])
        if d["engineTextMs"] is not None:
            self.engine_text_ms.append(d["engineTextMs"])
        self.recent.append(d)

    def as_dict(self, recent: int = _RECENT) -> dict[str, Any]:
        """The aggregates and the last `recent` request records (oldest first)."""
        return {
            "counts": dict(self.counts),
            "tokens": dict(self.tokens),
            "firstPartialMs": percentiles(self.first_partial_ms),
            "engineTtftMs": percentiles(self.engine_ttft_ms),
            "engineTextMs": percentiles(self.engine_text_ms),
            "recent": list(self.recent)[len(self.recent) - min(recent, len(self.recent)) :],
        }
