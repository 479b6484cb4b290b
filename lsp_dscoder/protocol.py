"""The language server object and the JSON-RPC details around the handlers: our notification and request
names, malformed messages, load progress, and document snapshots in the client's position encoding."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import json
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar, cast

from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol.language_server import lsp_method
from pygls.uris import to_fs_path

from lsp_dscoder import __version__
from lsp_dscoder.completer import Completer, Snapshot
from lsp_dscoder.documents import Change, Document, Documents, Edit, check_version, keystroke_change
from lsp_dscoder.engine_host import EngineHost
from lsp_dscoder.errors import DocumentNotOpenError, DocumentSyncError
from lsp_dscoder.positions import Encoding
from lsp_dscoder.prompt import ContextFile
from lsp_dscoder.rpc import DscoderProtocol
from lsp_dscoder.settings import CompletionFallback, Settings
from lsp_dscoder.stats import Stats

PARTIAL_COMPLETION = "dscoder/partialCompletion"
T = TypeVar("T")
STATS = "dscoder/stats"

log = logging.getLogger(__name__)
_SYNC = (types.TEXT_DOCUMENT_DID_OPEN, types.TEXT_DOCUMENT_DID_CHANGE)


class _Refused:
    """Stands in for a sync notification refused before parsing (the server has said why)."""


class _Direct:
    """A keystroke's notification (`didChange`, `$/cancelRequest`), read from the JSON and run directly:
    pygls' dispatch would add protocol type checks, a uuid and a Future per message to every keystroke."""

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run


class Answer(Generic[T]):
    """The rest of a completion request that was started when it was read: `coro` gives the result;
    `abandon` (None: nothing to stop) is called if the client cancels the request."""

    def __init__(self, coro: Coroutine[Any, Any, T], abandon: Callable[[], None] | None) -> None:
        self.coro = coro
        self.abandon = abandon

    async def run(self) -> T:
        try:
            return await self.coro
        except asyncio.CancelledError:
            if self.abandon is not None:
                self.abandon()
            raise


# (server, params) -> Answer: a completion request's start, run as the request is read
Starter = Callable[["DscoderServer", Any], Answer[Any]]


