"""From a document snapshot to a suggestion: typing through, latest-wins, prompt, engine, stop rules.

The LSP handlers give it snapshots and a way to send partial notifications; it knows nothing of JSON-RPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lsp_dscoder.documents import Splice
from lsp_dscoder.engine_host import EngineHost
from lsp_dscoder.first_text import FirstText
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.prompt import Budgets, ContextFile, Prompt, PromptBuilder
from lsp_dscoder.session import DocumentSession, Generation, Subscriber
from lsp_dscoder.settings import Settings
from lsp_dscoder.stats import Outcome, RequestRecord, Source, Stats

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import CompletionRequest

log = logging.getLogger(__name__)

ASKING_S = 2.0  # a client that asked for a document's suggestion this recently asks as the user types
CLAIM_S = 0.5  # a suggestion started from an edit that no request took this long after is stopped

# (text, done) -> None: sends one `dscoder/partialCompletion` for the request
SendPartial = Callable[[str, bool], None]


@dataclass(frozen=True)
class Snapshot:
    """A completion request's view of its document, taken when the request arrived."""

    uri: str
    version: int | None
    text: str  # sanitised (no lone surrogates)
    cursor: int  # offset into `text`
    language_id: str | None
    context: Callable[[], Sequence[ContextFile]]  # other open documents, read only if needed


class Started:
    """A completion request once it has been started: await `result()` for the suggestion ('' or None for
    none); `abandon()` when the client cancelled it (the engine stops unless another request listens)."""

    def __init__(
        self,
        record: RequestRecord,
        sub: Subscriber | None = None,
        gen: Generation | None = None,
        debounce: Callable[[], Awaitable[Started]] | None = None,
    ) -> None:
        self.record = record
        self.sub = sub
        self.gen = gen
        self._debounce = debounce

    async def result(self) -> str | None:
        if self._debounce is not None:
            later = await self._debounce()
            self.sub, self.gen, self._debounce = later.sub, later.gen, None
        return None if self.sub is None else await self.sub.future

    def abandon(self) -> None:
        self.record.responded(Outcome.CANCELLED)
        if self.gen is not None and self.sub is not None:
            self.gen.detach(self.sub)


