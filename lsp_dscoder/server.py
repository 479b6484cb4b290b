"""LSP handlers: thin translations between protocol messages and the completer.

Each completion handler snapshots (uri, version, text, position), awaits the completer, and drops the
answer if the document moved on meanwhile. Cancellation by the client arrives as CancelledError from
pygls; the completer sets the engine's cancel flag and the error propagates, so the client gets -32800.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from lsp_dscoder import settings as settings_mod
from lsp_dscoder.completer import Snapshot, Started
from lsp_dscoder.dispatch import Answer
from lsp_dscoder.documents import Document
from lsp_dscoder.errors import DocumentOutOfSyncError, ProtocolMisuse
from lsp_dscoder.positions import units
from lsp_dscoder.protocol import PARTIAL_COMPLETION, STATS, DscoderServer
from lsp_dscoder.settings import Settings

log = logging.getLogger(__name__)


def _word_start(text: str, cursor: int) -> int:
    start = cursor
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return start


# a suggestion, the snapshot it answers and the cursor's position
Found = tuple[Snapshot, types.Position, str]
T = TypeVar("T")


@dataclass
class _Begun:
    """A completion request started on arrival; its suggestion is still to come."""

    doc: Document
    snap: Snapshot
    at: types.Position  # the cursor, as the answer's range reports it
    started: Started


def _begin(ls: DscoderServer, uri: str, position: types.Position) -> _Begun | None:
    """Start the suggestion for a position (None when there is none to give). Runs when the request is
    read, before the messages after it: the document is the version the request was made for."""
    request_id = ls.protocol.msg_id
    try:
        doc = ls.document(uri)
        snap, at = ls.snapshot(doc, position)
    except DocumentOutOfSyncError as exc:
        log.info("request %s: %s", request_id, exc)
        return None
    except ProtocolMisuse as exc:
        log.warning("request %s refused: %s", request_id, exc)
        raise JsonRpcInvalidParams(str(exc)) from exc
    where = {"line": at.line, "character": at.character}

    def send_partial(text: str, done: bool) -> None:
        params = {"requestId": request_id, "uri": uri, "version": snap.version, "position": where}
        ls.protocol.notify_json(PARTIAL_COMPLETION, {**params, "text": text, "done": done})

    any_thread = ls.protocol.writes_from_any_thread
    return _Begun(doc, snap, at, ls.completer.begin(snap, request_id, send_partial, any_thread))


async def _suggestion(ls: DscoderServer, begun: _Begun | None) -> Found | None:
    """The started request's suggestion and the cursor's position, or None when there is none or the
    document changed meanwhile."""
    if begun is None:
        return None
    text = await begun.started.result()
    if not text or not ls.is_current(begun.doc, begun.snap):
        return None
    return begun.snap, begun.at, text


def _inline_answer(found: Found | None) -> types.InlineCompletionList | None:
    if found is None:
        return None
    _, at, text = found
    item = types.InlineCompletionItem(insert_text=text, range=types.Range(start=at, end=at))
    return types.InlineCompletionList(items=[item])


def _completion_answer(ls: DscoderServer, found: Found | None) -> types.CompletionList | None:
    if found is None:
        return None
    snap, at, text = found
    start = _word_start(snap.text, snap.cursor)
    word = snap.text[start : snap.cursor]  # on the cursor's line: no line breaks
    start_at = types.Position(line=at.line, character=at.character - units(word, ls.encoding))
    label = (word + text).strip().split("\n", 1)[0]
    item = types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Text,
        detail="dscoder",
        filter_text=word + text,
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=types.Range(start=start_at, end=at), new_text=word + text),
    )
    return types.CompletionList(is_incomplete=True, items=[item])


def _answer(ls: DscoderServer, begun: _Begun | None, shape: Callable[[Found | None], T]) -> Answer[T]:
    """The rest of a started request: its suggestion shaped into the method's result."""

    async def answer() -> T:
        return shape(await _suggestion(ls, begun))

    return Answer(answer(), begun.started.abandon if begun is not None else None)


def start_inline(
    ls: DscoderServer, params: types.InlineCompletionParams
) -> Answer[types.InlineCompletionList | None]:
    return _answer(ls, _begin(ls, params.text_document.uri, params.position), _inline_answer)


def start_completion(
    ls: DscoderServer, params: types.CompletionParams
) -> Answer[types.CompletionList | None]:
    # A client that shows inline completions gets no items: they would fill its suggest widget.
    wanted = ls.completion_items_wanted()
    begun = _begin(ls, params.text_document.uri, params.position) if wanted else None
    return _answer(ls, begun, functools.partial(_completion_answer, ls))


