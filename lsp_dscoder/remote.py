"""The `remote` backend: completions from an OpenAI-compatible serving engine (vLLM, SGLang, llama.cpp's
server) through `/v1/completions` with `stream: true`, behind the same API as the in-process engine.

The prompt is built locally with the checkpoint's tokenizer, exactly as for the in-process engine, and
sent as token ids (vLLM and llama.cpp accept them) or as text. Typing only appends to it, so the engine's
prefix cache (vLLM's automatic prefix caching, SGLang's radix cache, llama.cpp's `cache_prompt`) serves
each keystroke. A request is written by the thread that submits it, on a connection opened ahead of need
(remote_wire.py builds it, encoding only what the keystroke changed), and its stream is read on a worker
thread; cancelling cuts its connection at once, which is how an HTTP client tells these engines to stop
generating.

Token healing: the endpoints offer no portable way to constrain the first tokens to those spelling a
text (OpenAI's `logit_bias` would have to ban most of the vocabulary, for every token). The typed text
the prompt builder leaves for healing is tokenised and appended to the prompt instead, and reported as
the completion's first (healed, invisible) tokens: the completion is what the model writes after the
typed text, as with healing off.

Failures (nothing listening, too slow, HTTP errors, a dropped or malformed stream) end the request with
what was streamed so far; the endpoint is then marked unreachable and requests fail fast, without network,
until a probe on a backoff schedule finds it again. Each outage is announced once through `notify`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsp_dscoder.engine.api import Completion, CompletionRequest, StopReason
from lsp_dscoder.engine.checkpoint import resolve_model
from lsp_dscoder.engine.errors import ContextOverflowError, EngineClosedError, EngineError
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_config import RemoteConfig
from lsp_dscoder.remote_health import Health, Notify
from lsp_dscoder.remote_http import (
    ConnectionPool,
    Endpoint,
    HttpStatusError,
    RemoteError,
    RemoteHandle,
    abort,
    check_status,
    describe,
    model_ids,
    read_response,
    request_json,
    send_now,
    set_read_timeout,
    sse_events,
)
from lsp_dscoder.remote_stream import StreamDecoder, parse_chunk
from lsp_dscoder.remote_wire import TRACE_ENV, RequestWriter, Wire
from lsp_dscoder.settings import Settings

log = logging.getLogger(__name__)

_WORKERS = 8  # requests in flight at once (one per document being completed, and probes)


class RemoteBackend:
    """An engine whose tokens come from an OpenAI-compatible endpoint."""

    def __init__(self, config: RemoteConfig, notify: Notify | None = None) -> None:
        self.config = config
        self.endpoint = Endpoint.parse(config.endpoint)
        self.tokenizer = Tokenizer(config.tokenizer)
        self.max_context = config.max_context
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if config.api_key_env and not key:
            log.warning(
                "environment variable %s is empty: requests go without an API key", config.api_key_env
            )
        self._workers = concurrent.futures.ThreadPoolExecutor(
            _WORKERS, thread_name_prefix="lsp-dscoder-remote"
        )
        self._pool = ConnectionPool(self.endpoint, config.connect_timeout_s, self._spawn)
        self.model = config.model
        self.health = Health(str(self.endpoint), self._probe, notify)
        self._lock = threading.Lock()
        self._closed = False
        self._inflight: set[RemoteHandle] = set()
        self._counters = dict.fromkeys(
            ("requests", "completed", "cancelled", "errors", "prompt_tokens", "reused_tokens",
             "prefilled_tokens", "generated_tokens"),
            0,
        )  # fmt: skip
        self._ttfts: deque[float] = deque(maxlen=1000)
        self._trace = os.environ.get(TRACE_ENV) or None
        self._writer = RequestWriter(config, self.endpoint, self.tokenizer, key)
        self._last_backend: dict[str, Any] | None = None
        self.health.start()  # probes now (a keep-alive connection for the first keystroke), then on failure

    # -- the engine API ------------------------------------------------------------------------------
    def submit(self, request: CompletionRequest) -> RemoteHandle:
        if self._closed:
            raise EngineClosedError("the remote backend has been shut down")
        n = len(request.prompt_ids)
        if n == 0:
            raise EngineError("empty prompt: at least one token (e.g. BOS) is required")
        if n > self.max_context:
            raise ContextOverflowError(f"prompt of {n} tokens exceeds the max context of {self.max_context}")
        wire = self._writer.wire(request, self.model)  # EngineError for a token id outside the vocabulary
        self.health.check()  # EndpointDownError while the endpoint is down and its retry has not come
        with self._lock:
            self._counters["requests"] += 1
            handle = RemoteHandle(request, self._counters["requests"])
            self._inflight.add(handle)
        self._write_early(handle, wire)
        self._workers.submit(self._run, handle, wire)
        return handle

    def complete(self, request: CompletionRequest, timeout: float | None = None) -> Completion:
        return self.submit(request).result(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"backend": "remote", **self._counters}
            ttfts = sorted(self._ttfts)
            out["lastBackendReport"] = self._last_backend
        if ttfts:
            last = len(ttfts) - 1
            out["ttft_ms"] = {f"p{q}": 1e3 * ttfts[min(last, q * len(ttfts) // 100)] for q in (50, 90, 99)}
        out.update(self.health.as_dict())
        out["model"] = self.model
        out["connectionsOpened"] = self._pool.opened
        out["connectsOnRequestPath"] = self._pool.opened_on_request  # a keystroke waited for a handshake
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.health.close()
            with self._lock:
                inflight = list(self._inflight)
            for handle in inflight:  # cut their streams: each ends as cancelled, nobody waits forever
                handle.cancel()
            self._workers.shutdown(wait=False)
            self._pool.close()

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------------
    def _spawn(self, task: Callable[[], None]) -> None:
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # shut down meanwhile: nothing to warm up for
                self._workers.submit(task)

    def _write_early(self, handle: RemoteHandle, wire: Wire) -> None:
        """Writes the request now, on the submitting thread, when an idle connection is at hand: the
        endpoint starts on the keystroke while a worker thread wakes up to read the answer."""
        conn = self._pool.take()
        if conn is not None:
            handle.attach(conn)
            try:
                wire.sent = send_now(conn, wire.data)
            except OSError:  # closed by the server just now: the worker opens another
                handle.attach(None)
                conn.close()
            wire.clock.mark("write")

    def _run(self, handle: RemoteHandle, wire: Wire) -> None:
        request = handle.request
        started, clock = handle.submitted_at, wire.clock
        clock.mark("wake")  # this thread's start: it overlaps the endpoint's work when the request is out
        decoder = StreamDecoder(self.tokenizer, request.params.stop, handle.publish_events)
        decoder.healed(wire.heal_ids)
        self._pool.replenish()  # if this request took the spare: another, while the endpoint works
        ttft: float | None = None
        error: str | None = None
        stop: StopReason
        conn = handle.connection
        try:
            if handle.cancelled:
                raise _Cancelled
            if conn is None:
                conn = self._pool.acquire()  # connects now: the keystroke waits for a handshake
                handle.attach(conn)
            conn, response = self._response(handle, conn, wire)
            clock.mark("response")
            check_status(response)
            for event in sse_events(response):
                if ttft is None:
                    clock.mark("firstChunk")  # the chunk that carries the first text is the last marked
                before = decoder.count
                decoder.feed(parse_chunk(event))
                if ttft is None and decoder.count > len(wire.heal_ids) and decoder.count > before:
                    ttft = time.perf_counter() - started
                    clock.mark("parse")
                if decoder.stopped:
                    raise _Cancelled  # a stop string the endpoint did not apply: stop it here
                set_read_timeout(conn, self._timeout(request, self.config.read_timeout_s))
            stop = decoder.stop_reason(request.params.stop)
            handle.attach(None)
            if response.will_close:
                conn.close()
            else:
                self._pool.release(conn)
            conn = None
            self.health.succeeded(completion=True)
        except _Cancelled:
            stop = StopReason.STOP_STRING if decoder.stopped else StopReason.CANCELLED
        except (OSError, http.client.HTTPException, RemoteError) as exc:
            stop, error = self._failed(handle, request, exc)
        finally:
            conn = handle.connection or conn  # the retry's connection, if the first one was replaced
            if conn is not None:  # cut mid-stream: the connection cannot carry another request
                handle.attach(None)
                abort(conn)
                conn.close()
            self._pool.replenish()
        text = decoder.finish()
        self._finish(handle, decoder, text, wire.ids, started, ttft, stop, error)
        if self._trace is not None:  # after the stream: the trace costs the keystroke nothing
            line = wire.trace_line(handle.seq, handle.submitted_at, ttft is not None)
            with self._lock, open(self._trace, "ab") as f:
                f.write(line)

    def _response(
        self, handle: RemoteHandle, conn: http.client.HTTPConnection, wire: Wire
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Writes what is left of the request and reads the response's head. A kept-alive connection
        that the server closed just as it was taken fails before any answer: the request then goes once
        more, on a new connection (nothing of it was streamed yet)."""
        retried = False
        while True:
            set_read_timeout(conn, self._timeout(handle.request, self.config.first_token_timeout_s))
            try:
                if wire.sent < len(wire.data):
                    assert conn.sock is not None
                    conn.sock.sendall(memoryview(wire.data)[wire.sent :])
                    wire.clock.mark("write")
                return conn, read_response(conn)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if retried or handle.cancelled:
                    raise
            retried = True
            handle.attach(None)
            conn.close()
            conn, wire.sent = self._pool.acquire(), 0
            handle.attach(conn)

    def _timeout(self, request: CompletionRequest, seconds: float) -> float:
        if request.deadline is None:
            return seconds
        return min(seconds, request.deadline - time.monotonic())

    def _failed(
        self, handle: RemoteHandle, request: CompletionRequest, exc: Exception
    ) -> tuple[StopReason, str | None]:
        if handle.cancelled:
            return StopReason.CANCELLED, None
        if request.deadline is not None and time.monotonic() >= request.deadline:
            return StopReason.DEADLINE, None
        message = describe(self.endpoint, exc)
        if isinstance(exc, HttpStatusError) and 400 <= exc.status < 500 and exc.status not in (408, 429):
            self.health.refused(message)  # the request or the configuration is wrong, not the endpoint
        else:
            self.health.failed(message)
        return StopReason.ERROR, message

    def _finish(
        self,
        handle: RemoteHandle,
        decoder: StreamDecoder,
        text: str,
        ids: list[int],
        started: float,
        ttft: float | None,
        stop: StopReason,
        error: str | None,
    ) -> None:
        stats = decoder.stats(len(ids), handle.submitted_at, started, ttft, stop)
        generated, cached = stats.generated_tokens, stats.reused_tokens
        with self._lock:
            c = self._counters
            c["errors" if error else "cancelled" if stop is StopReason.CANCELLED else "completed"] += 1
            c["prompt_tokens"] += len(ids)
            c["reused_tokens"] += cached
            c["prefilled_tokens"] += stats.prefilled_tokens
            c["generated_tokens"] += generated
            if ttft is not None:
                self._ttfts.append(ttft)
            if stats.backend is not None:
                self._last_backend = dict(stats.backend)
            self._inflight.discard(handle)
        result = Completion(text=text, token_ids=tuple(decoder.token_ids), stats=stats, error=error)
        handle._publish(result=result)

    def _probe(self) -> None:
        """GET /v1/models: RemoteError when the endpoint is not serving; learns the model name if unset."""
        conn = None
        try:
            conn = self._pool.acquire()
            set_read_timeout(conn, self.config.first_token_timeout_s)
            response = request_json(conn, "GET", self.endpoint.path("/v1/models"), self._writer.headers())
            check_status(response)
            listing = response.read()
        except (OSError, http.client.HTTPException, RemoteError) as exc:
            if conn is not None:
                conn.close()
            raise RemoteError(describe(self.endpoint, exc)) from exc
        self._pool.release(conn)
        self._pool.replenish()  # the spare connection the first keystroke will find
        models = model_ids(listing)
        if self.model is None and models:
            self.model = models[0]
        elif self.model is not None and models and self.model not in models:
            log.warning("%s serves %s, not %r", self.endpoint, ", ".join(models), self.model)


class _Cancelled(Exception):
    """The stream is to be cut: the request was cancelled, or a stop string ended it here."""


def open_remote(
    settings: Settings, tokenizer: Path | str, notify: Notify | None, loop: asyncio.AbstractEventLoop
) -> RemoteBackend:
    """The remote backend for the server's settings; `notify` is called on `loop`, the server's."""
    if settings.endpoint is None:
        raise ValueError("the remote backend needs an endpoint: set `endpoint` (or pass --endpoint URL)")

    def on_loop(level: int, message: str) -> None:
        if notify is not None:
            loop.call_soon_threadsafe(notify, level, message)

    config = RemoteConfig.from_settings(settings, resolve_model(tokenizer))
    log.info("remote backend: %s (tokenizer %s)", config.endpoint, config.tokenizer)
    return RemoteBackend(config, on_loop)