class Completer:
    def __init__(self, host: EngineHost, settings: Settings, stats: Stats) -> None:
        self.host = host
        self.settings = settings
        self.stats = stats
        self.sessions: dict[str, DocumentSession] = {}
        self._builder: PromptBuilder | None = None

    def configure(self, settings: Settings) -> None:
        """New settings (budgets, response mode, ...). Engine settings are the host's business."""
        self.settings = settings
        self._builder = None

    def _prompt_builder(self) -> PromptBuilder:
        if self._builder is None:
            s = self.settings
            engine = self.host.engine
            assert engine is not None, "prompts are built only once the engine is ready"
            budgets = Budgets.of(s).fit(engine.max_context, s.max_tokens)
            self._builder = PromptBuilder(engine.tokenizer, budgets)
            for session in self.sessions.values():
                session.forget()
        return self._builder

    def engine_changed(self) -> None:
        """A (re)loaded engine: nothing cached refers to it."""
        for session in self.sessions.values():
            session.close()
            session.forget()
            session.generation = None
        self._builder = None

    def changed(self, uri: str, text: str, version: int | None, splice: Splice | None = None) -> None:
        if (session := self.sessions.get(uri)) is not None:
            session.changed(text, version, splice)

    def closed(self, uri: str) -> None:
        if (session := self.sessions.pop(uri, None)) is not None:
            session.close()

    def close_all(self) -> None:
        for uri in list(self.sessions):
            self.closed(uri)

    def rehearse(self, snap: Snapshot) -> None:
        """What `begin` does for `snap` up to the engine, and what a suggestion's first text goes through,
        done and thrown away (keep_warm.py); only while the document's prompt head holds, so nothing is
        tokenised anew. Changes nothing but caches (tokenised context, checked prompt ids)."""
        session = self.sessions.get(snap.uri)
        if session is None or session.head is None or not self.host.ready:
            return
        gen = session.generation
        if gen is not None:
            gen.typed_through(snap.text, snap.cursor)
        prompt = self._prompt_builder().extend(snap.text, snap.cursor, session.head, session.cached_pieces())
        if prompt is None:
            return
        ctx = CursorContext.at(snap.text, snap.cursor)
        self.host.validate(self._request(snap, prompt, ctx, None))
        shaper = Shaper(ctx)
        shaper.feed(gen.shaper.text[:8] if gen is not None and gen.shaper.text else "x")
        shaper.first_line_ready(0)

    def _request(
        self,
        snap: Snapshot,
        prompt: Prompt,
        ctx: CursorContext,
        deadline: float | None,
        observer: FirstText | None = None,
    ) -> CompletionRequest:
        """The engine request for `prompt`: a cursor inside a line's text completes that line only."""
        stop = ("\n",) if ctx.single_line else ()
        return self.host.request(
            prompt.ids,
            max_tokens=self.settings.max_tokens,
            stop=stop,
            slot_key=snap.uri,
            deadline=deadline,
            heal_text=prompt.heal_text,
            observer=observer,
        )

    def anticipate(self, uri: str, snapshot: Callable[[], Snapshot]) -> None:
        """A keystroke's edit, before the completion request that follows it (`startOnEdit`): unless the
        request came with it (in the same read), start the suggestion for the cursor the edit leaves, so
        that the engine works while the client waits to ask (VS Code asks 50 ms after the last keystroke);
        the request takes it over in `begin`, or one for another place cancels it. Only while the client
        asks for this document's suggestions, and never with a debounce of our own. `snapshot` is the
        document at the edit's end, taken only then."""
        session = self.sessions.get(uri)
        if session is None or session.asked is None or not self._starts_early():
            return
        if self.stats.clock() - session.asked <= ASKING_S:
            # Two turns of the loop later: after the messages read with the edit, and after those the
            # next poll finds (a client that writes the request right behind the edit). A request among
            # them starts as before (an early start would only compete with its reading for the
            # interpreter), and this then does nothing.
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._anticipated, session, snapshot(), session.asked)

    def _starts_early(self) -> bool:
        s = self.settings
        return s.start_on_edit and not s.debounce_ms and self.host.ready

    def _anticipated(self, session: DocumentSession, snap: Snapshot, asked: float | None) -> None:
        if session.asked != asked or session.version != snap.version:
            return  # a request came meanwhile, or another edit
        if self.sessions.get(snap.uri) is not session or not self._starts_early():
            return  # closed, or the settings or the engine changed meanwhile
        gen = session.generation
        if gen is not None:
            if gen.typed_through(snap.text, snap.cursor) is not None:
                return  # typed through the suggestion: the request is answered from memory
            gen.cancel()
        gen = self._start(session, snap, None)
        if gen is None:  # an error the request will meet and report
            return
        self.stats.counts["edit_starts"] += 1
        gen.started_at = self.stats.clock()
        log.debug(
            "%s v%s: suggestion started from the edit, cursor at offset %d",
            snap.uri,
            snap.version,
            snap.cursor,
        )
        asyncio.get_running_loop().call_later(CLAIM_S, self._expire, gen)

    def _expire(self, gen: Generation) -> None:
        """No request took an anticipated suggestion in time: the client asks for another place, or not
        at all; the engine stops."""
        if gen.record is None and not gen.finished and not gen.cancelled:
            self.stats.counts["edit_starts_unclaimed"] += 1
            gen.cancel()

    def begin(
        self, snap: Snapshot, request_id: Any, send_partial: SendPartial, any_thread: bool = False
    ) -> Started:
        """Start answering `snap` now (typing through, latest wins, the prompt and the engine's submit run
        before this returns); the returned `Started` is awaited for the suggestion. `any_thread`:
        `send_partial` may be called from the engine's thread (first_text.py)."""
        record = self.stats.begin(request_id, snap.uri, snap.version)
        session = self.sessions.get(snap.uri)
        if session is None:  # not setdefault: it would build a session on every keystroke
            session = self.sessions[snap.uri] = DocumentSession(snap.uri)
        session.latest, session.asked = request_id, record.started
        sub = Subscriber(request_id, snap.version, 0, send_partial, record, any_thread)
        gen = session.generation
        if gen is not None and gen.record is None and gen.answers(snap.text, snap.version, snap.cursor):
            self.stats.counts["edit_starts_taken"] += 1
            gen.claim(record)  # started from this request's didChange
            gen.subscribe(sub)
            return Started(record, sub, gen)
        if gen is not None and (typed := gen.typed_through(snap.text, snap.cursor)) is not None:
            record.source, sub.skip = Source.MEMORY, typed
            gen.subscribe(sub)
            return Started(record, sub, gen)
        if gen is not None:
            gen.cancel()  # latest wins
        if not self.host.ready:
            record.responded(Outcome.NOT_READY)
            return Started(record)
        if self.settings.debounce_ms:
            return Started(record, sub, debounce=lambda: self._debounced(session, snap, record, sub))
        return self._started(session, snap, record, sub)

    def _started(
        self, session: DocumentSession, snap: Snapshot, record: RequestRecord, sub: Subscriber
    ) -> Started:
        gen = self._start(session, snap, record, sub)
        if gen is None:
            return Started(record)
        gen.subscribe(sub)
        return Started(record, sub, gen)

    async def _debounced(
        self, session: DocumentSession, snap: Snapshot, record: RequestRecord, sub: Subscriber
    ) -> Started:
        await asyncio.sleep(self.settings.debounce_ms / 1000.0)
        if session.latest != sub.request_id or session.version not in (None, snap.version):
            record.responded(Outcome.SUPERSEDED)
            return Started(record)
        return self._started(session, snap, record, sub)

    def _start(
        self,
        session: DocumentSession,
        snap: Snapshot,
        record: RequestRecord | None,
        sub: Subscriber | None = None,
    ) -> Generation | None:
        """Build the prompt and submit it: the generation for `record`'s request, or for an edit when
        `record` is None (then an error is only logged at debug level: the request will meet it). `sub`,
        the request's subscriber, may get the first text from the engine's thread (first_text.py)."""
        started = time.monotonic()
        name = "edit" if record is None else f"request {record.request_id}"
        try:
            builder = self._prompt_builder()
        except ValueError as exc:  # budgets that cannot fit the engine's context
            return self._failed(record, f"{name}: {exc}")
        prompt = builder.build(
            snap.text, snap.cursor, snap.context, snap.language_id, session.head, session.cached_pieces()
        )
        prompt_s = time.monotonic() - started
        if log.isEnabledFor(logging.DEBUG):
            text = builder.tokenizer.decode(prompt.ids)
            log.debug("%s prompt (%d tokens): %r", name, len(prompt.ids), text)
        session.started(prompt.head, prompt.middle_pieces)
        ctx = CursorContext.at(snap.text, snap.cursor)
        s = self.settings
        deadline = None if s.deadline_ms is None else time.monotonic() + s.deadline_ms / 1000.0
        try:
            handle = self.host.submit(self._request(snap, prompt, ctx, deadline, FirstText.of(ctx, sub)))
        except self.host.engine_errors as exc:
            return self._failed(record, f"{name} not submitted: {exc}", quiet=getattr(exc, "reported", False))
        gen = Generation(
            handle,
            Shaper(ctx),
            text=snap.text,
            cursor=snap.cursor,
            mode=s.response_mode,
            on_done=_finished,
            errors=self.host.engine_errors,
            version=snap.version,
            prompt_s=prompt_s,
        )
        if record is not None:
            gen.claim(record)
        session.generation = gen
        gen.start()
        return gen

    @staticmethod
    def _failed(record: RequestRecord | None, message: str, quiet: bool = False) -> None:
        """`quiet`: the cause was reported already (an outage of the remote endpoint): debug level."""
        if record is None or quiet:
            log.debug("%s", message)
        else:
            log.warning("%s", message)
        if record is not None:
            record.responded(Outcome.ERROR)


def _finished(gen: Generation, completion: Any) -> None:
    """A generation's engine request ended: its stats go to the request it answers (now, or when a request
    takes over a generation started from an edit)."""
    gen.outcome = (None if completion is None else completion.stats, gen.shaper.rule.value)
    if gen.record is not None:
        gen.record.completed(*gen.outcome)