def _apply_settings(ls: DscoderServer, raw: Any, *, reload: bool) -> None:
    new, problems = settings_mod.parse(raw, ls.base)
    for problem in problems:
        log.warning("%s", problem)
        ls.show(problem)
    engine_changed = new.engine_key() != ls.settings.engine_key()
    before, after = settings_mod.to_json(ls.settings), settings_mod.to_json(new)
    changed = [f"{key}={value!r}" for key, value in after.items() if value != before[key]]
    if changed:  # what the client changed, once per change (editors and their tests wait for it)
        log.info("settings changed: %s", ", ".join(changed))
    ls.settings = new
    ls.completer.configure(new)
    ls.host.keep_warm(new.keep_warm_ms)
    if reload and engine_changed:
        log.info("engine settings changed: reloading")
        ls.loading = asyncio.ensure_future(ls.load_engine())


def create_server(base: Settings) -> DscoderServer:
    ls = DscoderServer(base)

    @ls.feature(types.INITIALIZE)
    def initialize(ls: DscoderServer, params: types.InitializeParams) -> None:
        _apply_settings(ls, params.initialization_options, reload=False)

    @ls.feature(types.INITIALIZED)
    async def initialized(ls: DscoderServer, params: types.InitializedParams) -> None:
        ls.loading = asyncio.ensure_future(ls.load_engine())
        await ls.loading

    @ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: DscoderServer, params: types.DidChangeConfigurationParams) -> None:
        # Applied before the next message is read (completion requests start as they are read), unless
        # the settings must first be asked of the client.
        raw = params.settings
        caps = ls.client_capabilities.workspace
        if settings_mod.section(raw) or caps is None or not caps.configuration:
            _apply_settings(ls, raw, reload=True)
            return

        async def ask() -> None:
            item = types.ConfigurationItem(section=settings_mod.SECTION)
            asked = await ls.workspace_configuration_async(types.ConfigurationParams(items=[item]))
            _apply_settings(ls, asked[0], reload=True)

        ls.configuring = asyncio.ensure_future(ask())

    @ls.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DscoderServer, params: types.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        if ls.documents.open(item.uri, item.language_id, item.version, item.text) is not None:
            log.info("%s reopened: its pending requests get empty results", item.uri)
            ls.completer.closed(item.uri)  # the old text's requests and generation end here

    @ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DscoderServer, params: types.DidChangeTextDocumentParams) -> None:
        # The usual keystroke skips this handler: protocol.py reads its edits from the JSON.
        ls.apply_change(params.text_document.uri, params.text_document.version, params.content_changes)

    @ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DscoderServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.documents.close(params.text_document.uri)
        ls.completer.closed(params.text_document.uri)

    # Both run through `start_*` when the request is read (dispatch.py); these are pygls' registrations
    # (they advertise the capabilities) and its path for any request that does not start on arrival.
    @ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: DscoderServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        return await start_inline(ls, params).run()

    @ls.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: DscoderServer, params: types.CompletionParams) -> types.CompletionList | None:
        return await start_completion(ls, params).run()

    ls.starters[types.TEXT_DOCUMENT_INLINE_COMPLETION] = start_inline
    ls.starters[types.TEXT_DOCUMENT_COMPLETION] = start_completion

    @ls.feature(STATS)
    def stats(ls: DscoderServer, params: Any) -> dict[str, Any]:
        # {"recent": N}: at most N request records (0 makes the reply small enough to time a bare round trip)
        recent = getattr(params, "recent", None)
        if isinstance(recent, bool) or not isinstance(recent, int) or recent < 0:
            recent = None
        return {
            "engineState": ls.host.state.value,
            "engineError": ls.host.error,
            "engine": ls.host.stats(),
            "requests": ls.stats.as_dict() if recent is None else ls.stats.as_dict(recent),
            "settings": settings_mod.to_json(ls.settings),
            "keepWarm": ls.keep_warm.stats(),
        }

    @ls.feature(types.SHUTDOWN)
    def shutdown(ls: DscoderServer, params: None) -> None:
        ls.shutdown_requested = True
        ls.keep_warm.close()
        ls.completer.close_all()

    @ls.feature(types.EXIT)
    def exit_(ls: DscoderServer, params: None) -> None:
        ls.exit_code = 0 if ls.shutdown_requested else 1  # LSP: exit without shutdown is an error

    return ls
