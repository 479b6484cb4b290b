"""From the chunks of an OpenAI-compatible `/v1/completions` stream to the engine's token events.

Where the endpoint says which token ids it generated (llama.cpp's `logprobs.content[].id`, vLLM's
`token_ids` or `token_id:N` logprob tokens), the ids are decoded with the local tokenizer exactly as the
in-process engine decodes its own, so the session's known pieces (and with them the next prompt, which
the engine's prefix cache must match) are the same on both backends. Without ids, each chunk's text is
one event with no token id.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lsp_dscoder.engine.api import CompletionStats, StopReason, TokenEvent
from lsp_dscoder.engine.stops import StopStringFilter
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_http import RemoteError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """What one streamed event says."""

    text: str
    token_ids: tuple[int, ...] | None  # None: the endpoint did not say
    finish_reason: str | None
    timings: Mapping[str, Any] | None  # llama.cpp's own timings (prompt_n, cache_n, predicted_ms, ...)
    usage: Mapping[str, Any] | None  # OpenAI usage (vLLM, llama.cpp), with prompt_tokens_details


def _ids(choice: Mapping[str, Any]) -> tuple[int, ...] | None:
    ids = choice.get("token_ids")  # vLLM with return_token_ids
    if isinstance(ids, list) and all(type(i) is int for i in ids):
        return tuple(ids)
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return None
    content = logprobs.get("content")  # llama.cpp: one entry per token, with its id
    if isinstance(content, list) and all(
        isinstance(c, Mapping) and type(c.get("id")) is int for c in content
    ):
        return tuple(c["id"] for c in content)
    tokens = logprobs.get("tokens")  # vLLM with return_tokens_as_token_ids: "token_id:123"
    if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        try:
            return tuple(int(t[len("token_id:") :]) for t in tokens)
        except ValueError:
            return None
    return None


def parse_chunk(data: str) -> Chunk:
    """One event's JSON; RemoteError for an error event or anything that is not a completion chunk."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        raise RemoteError(f"malformed stream chunk (not JSON): {data[:120]!r}") from None
    if not isinstance(obj, dict):
        raise RemoteError(f"malformed stream chunk (not an object): {data[:120]!r}")
    if "error" in obj:
        error = obj["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise RemoteError(f"the engine reported an error: {message}")
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise RemoteError(f"malformed stream chunk (no choices): {data[:120]!r}")
    timings, usage = obj.get("timings"), obj.get("usage")
    timings = timings if isinstance(timings, dict) else None
    usage = usage if isinstance(usage, dict) else None
    if not choices:  # vLLM's closing usage chunk
        return Chunk("", (), None, timings, usage)
    choice = choices[0]
    text = choice.get("text", "") if isinstance(choice, dict) else None
    if not isinstance(text, str):
        raise RemoteError(f"malformed stream chunk (choice without text): {data[:120]!r}")
    finish = choice.get("finish_reason")
    return Chunk(text, _ids(choice), finish if isinstance(finish, str) else None, timings, usage)


@dataclass(frozen=True)
class RemoteCompletionStats(CompletionStats):
    """The engine's stats, from the client's side, and the endpoint's own report as it gave it."""

    backend: Mapping[str, Any] | None = None  # llama.cpp `timings` and/or OpenAI `usage`


class StreamDecoder:
    """Turns chunks into token events: local decoding of ids, stop strings, healed characters left out.
    The events of one chunk go to `emit` together: whoever waits for them is woken once per chunk."""

    def __init__(
        self, tokenizer: Tokenizer, stop: tuple[str, ...], emit: Callable[[list[TokenEvent]], None]
    ) -> None:
        self._tok = tokenizer
        self._decoder = tokenizer.stream()
        self._stops = StopStringFilter(stop)
        self._emit = emit
        self.token_ids: list[int] = []
        self._pending: list[TokenEvent] = []  # events not emitted yet
        self.count = 0  # events that carried generated text or a token
        self.stopped = False  # a stop string was found
        self.finish_reason: str | None = None
        self.timings: Mapping[str, Any] | None = None
        self.usage: Mapping[str, Any] | None = None

    def healed(self, heal_ids: list[int]) -> None:
        """The tokens that spell the typed text the prompt builder left for healing: part of the
        completion's tokens (the endpoint's cache holds them), not of its text. Their events go out with
        the first chunk's: while the endpoint works, the server's threads leave the CPU to it."""
        for token in heal_ids:
            self.token_ids.append(token)
            piece = self._decoder.push(token)
            self._pending.append(TokenEvent(len(self.token_ids) - 1, token_id=token, text="", piece=piece))
            self.count += 1

    def _emit_pending(self) -> None:
        if self._pending:
            events, self._pending = self._pending, []
            self._emit(events)

    def feed(self, chunk: Chunk) -> None:
        self.timings = chunk.timings or self.timings
        self.usage = chunk.usage or self.usage
        self.finish_reason = chunk.finish_reason or self.finish_reason
        if not self.stopped:
            self._decode(chunk)
        self._emit_pending()

    def _decode(self, chunk: Chunk) -> None:
        if chunk.token_ids is None:
            if chunk.text:
                self._push(None, chunk.text)
            return
        for token in chunk.token_ids:
            if token == self._tok.eos_id:
                continue
            self.token_ids.append(token)
            self._push(token, self._decoder.push(token))
            if self.stopped:
                return

    def _push(self, token: int | None, piece: str) -> None:
        text, hit = self._stops.push(piece)
        index = len(self.token_ids) - 1 if token is not None else self.count
        self._pending.append(TokenEvent(index=index, token_id=token, text=text, piece=piece))
        self.count += 1
        self.stopped = hit

    def finish(self) -> str:
        """Emits what is held back; returns the completion's text."""
        if not self.stopped:
            tail = self._stops.push(self._decoder.flush())[0] + self._stops.flush()
            if tail:
                self._pending.append(TokenEvent(index=self.count, token_id=None, text=tail))
        self._emit_pending()
        return self._stops.text[: self._stops.emitted]

    def stop_reason(self, stop: tuple[str, ...]) -> StopReason:
        if self.stopped:
            return StopReason.STOP_STRING
        if self.finish_reason == "length":
            return StopReason.MAX_TOKENS
        # "stop": the endpoint cannot tell us whether a stop string or the end-of-sequence token ended it
        # (stop strings are sent to it so that it stops generating); a stop string is the likelier one.
        return StopReason.STOP_STRING if stop and self.finish_reason == "stop" else StopReason.EOS

    def backend_report(self) -> dict[str, Any] | None:
        report: dict[str, Any] = {}
        if self.timings:
            report["timings"] = dict(self.timings)
        if self.usage:
            report["usage"] = dict(self.usage)
        return report or None

    def cached_tokens(self) -> int | None:
        """Prompt tokens the endpoint took from its prefix cache, as it reports them."""
        if self.timings and type(self.timings.get("cache_n")) is int:
            return int(self.timings["cache_n"])
        details = self.usage.get("prompt_tokens_details") if self.usage else None
        if isinstance(details, Mapping) and type(details.get("cached_tokens")) is int:
            return int(details["cached_tokens"])
        return None

    def processed_tokens(self) -> int | None:
        """Prompt tokens the endpoint computed for this request."""
        if self.timings and type(self.timings.get("prompt_n")) is int:
            return int(self.timings["prompt_n"])
        return None

    def stats(
        self, prompt_tokens: int, submitted: float, started: float, ttft: float | None, stop: StopReason
    ) -> RemoteCompletionStats:
        """The request's stats: times from the client's side, prompt cache counts as the endpoint reports
        them (none for a request cut before its closing chunk)."""
        done = time.perf_counter()
        generated = len(self.token_ids) if self.token_ids else self.count
        report = self.backend_report()
        cached = self.cached_tokens() or 0
        processed = self.processed_tokens()
        prefilled = processed if processed is not None else prompt_tokens - cached
        if report is None:  # cut before the endpoint said what it computed
            prefilled = 0
        decode_s = done - started - (ttft or 0.0)
        return RemoteCompletionStats(
            prompt_tokens=prompt_tokens,
            reused_tokens=cached,
            prefilled_tokens=prefilled,
            generated_tokens=generated,
            queue_s=started - submitted,
            ttft_s=ttft,
            decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else None,
            total_s=done - started,
            stop_reason=stop,
            slot=0,
            backend=report,
        )
