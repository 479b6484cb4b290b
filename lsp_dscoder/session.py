"""Per-document request lifecycle: one running generation per document, the requests subscribed to it,
latest-wins, cancellation, and typing through a suggestion.

A `Generation` consumes one engine stream and shapes it into a suggestion. Requests subscribe to it: the
one that started it, and later ones whose document is the generation's document with a prefix of the
suggestion typed at the cursor (served from memory, no prefill). Subscribers get a partial for every
change of their remainder and one response: at the first complete line or at the end (response mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lsp_dscoder.backend import Handle
from lsp_dscoder.documents import Splice
from lsp_dscoder.postprocess import Shaper
from lsp_dscoder.prompt import Head
from lsp_dscoder.settings import ResponseMode
from lsp_dscoder.stats import Outcome, RequestRecord, Source
from lsp_dscoder.tokens import Piece

log = logging.getLogger(__name__)


def _future() -> asyncio.Future[str | None]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False)
class Subscriber:
    """A request listening to a generation. Its partials go out on the event loop, except the first one
    when `FirstText` sends it from the engine's thread: the lock orders the two."""

    request_id: Any
    version: int | None
    skip: int  # characters of the suggestion already in the document when this request came
    send_partial: Callable[[str, bool], None]
    record: RequestRecord
    any_thread: bool = False  # send_partial may be called from any thread
    future: asyncio.Future[str | None] = field(default_factory=_future)
    sent: str | None = None
    open: bool = True  # not answered yet: partials may still go out
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, text: str | None, outcome: Outcome) -> None:
        with self.lock:  # no partial from another thread after this
            self.open = False
        if not self.future.done():
            self.future.set_result(text)
            self.record.responded(outcome)

    def show(self, text: str, done: bool) -> None:
        with self.lock:
            self._send(text, done, early=False)

    def show_first(self, text: str) -> bool:
        """The suggestion's first visible text, from the thread that produced it: sent unless the request
        was answered or something was sent already. Returns whether it was sent."""
        with self.lock:
            if not self.open or self.sent is not None:
                return False
            self._send(text, False, early=True)
        return True

    def _send(self, text: str, done: bool, early: bool) -> None:
        """Under `lock`: the partial, and its stamp before an answer can log the record."""
        self.sent = text
        self.send_partial(text, done)
        self.record.partial_sent(early)