class DocumentProtocol(DscoderProtocol):
    """Text sync goes to the server's own documents (`documents.py`), not to pygls' workspace, and a
    version that is not an integer is refused before cattrs would coerce it ("3", true, 1.5 -> 3, 1, 1)."""

    _server: DscoderServer

    def structure_message(self, data: dict[str, Any]) -> Any:
        if data.get("method") in _SYNC and "id" not in data:
            params = data.get("params")
            ident = params.get("textDocument") if isinstance(params, dict) else None
            if isinstance(ident, dict) and isinstance(ident.get("uri"), str):
                try:
                    check_version(ident.get("version"))
                except DocumentSyncError as exc:
                    self._server.sync_refused(ident["uri"], data["method"], str(exc))
                    return _Refused()
        if "id" not in data and not self._shutdown and data.get("jsonrpc") == "2.0":
            direct = self._direct(data.get("method"), data.get("params"))
            if direct is not None:
                return direct
        return super().structure_message(data)

    def _direct(self, method: Any, params: Any) -> _Direct | None:
        """The keystroke notifications in their usual shape; None for anything else (pygls' path)."""
        if method == types.TEXT_DOCUMENT_DID_CHANGE:
            change = keystroke_change(params)
            if change is not None:
                return _Direct(lambda: self._server.apply_change(*change))
        elif method == types.CANCEL_REQUEST and isinstance(params, dict):
            msg_id = params.get("id")
            if isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool)):
                return _Direct(lambda: self._handle_cancel_notification(msg_id))
        return None

    def handle_message(self, message: Any) -> None:
        if isinstance(message, _Direct):
            message.run()
            return
        if isinstance(message, _Refused):
            return
        method = getattr(message, "method", None)
        starter = self._server.starters.get(method) if method is not None else None
        if starter is not None and hasattr(message, "id") and not self._shutdown and message.jsonrpc == "2.0":
            contextvars.copy_context().run(self._start_on_arrival, message.id, starter, message.params)
            return
        super().handle_message(message)

    def _start_on_arrival(self, msg_id: Any, starter: Starter, params: Any) -> None:
        """Run a completion request's start now (prompt and engine submit included), before the messages
        read after it; its answer is awaited in a task. pygls would create the handler's task and start
        it on a later turn of the loop: one more stage on every keystroke's way to the engine."""
        self._ctx_msg_id.set(msg_id)  # the request id pygls' `msg_id` reports, in this context and its task
        try:
            answer = starter(self._server, params)
        except Exception as exc:  # answered as pygls answers a handler's exception
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            failed.add_done_callback(functools.partial(self._send_handler_result, msg_id=msg_id))
            return
        task = asyncio.ensure_future(answer.coro)
        self._request_futures[msg_id] = cast(Any, task)  # pygls keeps asyncio tasks here too
        task.add_done_callback(functools.partial(self._send_handler_result, msg_id=msg_id))
        if answer.abandon is not None:
            abandon = answer.abandon
            task.add_done_callback(lambda t: abandon() if t.cancelled() else None)

    def _execute_handler(
        self,
        msg_id: Any,
        handler: Any,
        callback: Any,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        # pygls files the future of every notification handler (and of each step of its generator
        # handlers) under a fresh uuid that nothing removes: a Future per keystroke, kept forever.
        # Requests remove theirs when answered, before this runs.
        future = self._request_futures.get(msg_id)
        if future is not None:

            def forget(done: Any) -> None:
                if self._request_futures.get(msg_id) is done:
                    del self._request_futures[msg_id]

            future.add_done_callback(forget)

    def notify_json(self, method: str, params: dict[str, Any]) -> None:
        """A notification whose params are plain JSON values, written as one message without pygls'
        structuring: `dscoder/partialCompletion` goes out for every change of the visible text."""
        if self.writer is None:
            return
        body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()
        self.writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        if msg_id not in self._request_futures:
            # Answered already (editors cancel as they type on): normal, not worth pygls' warning.
            log.debug("cancel for request %s, already answered", msg_id)
            return
        super()._handle_cancel_notification(msg_id)

    # pygls' own handlers would also keep a copy of each document; these only call the server's.
    def _user(self, method: str, params: Any) -> None:
        if (handler := self.fm.features.get(method)) is not None:
            handler(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> None:
        self._user(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        self._user(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> None:
        self._user(types.TEXT_DOCUMENT_DID_CLOSE, params)


class DscoderServer(LanguageServer):
    """Holds the server's state; the handlers in `server.py` are registered on it."""

    protocol: DocumentProtocol

    def __init__(self, base: Settings) -> None:
        super().__init__("lsp-dscoder", __version__, protocol_cls=DocumentProtocol, max_workers=4)
        self.base = base  # defaults with the command line applied
        self.settings = base
        self.stats = Stats()
        self.documents = Documents()
        self.starters: dict[str, Starter] = {}  # per request method: started as the request is read
        self.host = EngineHost()
        self.completer = Completer(self.host, base, self.stats)
        self.shutdown_requested = False
        self.exit_code = 0
        self.loading: asyncio.Future[None] | None = None
        self.configuring: asyncio.Future[None] | None = None  # settings being asked of the client
        self._progress_ids = itertools.count(1)
        self._encoding: Encoding | None = None

    def report_server_error(self, error: Exception, source: Any) -> None:
        if source is FeatureRequestError:
            return  # the request was answered with this error, and its reason logged: no popup as well
        if isinstance(error, json.JSONDecodeError | UnicodeDecodeError | JsonRpcException):
            log.warning("ignored a malformed message: %s", error)
            self.show(f"dscoder: ignored a malformed message ({error})", types.MessageType.Warning)
            return
        super().report_server_error(error, source)

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    @property
    def encoding(self) -> Encoding:
        """The negotiated position encoding: fixed by `initialize` (which creates the workspace), so it is
        parsed once rather than on every keystroke."""
        if self._encoding is None:
            self._encoding = Encoding.parse(self.workspace.position_encoding)
        return self._encoding

    def document(self, uri: str) -> Document:
        """An open document in step with the editor (DocumentNotOpenError / DocumentOutOfSyncError)."""
        return self.documents.get(uri)

    def snapshot(self, doc: Document, position: types.Position) -> tuple[Snapshot, types.Position]:
        """The request's view of `doc`, and the cursor's position (the request's own unless it was past
        the line's end or inside a character). Raises PositionError (the client's mistake)."""
        cursor, character = doc.locate(position.line, position.character, self.encoding)
        at = types.Position(line=position.line, character=character)
        snap = Snapshot(doc.uri, doc.version, doc.text, cursor, doc.language_id, lambda: self._context(doc))
        return snap, at

    def is_current(self, doc: Document, snap: Snapshot) -> bool:
        return self.documents.is_current(doc, snap.version)

    def completion_items_wanted(self) -> bool:
        """Whether `textDocument/completion` answers: by default only for clients that cannot show inline
        completions (VS Code would otherwise show the suggestion twice, once in its suggest widget)."""
        mode = self.settings.completion_fallback
        if mode is CompletionFallback.AUTO:
            caps = self.client_capabilities.text_document
            return caps is None or caps.inline_completion is None
        return mode is CompletionFallback.ALWAYS

    def apply_change(self, uri: str, version: int, changes: Sequence[Edit | Change]) -> None:
        """A didChange: the edits applied to the server's copy, and the document's requests and running
        suggestion told (a change that cannot be applied is refused whole: `sync_refused`)."""
        try:
            doc = self.documents.change(uri, version, changes, self.encoding)
        except DocumentNotOpenError as exc:
            log.warning("didChange ignored: %s", exc)
            return
        except DocumentSyncError as exc:
            self.sync_refused(uri, types.TEXT_DOCUMENT_DID_CHANGE, str(exc))
            return
        self.completer.changed(uri, doc.text, doc.version)

    def sync_refused(self, uri: str, method: str, reason: str) -> None:
        """A didOpen/didChange that could not be applied: say so, and answer nothing from the old text."""
        self.documents.refuse(uri, reason)
        self.completer.closed(uri)
        message = f"dscoder: {method} for {uri} refused: {reason}; no suggestions for it until it is reopened"
        log.warning("%s", message)
        self.show(message)

    def _context(self, current: Document) -> list[ContextFile]:
        """Other open documents of the same language (any, if unknown), in URI order."""
        files: list[ContextFile] = []
        root = self.workspace.root_path
        for doc in self.documents:
            if len(files) >= self.settings.context_files:
                break
            if doc is current or doc.out_of_sync is not None:
                continue
            if current.language_id and doc.language_id and doc.language_id != current.language_id:
                continue
            path = to_fs_path(doc.uri) or doc.uri
            if root and os.path.commonpath([os.path.abspath(path), root]) == root:
                path = os.path.relpath(path, root)
            else:
                path = os.path.basename(path)
            files.append(ContextFile(path, doc.text, doc.language_id, (doc.uri, doc.version)))
        return files

    async def load_engine(self) -> None:
        """Load the engine for the current settings, reporting progress if the client can show it."""
        token = None
        caps = self.client_capabilities.window
        if caps is not None and caps.work_done_progress:
            token = f"dscoder-load-{next(self._progress_ids)}"
            try:
                await self.work_done_progress.create_async(token)
            except JsonRpcException as exc:
                log.warning("client refused progress token: %s", exc)
                token = None
        if token is not None:
            title = "dscoder: loading model"
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title))

        def report(message: str, percent: int | None) -> None:
            # Stages restart at 0%, and LSP percentages must not go back: the stage goes in the message.
            log.info("load: %s (%s%%)", message, percent)
            if token is not None:
                self.work_done_progress.report(token, types.WorkDoneProgressReport(message=message))

        self.completer.engine_changed()  # stop decoding on the engine about to be replaced
        ok = await self.host.load(self.settings, report)
        self.completer.engine_changed()
        message = "ready" if ok else f"failed: {self.host.error}"
        if not ok:  # before the progress ends: a client that sees the end has the reason too
            self.show(f"dscoder: the model did not load: {self.host.error}", types.MessageType.Error)
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
