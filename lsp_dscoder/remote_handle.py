"""A remote request as the server sees it: a completion handle whose cancel cuts its HTTP connection, and
the timer that gives up on a silent endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from lsp_dscoder.engine.api import CompletionRequest, TokenEvent
from lsp_dscoder.engine.handle import CompletionHandle
from lsp_dscoder.remote_pool import Connection


class RemoteHandle(CompletionHandle):
    """A CompletionHandle whose cancel also cuts the HTTP stream, so the engine stops at once. Its events
    are published on the loop that reads the stream (a consumer on that loop is woken directly)."""

    def __init__(self, request: CompletionRequest, seq: int) -> None:
        super().__init__(request)
        self.seq = seq  # the backend's count of requests when this one came
        self.cut_at: float | None = None  # time.perf_counter() when its stream was cut (cancel or timeout)
        self._conn: Connection | None = None

    def cancel(self) -> None:
        super().cancel()
        self.cut()  # the connection is read after the flag is set: attach() reads the flag after setting it

    def cut(self) -> None:
        """Cuts the request's connection, if it has one (cancelled, or its time is up)."""
        conn = self._conn
        if conn is not None:
            if self.cut_at is None:
                self.cut_at = time.perf_counter()
            conn.abort()

    @property
    def connection(self) -> Connection | None:
        return self._conn

    def attach(self, conn: Connection | None) -> None:
        self._conn = conn
        if conn is not None and self.cancelled:
            conn.abort()

    def publish_events(self, events: list[TokenEvent]) -> None:
        """Several events at once, with one wake-up of the consumer."""
        for event in events[:-1]:
            self._observe(event)
        with self._cond:
            self._events.extend(events[:-1])
        self._publish(event=events[-1])


class Watchdog:
    """A stream's time limit, on the loop: one timer per request, moved forward on every chunk without
    re-arming it (a late timer re-arms itself once, for the deadline it finds)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[], None]) -> None:
        self._loop, self._expire = loop, expire
        self._at = 0.0  # the deadline (loop time)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the timer fires (uvloop's timer handles do not say)
        self.expired = False

    def arm(self, seconds: float) -> None:
        self._at = self._loop.time() + max(seconds, 1e-3)
        if self._timer is None or self._timer_at > self._at:
            self.stop()
            self._start(self._at)

    def _start(self, at: float) -> None:
        self._timer, self._timer_at = self._loop.call_at(at, self._fire), at

    def _fire(self) -> None:
        self._timer = None
        if self._loop.time() < self._at:
            self._start(self._at)
            return
        self.expired = True
        self._expire()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
