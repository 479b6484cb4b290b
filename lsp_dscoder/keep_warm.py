"""Keeping the keystroke path warm while the user types (setting `keepWarmMs`).

A keystroke's way through the server is a few hundred microseconds of Python when it runs back to back,
and three to twelve times that when it runs after the 100-200 ms pause between two keystrokes: in that
pause other work on the machine evicts the code and data from the CPU caches (docs/benchmarks.md, "Cold
code"), whether the server's thread sleeps or spins. So while a typing burst lasts, the server replays
the side-effect-free part of the last keystroke every `keepWarmMs` on the event loop: it frames and parses
the keystroke's own messages again, types a character into a shadow copy of the document (deleted by the
next replay), structures the completion request, locates its position, asks the running suggestion
whether the text types through it, extends the prompt from the session's cached head (never a new head:
nothing is tokenised), has the backend check the request (`Backend.validate`), runs the stop rules on the
suggestion's first characters and encodes a partial; and throws all of it away. The next keystroke finds
that code and data in the caches. Nothing a replay does reaches the client, the documents, the sessions
or the engine; only caches (tokenised context, checked prompt ids) see it.

A burst ends `WINDOW_S` after the last keystroke; outside a burst nothing runs, so an idle server costs
nothing. `dscoder/stats` reports the replays and their CPU time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from lsp_dscoder.dispatch import PARTIAL_COMPLETION, json_message
from lsp_dscoder.documents import Documents, Edit, keystroke_change
from lsp_dscoder.engine.api import KEEP_WARM_WINDOW_S
from lsp_dscoder.errors import DocumentSyncError
from lsp_dscoder.framing import Framer

if TYPE_CHECKING:
    from lsp_dscoder.protocol import DscoderServer

log = logging.getLogger(__name__)
_KEYSTROKE = (types.TEXT_DOCUMENT_DID_CHANGE, types.TEXT_DOCUMENT_INLINE_COMPLETION, types.CANCEL_REQUEST)
WINDOW_S = KEEP_WARM_WINDOW_S  # a pause longer than this ends the burst (the engine thread's too)
MAX_BODY = 4096  # bytes of a message that is replayed (a keystroke's messages take a few hundred)


class KeepWarm:
    def __init__(self, server: DscoderServer) -> None:
        self._server = server
        self._bodies: dict[str, bytes] = {}  # the last message of each keystroke method
        self._last = 0.0  # when the last keystroke message was read (time.monotonic)
        self._timer: asyncio.TimerHandle | None = None
        self._framer = Framer(lambda reason: None)
        self._shadow = Documents()
        self._shadow_of: str | None = None  # the document the shadow copy was taken of
        self._typed: tuple[int, int] | None = None  # where the copy holds a typed character to delete
        self.replays = 0
        self.busy_s = 0.0

    def saw(self, method: Any, body: bytes) -> None:
        """A message was read; a keystroke's message starts or extends the burst."""
        if method not in _KEYSTROKE or self._interval() is None:
            return
        if len(body) <= MAX_BODY:
            self._bodies[method] = body
        else:  # a paste, not a keystroke: replaying it every few milliseconds would cost more than it saves
            self._bodies.pop(method, None)
        self._last = time.monotonic()
        if self._timer is None:
            self._schedule()

    def stats(self) -> dict[str, Any]:
        return {"intervalMs": self._server.settings.keep_warm_ms, "replays": self.replays,
                "busyMs": round(self.busy_s * 1e3, 3)}  # fmt: skip

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _interval(self) -> float | None:
        ms = self._server.settings.keep_warm_ms
        return ms / 1000.0 if ms else None

    def _schedule(self) -> None:
        interval = self._interval()
        if interval is None or time.monotonic() - self._last > WINDOW_S:
            self._timer = None
            self._bodies.clear()
            self._shadow, self._shadow_of = Documents(), None
            return
        self._timer = asyncio.get_running_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        started = time.thread_time()  # CPU time: the GIL may keep the replay waiting, at no cost
        try:
            self.replay()
        except Exception as exc:  # stale or bad input (a closed document, a malformed request): its
            log.debug("keep-warm replay skipped: %s", exc)  # messages are dropped until the next keystroke
            self._bodies.clear()
        self.busy_s += time.thread_time() - started
        self._schedule()

    def replay(self) -> None:
        """The last keystroke's side-effect-free work, once."""
        self.replays += 1
        messages = {}
        for method, body in self._bodies.items():
            (framed,) = self._framer.feed(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            messages[method] = json.loads(framed)
        if (change := messages.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            self._edit(change["params"])
        if (request := messages.get(types.TEXT_DOCUMENT_INLINE_COMPLETION)) is not None:
            self._request(request)

    def _edit(self, params: Any) -> None:
        """A character typed at the edit's position, deleted again by the next replay, in a copy of the
        document taken at the burst's start (a keystroke's edit code; the copy keeps its first text)."""
        parsed = keystroke_change(params)
        if parsed is None or not parsed[2]:
            return
        uri, _, edits = parsed
        span = edits[0].span
        if span is None:
            return
        if self._shadow_of != uri:  # once a burst: the copy shares the text and indexes its lines
            doc = self._server.documents.get(uri)
            self._shadow = Documents()
            self._shadow.open(uri, doc.language_id, doc.version, doc.text)
            self._shadow_of, self._typed = uri, None
        shadow = self._shadow.get(uri)
        typed = self._typed
        if typed is None:
            line, char, _, _ = span
            edit, self._typed = Edit("x", (line, char, line, char)), (line, char)
        else:
            (line, char), self._typed = typed, None
            edit = Edit("", (line, char, line, char + 1))
        try:
            self._shadow.change(uri, shadow.version + 1, [edit], self._server.encoding)
        except DocumentSyncError:  # the position is not in the copy: take a new one next time
            self._shadow_of = None

    def _request(self, data: dict[str, Any]) -> None:
        server = self._server
        params = server.protocol.structure_quietly(data).params  # a bad request was answered once, when read
        doc = server.documents.get(params.text_document.uri)
        snap, at = server.snapshot(doc, params.position)
        server.completer.rehearse(snap)
        where = {"line": at.line, "character": at.character}
        partial = {"requestId": data.get("id"), "uri": snap.uri, "version": snap.version, "position": where}
        json_message(PARTIAL_COMPLETION, {**partial, "text": "", "done": False})