class Generation:
    """One engine request for one document, and the suggestion shaped from its tokens so far."""

    def __init__(
        self,
        handle: Handle,
        shaper: Shaper,
        *,
        text: str,
        cursor: int,
        mode: ResponseMode,
        on_done: Callable[[Generation, Any], None],
        errors: tuple[type[Exception], ...] = (),
        version: int | None = None,
        prompt_s: float | None = None,
    ) -> None:
        self.handle = handle
        self.shaper = shaper
        self.mode = mode
        # The text it was asked for and its cursor: the parts around the cursor are cut only to compare.
        self._text, self._cursor, self.version = text, cursor, version
        # The request it answers (its stats); None while started from an edit and no request took it.
        self.record: RequestRecord | None = None
        self.prompt_s = prompt_s  # building its prompt took this long
        self.started_at: float | None = None  # when an edit started it (the stats' clock)
        self.outcome: tuple[Any, str] | None = None  # (engine stats or None, stop rule) once it ended
        self._framed = text  # the last document text that `_frames` accepted
        self.pieces: list[Piece] = []  # the generated tokens, as the engine's slot will hold them
        self.rewound = 0  # prompt tokens at its end that the engine healed (spelled again) instead
        self._on_done = on_done
        self._errors = errors  # the engine's error classes: logged, the suggestion ends where it is
        self.subscribers: list[Subscriber] = []
        self.cancelled = False
        self.finished = False
        self.task: asyncio.Task[None] | None = None  # held: the event loop keeps only a weak reference

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        completion = None
        try:
            # closed here, not when the loop collects it: a stream stops waking this loop once it is left
            async with contextlib.aclosing(self.handle.stream()) as events:
                async for event in events:
                    if event.token_id is not None:  # None: the decoder's flush at the end, no token
                        self.rewound = max(self.rewound, event.rewound)
                        self.pieces.append(Piece(event.token_id, event.piece or ""))
                    self.shaper.feed(event.text)
                    self._publish()
                    if self.shaper.stopped:
                        self.handle.cancel()  # the suggestion is complete: free the engine
                        break
            completion = await self.handle.wait()
        except self._errors as exc:
            log.error("generation failed: %s", exc)
        finally:
            self.shaper.finish()
            self.finished = True
            self._publish()
            self._on_done(self, completion)

    def claim(self, record: RequestRecord) -> None:
        """`record`'s request is the one this generation answers (at its start, or taking over one
        started from an edit: then how long before the request it started goes in the record)."""
        self.record = record
        record.source, record.prompt_s = Source.ENGINE, self.prompt_s
        if self.started_at is not None:
            record.early_s = record.started - self.started_at
        if self.outcome is not None:
            record.completed(*self.outcome)

    def answers(self, text: str, version: int | None, cursor: int) -> bool:
        """Whether it was started for exactly this text, version and cursor, and still runs or has run to
        its end (a cancelled one stopped short)."""
        same = text is self._text and version == self.version and cursor == self._cursor
        return same and not self.cancelled

    def typed_through(self, text: str, cursor: int | None = None, splice: Splice | None = None) -> int | None:
        """How many characters of the suggestion `text` holds at the generation's cursor (with the
        cursor right after them, if given); None if `text` does not continue the suggestion. `splice`:
        the edit that made `text`, if known."""
        if self.cancelled:
            return None
        typed = len(text) - len(self._text)
        at = self._cursor
        if not 0 <= typed <= len(self.shaper.text):
            return None
        if cursor is not None and cursor != at + typed:
            return None
        if typed == len(self.shaper.text) and self.finished and cursor is not None:
            return None  # all of it accepted: a new request continues from the cache instead
        if not self._frames(text, splice):
            return None
        return typed if text.startswith(self.shaper.text[:typed], at) else None

    def _frames(self, text: str, splice: Splice | None = None) -> bool:
        """Whether `text` is the generation's text before the cursor, then anything, then its text after.
        The last text that passed is remembered: a request asks about the very text its didChange was
        checked against, and a keystroke's edit of that text between the two parts keeps them without
        reading the document (a comparison reads all of it)."""
        if text is self._framed:
            return True
        if splice is not None and splice.before is self._framed and self._between(splice):
            self._framed = text
            return True
        base, cut = self._text, self._cursor
        if not (text.startswith(base[:cut]) and text.endswith(base[cut:])):
            return False
        self._framed = text
        return True

    def _between(self, splice: Splice) -> bool:
        """Whether the edit lies between the text before the cursor and the text after it."""
        after = len(self._text) - self._cursor  # characters after the cursor, the same in every framed text
        return self._cursor <= splice.start and splice.end <= len(splice.before) - after

    def subscribe(self, sub: Subscriber) -> None:
        for old in self.subscribers:
            old.answer(None, Outcome.SUPERSEDED)  # latest wins: no more partials for older requests
        self.subscribers = [sub]
        self._update(sub)

    def detach(self, sub: Subscriber) -> None:
        """The request was cancelled by the client: stop the engine unless someone else listens.

        A request already answered and unsubscribed (e.g. superseded by a didChange that continues the
        suggestion) cancels nothing: the generation may be serving the text the user is typing through."""
        if sub not in self.subscribers:
            return
        self.subscribers.remove(sub)
        if not self.subscribers:
            self.cancel()

    def drop_stale(self, version: int | None) -> None:
        """The document changed: requests for older versions get an empty result and no more partials."""
        for sub in [s for s in self.subscribers if s.version != version]:
            sub.answer(None, Outcome.SUPERSEDED)
            self.subscribers.remove(sub)

    def cancel(self) -> None:
        if not self.finished and not self.cancelled:
            self.cancelled = True
            self.handle.cancel()
        for sub in self.subscribers:
            sub.answer(None, Outcome.SUPERSEDED)
        self.subscribers.clear()

    def _publish(self) -> None:
        for sub in list(self.subscribers):
            self._update(sub)

    def _update(self, sub: Subscriber) -> None:
        text = self.shaper.text[sub.skip :]
        done = self.shaper.done
        # The suggestion only grows, and the first text may have gone out from the engine's thread before
        # this shaper reached it (first_text.py): only more text, or the end, is news.
        if len(text) > len(sub.sent or "") or done:
            sub.show(text, done)
        if not sub.future.done():
            if self.mode is ResponseMode.FIRST_LINE:
                ready = self.shaper.first_line_ready(sub.skip)
            else:
                ready = text if done else None
            if ready is not None:
                sub.answer(ready, Outcome.OK if ready else Outcome.EMPTY)
        if done and sub in self.subscribers:
            self.subscribers.remove(sub)


@dataclass
class DocumentSession:
    """What the server remembers about one open document between requests."""

    uri: str
    head: Head | None = None
    known: list[Piece] = field(default_factory=list)  # the middle's pieces in the last prompt
    generation: Generation | None = None
    latest: Any = None  # id of the newest completion request
    asked: float | None = None  # when it came (time.monotonic)
    version: int | None = None  # of the last change seen

    def cached_pieces(self) -> list[Piece]:
        """The pieces the engine's slot holds after `head`: the last prompt's middle, then what its
        generation produced (which re-spells the prompt tokens the engine healed)."""
        gen = self.generation
        if gen is None:
            return list(self.known)
        return self.known[: len(self.known) - gen.rewound] + gen.pieces

    def started(self, head: Head, middle: Sequence[Piece]) -> None:
        """A prompt was built: what the slot will hold from now on (its generation, once submitted, adds
        to it)."""
        self.head, self.known, self.generation = head, list(middle), None

    def forget(self) -> None:
        """Nothing cached refers to the engine any more (new engine or new budgets)."""
        self.head, self.known = None, []

    def changed(self, text: str, version: int | None, splice: Splice | None = None) -> None:
        self.version = version
        gen = self.generation
        if gen is None:
            return
        gen.drop_stale(version)
        # Asked of a finished suggestion too: the edit frames the text for the request that follows.
        if gen.typed_through(text, splice=splice) is None and not gen.finished:
            gen.cancel()

    def close(self) -> None:
        if self.generation is not None:
            self.generation.cancel()
