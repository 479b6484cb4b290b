"""One request's exchange with the endpoint, on the event loop: the request written (within `submit` when
an idle connection is at hand), the response's head, its stream turned into token events as chunks
arrive, and its end: read to `[DONE]` (the connection goes back to the pool), or cut (cancelled, a stop
string, a failure), with the endpoint's health told what happened."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from lsp_dscoder.engine.api import CompletionRequest, StopReason
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_config import RemoteConfig
from lsp_dscoder.remote_handle import RemoteHandle, Watchdog
from lsp_dscoder.remote_health import Health
from lsp_dscoder.remote_http import (
    Body,
    Endpoint,
    Events,
    HttpStatusError,
    RemoteError,
    ResponseHead,
    check_status,
    describe,
    read_head,
)
from lsp_dscoder.remote_pool import Connection, ConnectionPool
from lsp_dscoder.remote_stream import StreamDecoder, parse_chunk
from lsp_dscoder.remote_wire import Wire

log = logging.getLogger(__name__)

# what an exchange takes for the endpoint failing (RemoteError included); anything else is a bug
FAILURES = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, RemoteError, ValueError)

SPARE_DELAY_S = 0.002  # first text -> the spare connection opened (the partial has reached the editor)

# the backend's bookkeeping once a request has ended: (handle, decoder, wire, ttft, stop, error)
Finish = Callable[[RemoteHandle, StreamDecoder, Wire, float | None, StopReason, str | None], None]


class _Cancelled(Exception):
    """The stream is to be cut: the request was cancelled, or a stop string ended it here."""


class Exchanges:
    """The requests in flight to one endpoint. Every method runs on the loop's thread."""

    def __init__(
        self,
        config: RemoteConfig,
        tokenizer: Tokenizer,
        pool: ConnectionPool,
        health: Health,
        finish: Finish,
    ) -> None:
        self.config, self.tokenizer, self.pool, self.health = config, tokenizer, pool, health
        self.endpoint: Endpoint = pool.endpoint
        self.loop = pool.loop
        self._finish = finish
        self.tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references

    def start(self, handle: RemoteHandle, wire: Wire) -> None:
        """Writes the request now when an idle connection is at hand (the endpoint starts on it while
        this returns), and starts the task that reads its answer."""
        conn = None if handle.cancelled else self.pool.take()
        if conn is not None:
            handle.attach(conn)
            wire.send(conn)
        task = self.loop.create_task(self._run(handle, wire))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, handle: RemoteHandle, wire: Wire) -> None:
        request, clock = handle.request, wire.clock
        decoder = StreamDecoder(self.tokenizer, request.params.stop, handle.publish_events)
        decoder.healed(wire.heal_ids)
        dog = Watchdog(self.loop, handle.cut)
        ttft: float | None = None
        error: str | None = None
        stop: StopReason
        try:
            if handle.cancelled:
                raise _Cancelled
            dog.arm(self._timeout(request, self.config.first_token_timeout_s))
            conn, head = await self._response(handle, wire, dog)
            clock.mark("response")
            body = Body(conn.reader, head)
            await check_status(head, body)
            events = Events(body)
            # The stages run to the chunk whose text went out first: the first token's text may show
            # nothing yet (a line break, indentation the shaping holds back until more comes). Without an
            # observer, which sends it (stdio), to the first token's chunk.
            observed, healed = request.observer is not None, len(wire.heal_ids)
            while (event := await events.next()) is not None:
                if not wire.shown:
                    clock.mark("firstChunk")  # the chunk that carries the shown text is the last marked
                before = decoder.count
                decoder.feed(parse_chunk(event))
                if (
                    not wire.shown
                    and decoder.count > healed
                    and (handle.shown_index is not None or not observed)
                ):
                    clock.mark("parse")
                    wire.shown_at(handle.shown_index)
                if ttft is None and decoder.count > max(healed, before):
                    ttft = time.perf_counter() - handle.submitted_at
                    wire.first_timings = decoder.timings
                    # The next keystroke's connection, opened once this partial is on its way: while the
                    # endpoint computes, or the partial goes out, a handshake would compete for the CPU.
                    self.loop.call_later(SPARE_DELAY_S, self.pool.replenish)
                    # The consumer was woken: let it send the partial before the rest of the chunk (read
                    # without waiting, when the endpoint sent more) is parsed.
                    await asyncio.sleep(0)
                if decoder.stopped:
                    raise _Cancelled  # a stop string the endpoint did not apply: stop it here
                dog.arm(self._timeout(request, self.config.read_timeout_s))
            if not wire.shown and decoder.count > healed:  # nothing showed before the end:
                clock.mark("firstChunk")  # the answer goes out now, the stream's last wait the endpoint's
                wire.shown_at(decoder.count - 1, end=True)
            stop = decoder.stop_reason(request.params.stop)
            handle.attach(None)
            if head.will_close:
                conn.close()
            else:
                self.pool.release(conn)
            self.health.succeeded(completion=True)
        except _Cancelled:
            stop = StopReason.STOP_STRING if decoder.stopped else StopReason.CANCELLED
        except FAILURES as exc:
            stop, error = self._failed(handle, request, TimeoutError() if dog.expired else exc)
        except Exception as exc:  # a bug of ours: logged, and the editor's request still gets its answer
            log.exception("remote request %d failed", handle.seq)
            stop, error = StopReason.ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            dog.stop()
            cut = handle.connection
            if cut is not None:  # cut mid-stream: the connection cannot carry another request
                handle.attach(None)
                cut.abort()
            self.pool.replenish()
        self._finish(handle, decoder, wire, ttft, stop, error)

    async def _response(
        self, handle: RemoteHandle, wire: Wire, dog: Watchdog
    ) -> tuple[Connection, ResponseHead]:
        """Writes the request if `start` could not, and reads the response's head. A kept-alive
        connection that the server closed just as it was taken fails before any answer: the request then
        goes once more, on a new connection (nothing of it was streamed yet)."""
        retried = False
        while True:
            conn = handle.connection
            if conn is None:
                conn = await self.pool.acquire()  # connects now: the keystroke waits for a handshake
                handle.attach(conn)  # cut at once if cancelled meanwhile
                if dog.expired:
                    raise TimeoutError
                wire.send(conn)
            try:
                return conn, await read_head(conn.reader)
            except ConnectionResetError:
                if retried or handle.cancelled or dog.expired:
                    raise
            retried = True
            handle.attach(None)
            conn.abort()

    def _timeout(self, request: CompletionRequest, seconds: float) -> float:
        if request.deadline is None:
            return seconds
        return min(seconds, request.deadline - time.monotonic())

    def _failed(
        self, handle: RemoteHandle, request: CompletionRequest, exc: BaseException
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
