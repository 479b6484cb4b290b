"""How messages reach the handlers: the keystroke's notifications read straight from the JSON, completion
requests started as they are read, text sync kept in the server's own documents, and our notifications
written as one message each."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from lsprotocol import types
from pygls.protocol.language_server import lsp_method

from lsp_dscoder.documents import check_version, keystroke_change
from lsp_dscoder.errors import DocumentSyncError
from lsp_dscoder.framing import framed
from lsp_dscoder.rpc import DscoderProtocol

if TYPE_CHECKING:
    from lsp_dscoder.protocol import DscoderServer

T = TypeVar("T")
log = logging.getLogger(__name__)
_SYNC = (types.TEXT_DOCUMENT_DID_OPEN, types.TEXT_DOCUMENT_DID_CHANGE)
PARTIAL_COMPLETION = "dscoder/partialCompletion"
# The backend's state as the editor's status shows it: sent when a remote endpoint goes down or works again.
BACKEND_STATUS = "dscoder/status"


def json_message(method: str, params: dict[str, Any]) -> bytes:
    """A notification with plain JSON params, framed."""
    return framed(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())


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

    @property
    def writes_from_any_thread(self) -> bool:
        """Whether `notify_json` may be called from a thread other than the event loop's."""
        return bool(getattr(self.writer, "any_thread", False))

    def notify_json(self, method: str, params: dict[str, Any]) -> None:
        """A notification whose params are plain JSON values, written as one message without pygls'
        structuring: `dscoder/partialCompletion` goes out for every change of the visible text."""
        if self.writer is not None:
            self.writer.write(json_message(method, params))

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
