"""A submitted request as its consumers see it: token events as they come, then the completion. No torch:
the remote backend's handles are these too."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from functools import partial

from lsp_dscoder.engine.api import Completion, CompletionRequest, TokenEvent
from lsp_dscoder.engine.errors import EngineError


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on `loop`'s thread (inside one of its callbacks or tasks)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class CompletionHandle:
    """One submitted request: its token events as they come, then its `Completion` (or error)."""

    HANDOVER_S = 0.001  # the longest the producer waits for the consumer to take the first visible text
    PICKUP_S = 0.001  # the longest a submitter waits in `wait_launched` (Engine.submit's hand_off)

    def __init__(self, request: CompletionRequest) -> None:
        self.request = request
        self.submitted_at = time.perf_counter()
        self._cancel = threading.Event()
        self._cond = threading.Condition()
        self._events: list[TokenEvent] = []
        self._result: Completion | None = None
        self._error: EngineError | None = None
        self._done = False
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._consumer_thread: int | None = None  # the thread of the last consumer that streamed
        self._handover: threading.Event | None = None  # set once a consumer took the first visible text
        self._launched = threading.Event()  # the first token's device work is queued (or it stopped)
        # the index of the event whose text the observer sent as the first partial (None: it sent none)
        self.shown_index: int | None = None

    def cancel(self) -> None:
        """Ask the engine to stop at the next check (between layers, decode steps or prefill chunks)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done

    def wait_launched(self, timeout: float | None = None) -> bool:
        """Wait, the GIL released, until the producer has queued the device work of this request's first
        token (or stopped); False on timeout.

        A submitter on an event loop calls it before going on with its own work: the producer's thread,
        just woken, needs the GIL to start the request, and the submitter would hold it for everything it
        does after the submit (a few hundred microseconds of building the consumer's side) while the
        device sits idle. Waiting here lets the producer launch first; the submitter's work then overlaps
        the device's."""
        return self._launched.wait(timeout)

    # -- engine side ---------------------------------------------------------------------------------
    def _mark_launched(self) -> None:
        """The producer has queued the first token's device work, or stopped before it."""
        self._launched.set()

    def _publish(
        self,
        event: TokenEvent | None = None,
        result: Completion | None = None,
        error: EngineError | None = None,
    ) -> None:
        delivered = event is not None and self._observe(event)
        taken = None
        with self._cond:
            if event is not None:
                self._events.append(event)
                if event.text and self._handover is None and (self._wakers or delivered):
                    self._handover = threading.Event()
                    if delivered:  # the observer sent its text: nothing to hand over
                        self._handover.set()
                    else:
                        taken = self._handover
            if result is not None or error is not None:
                self._result, self._error, self._done = result, error, True
            self._cond.notify_all()
            wakers = list(self._wakers)
        for loop, flag in wakers:
            if on_loop(loop):  # published from the consumer's own loop: no round through its self-pipe
                flag.set()
                continue
            # RuntimeError: the consumer's loop has closed; nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(flag.set)
        # The first visible text is what the user waits for. The consumer's thread, just woken, needs the
        # GIL to send it on, and this thread would hold it for the next step's launch: wait (once per
        # request, briefly) until the consumer has taken the text. Never on the consumer's own thread.
        if taken is not None and self._consumer_thread != threading.get_ident():
            taken.wait(self.HANDOVER_S)

    def _observe(self, event: TokenEvent) -> bool:
        """The request's observer, told of `event` before a consumer can see it."""
        observer = self.request.observer
        delivered = observer is not None and observer(event)
        if delivered and self.shown_index is None:
            self.shown_index = event.index
        return delivered

    # -- consumer side -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TokenEvent]:
        i = 0
        while True:
            with self._cond:
                self._cond.wait_for(partial(self._has_news, i))
                new, done = self._events[i:], self._done
            yield from new
            i += len(new)
            if done and not new:
                self._raise()
                return

    def _has_news(self, seen: int) -> bool:
        return len(self._events) > seen or self._done

    def result(self, timeout: float | None = None) -> Completion:
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError("completion did not finish in time")
        self._raise()
        assert self._result is not None
        return self._result

    async def stream(self) -> AsyncGenerator[TokenEvent, None]:
        flag = asyncio.Event()
        entry = (asyncio.get_running_loop(), flag)
        with self._cond:
            self._wakers.append(entry)
            self._consumer_thread = threading.get_ident()
        try:
            i = 0
            while True:
                flag.clear()
                with self._cond:
                    new, done = self._events[i:], self._done
                    taken = self._handover
                if taken is not None:
                    taken.set()
                for event in new:
                    yield event
                i += len(new)
                if done and not new:
                    self._raise()
                    return
                if not new:
                    await flag.wait()
        finally:
            with self._cond:
                self._wakers.remove(entry)

    async def wait(self) -> Completion:
        async for _ in self.stream():
            pass
        assert self._result is not None
        return self._result

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
