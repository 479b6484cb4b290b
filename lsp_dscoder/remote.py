"""The `remote` backend: completions from an OpenAI-compatible serving engine (vLLM, SGLang, llama.cpp's
server) through `/v1/completions` with `stream: true`, behind the same API as the in-process engine.

The prompt is built locally with the checkpoint's tokenizer, exactly as for the in-process engine, and
sent as token ids (vLLM and llama.cpp accept them) or as text. Typing only appends to it, so the engine's
prefix cache (vLLM's automatic prefix caching, SGLang's radix cache, llama.cpp's `cache_prompt`) serves
each keystroke. Everything network runs on the server's event loop: a request is written within
`submit`, on a connection opened ahead of need (remote_wire.py builds it, encoding only what the keystroke
changed), and its stream is read by a task of that loop, which hands each chunk's events to the waiting
handler directly. Cancelling cuts the connection at once, which is how an HTTP client tells these engines
to stop generating. Callers without an event loop (scripts, tests) get one on a thread of the backend.

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
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsp_dscoder.engine.api import Completion, CompletionRequest, StopReason
from lsp_dscoder.engine.checkpoint import resolve_model
from lsp_dscoder.engine.errors import ContextOverflowError, EngineClosedError, EngineError
from lsp_dscoder.engine.handle import on_loop
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_config import RemoteConfig
from lsp_dscoder.remote_exchange import FAILURES, Exchanges
from lsp_dscoder.remote_handle import RemoteHandle
from lsp_dscoder.remote_health import Health, Notify, Status
from lsp_dscoder.remote_http import Body, Endpoint, RemoteError, check_status, describe, model_ids, read_head
from lsp_dscoder.remote_pool import ConnectionPool
from lsp_dscoder.remote_stream import StreamDecoder
from lsp_dscoder.remote_wire import TRACE_ENV, RequestWriter, Wire
from lsp_dscoder.settings import Settings

log = logging.getLogger(__name__)


class RemoteBackend:
    """An engine whose tokens come from an OpenAI-compatible endpoint. `loop`: the event loop that does
    the network (the server's); None: a loop of its own, on a thread of the backend."""

    def __init__(
        self,
        config: RemoteConfig,
        notify: Notify | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        status: Status | None = None,
    ) -> None:
        self.config = config
        self.endpoint = Endpoint.parse(config.endpoint)
        self.tokenizer = Tokenizer(config.tokenizer)
        self.max_context = config.max_context
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if config.api_key_env and not key:  # the user named a key: say so where they look, once
            message = f"environment variable {config.api_key_env} is empty: requests go without an API key"
            log.warning("%s", message)
            if notify is not None:
                notify(logging.WARNING, f"dscoder: {message}")
        self._own_loop = loop is None
        self._loop = loop or asyncio.new_event_loop()
        if self._own_loop:
            threading.Thread(target=self._serve, name="lsp-dscoder-remote", daemon=True).start()
        self._pool = ConnectionPool(self.endpoint, config.connect_timeout_s, self._loop)
        self.model = config.model
        self.health = Health(str(self.endpoint), self._probe, notify, status)
        self._exchanges = Exchanges(config, self.tokenizer, self._pool, self.health, self._finish)
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
    def submit(self, request: CompletionRequest, hand_off: bool = False) -> RemoteHandle:
        wire = self._wire(request)
        self.health.check()  # EndpointDownError while the endpoint is down and its retry has not come
        with self._lock:
            self._counters["requests"] += 1
            handle = RemoteHandle(request, self._counters["requests"])
            self._inflight.add(handle)
        if on_loop(self._loop):  # the server's handler: the request goes out before submit returns
            self._exchanges.start(handle, wire)
        else:
            try:
                self._loop.call_soon_threadsafe(self._exchanges.start, handle, wire)
            except RuntimeError:  # the loop has closed
                raise EngineClosedError("the remote backend has been shut down") from None
        return handle

    def keep_warm(self, interval_s: float | None) -> None:
        """Nothing to do: this backend's work runs on the event loop, which the server keeps warm."""

    def validate(self, request: CompletionRequest) -> CompletionRequest:
        """The checks of `submit` (its request body encoded too), nothing sent: raises what `submit` would
        raise for the request itself."""
        self._wire(request)
        return request

    def _wire(self, request: CompletionRequest) -> Wire:
        if self._closed:
            raise EngineClosedError("the remote backend has been shut down")
        n = len(request.prompt_ids)
        if n == 0:
            raise EngineError("empty prompt: at least one token (e.g. BOS) is required")
        if n > self.max_context:
            raise ContextOverflowError(f"prompt of {n} tokens exceeds the max context of {self.max_context}")
        return self._writer.wire(request, self.model)  # EngineError for a token id outside the vocabulary

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
        if self._closed:
            return
        self._closed = True
        self.health.close()
        with self._lock:
            inflight = list(self._inflight)
        for handle in inflight:  # cut their streams: each ends as cancelled, nobody waits forever
            handle.cancel()
        # On the loop, or with nothing running it any more (the server stops its loop before it closes
        # the backend): close the connections here; a drain scheduled on a stopped loop would never run.
        if on_loop(self._loop) or not self._loop.is_running():
            if not self._loop.is_closed():
                self._pool.close()
            return
        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):  # closing, or stuck
            asyncio.run_coroutine_threadsafe(self._drain(), self._loop).result(5)
        if self._own_loop:
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _drain(self) -> None:
        if self._exchanges.tasks:
            await asyncio.wait(list(self._exchanges.tasks), timeout=2)
        await self._pool.aclose()

    def _serve(self) -> None:
        """The backend's own loop, for callers without one."""
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _finish(
        self,
        handle: RemoteHandle,
        decoder: StreamDecoder,
        wire: Wire,
        ttft: float | None,
        stop: StopReason,
        error: str | None,
    ) -> None:
        text = decoder.finish()
        prompt = len(wire.ids)
        stats = decoder.stats(prompt, handle.submitted_at, handle.submitted_at, ttft, stop)
        with self._lock:
            c = self._counters
            c["errors" if error else "cancelled" if stop is StopReason.CANCELLED else "completed"] += 1
            c["prompt_tokens"] += prompt
            c["reused_tokens"] += stats.reused_tokens
            c["prefilled_tokens"] += stats.prefilled_tokens
            c["generated_tokens"] += stats.generated_tokens
            if ttft is not None:
                self._ttfts.append(ttft)
            if stats.backend is not None:
                self._last_backend = dict(stats.backend)
            self._inflight.discard(handle)
        result = Completion(text=text, token_ids=tuple(decoder.token_ids), stats=stats, error=error)
        handle._publish(result=result)
        if self._trace is not None:  # after the stream: the trace costs the keystroke nothing
            with open(self._trace, "ab") as f:
                f.write(wire.trace_line(handle.seq, handle.submitted_at, handle.cut_at))

    # -- the probe, from the health thread -----------------------------------------------------------
    def _probe(self) -> None:
        """GET /v1/models: RemoteError when the endpoint is not serving; learns the model name if unset."""
        limit = self.config.connect_timeout_s + self.config.first_token_timeout_s
        try:
            future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(self._list(), limit), self._loop)
            listing = future.result(limit + 1.0)
        except RuntimeError:  # the loop has closed
            raise RemoteError(f"{self.endpoint}: the backend has been shut down") from None
        except (*FAILURES, concurrent.futures.TimeoutError) as exc:
            raise RemoteError(describe(self.endpoint, exc)) from exc
        models = model_ids(listing)
        if self.model is None and models:
            self.model = models[0]
        elif self.model is not None and models and self.model not in models:
            log.warning("%s serves %s, not %r", self.endpoint, ", ".join(models), self.model)

    async def _list(self) -> bytes:
        conn = await self._pool.acquire()
        try:
            conn.write(self._writer.get_bytes(self.endpoint.path("/v1/models")))
            response = await read_head(conn.reader)
            body = Body(conn.reader, response)
            await check_status(response, body)
            listing = await body.read_all()
        except BaseException:
            conn.abort()
            raise
        self._pool.release(conn)
        self._pool.replenish()  # the spare connection the first keystroke will find
        return listing


def open_remote(
    settings: Settings,
    tokenizer: Path | str,
    notify: Notify | None,
    loop: asyncio.AbstractEventLoop,
    status: Status | None = None,
) -> RemoteBackend:
    """The remote backend for the server's settings, doing its network on `loop` (the server's), where
    `notify` and `status` are called too."""
    if settings.endpoint is None:
        raise ValueError("the remote backend needs an endpoint: set `endpoint` (or pass --endpoint URL)")

    def on_server_loop(fn: Callable[..., None] | None) -> Callable[..., None] | None:
        """`fn`, called on `loop` from whichever thread calls it (the probe's, the backend's)."""
        if fn is None:
            return None

        def call(*args: Any) -> None:
            loop.call_soon_threadsafe(fn, *args)

        return call

    config = RemoteConfig.from_settings(settings, resolve_model(tokenizer))
    log.info("remote backend: %s (tokenizer %s)", config.endpoint, config.tokenizer)
    return RemoteBackend(config, on_server_loop(notify), loop, on_server_loop(status))
