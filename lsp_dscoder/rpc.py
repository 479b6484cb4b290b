"""JSON-RPC details below the handlers: how malformed requests, requests without params and requests after
`shutdown` are answered, and converters warmed before the first keystroke needs them."""

from __future__ import annotations

import logging
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any

from cattrs import ClassValidationError, transform_error
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
)
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage
from pygls.protocol.language_server import lsp_method

log = logging.getLogger(__name__)

_ORIGIN = {"line": 0, "character": 0}
# Messages every editing session sends and receives on each keystroke: cattrs generates the code that
# (un)structures a type the first time it meets it, ~30 ms for these, so it is done before the first one.
_WARM_IN = (
    {
        "jsonrpc": "2.0",
        "method": types.TEXT_DOCUMENT_DID_CHANGE,
        "params": {
            "textDocument": {"uri": "file:///warm.py", "version": 2},
            "contentChanges": [
                {
                    "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                    "text": "x",
                },
                {"text": "x"},
            ],
        },
    },
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
        "params": {
            "textDocument": {"uri": "file:///warm.py"},
            "position": {"line": 0, "character": 1},
            "context": {"triggerKind": 2},
        },
    },
    {"jsonrpc": "2.0", "method": types.CANCEL_REQUEST, "params": {"id": 1}},
)


class _Answered:
    """Stands in for a request that was already answered with an error while it was being parsed."""


class DscoderProtocol(LanguageServerProtocol):
    """pygls drops a request whose params do not parse without answering it, logs a traceback for it,
    refuses a request without `params` (valid JSON-RPC), and never answers requests after `shutdown`.
    Here each gets its JSON-RPC answer and one log line."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        if "jsonrpc" not in data:  # a nested object, when pygls' own reader calls this for each
            return data
        try:
            return self.structure_quietly(data)
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, JsonRpcException) else exc
            detail = "; ".join(transform_error(cause)) if isinstance(cause, ClassValidationError) else cause
            message = f"invalid params for {data.get('method', 'a response')}: {detail}"
            if "id" not in data or "method" not in data:
                raise JsonRpcInvalidParams(message) from exc
            log.warning("request %s: %s", data["id"], message)
            self._send_response(data["id"], error=JsonRpcInvalidParams(message).to_response_error())
            return _Answered()

    def structure_quietly(self, data: dict[str, Any]) -> Any:
        """The message as `structure_message` makes it, for work that answers nothing (keep_warm.py): a
        message that does not parse raises, and no error response goes out."""
        if "method" in data and "params" not in data:
            data = {**data, "params": None}
        return self._structure(data)

    def _structure(self, data: dict[str, Any]) -> Any:
        if "id" not in data:
            kind = self.get_message_type(data.get("method", "")) or JsonRPCNotification
        elif "error" in data:
            kind = types.ResponseErrorMessage
        elif "method" in data:
            kind = self.get_message_type(data["method"]) or JsonRPCRequestMessage
        else:
            kind = self._result_types.pop(data["id"], None) or JsonRPCResponseMessage
        return self._converter.structure(data, kind)

    def handle_message(self, message: Any) -> None:
        if isinstance(message, _Answered):
            return
        method = getattr(message, "method", None)
        if self._shutdown and method is not None and method != types.EXIT:
            if hasattr(message, "id"):
                error = JsonRpcInvalidRequest(f"{method} after shutdown: only exit is accepted")
                self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)

    def _send_handler_result(self, future: Future[Any], *, msg_id: Any) -> None:
        error = None if future.cancelled() else future.exception()
        if isinstance(error, JsonRpcException) and not isinstance(error, JsonRpcInternalError):
            # The handler refused the request with a reason (and logged it): answer without a traceback.
            self._request_futures.pop(msg_id, None)
            self._send_response(msg_id, error=error.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Generator[Any, Any, None]:
        """pygls' own, except that it iterates over a copy: cancelling a request's future runs callbacks
        that remove it from the dict (shutdown while the model loads failed with an internal error)."""
        if (handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield handler, args, None
        current = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()
        self._shutdown = True

    def _run_generator(self, future: Future[Any] | None, *, gen: Any, result_future: Future[Any]) -> None:
        # pygls resumes a generator handler (e.g. `initialized`) with the result of the step it waited
        # for; a step cancelled at shutdown would raise CancelledError out of the loop's callback.
        if future is not None and future.cancelled():
            result_future.cancel()
            return
        super()._run_generator(future, gen=gen, result_future=result_future)

    def warm(self) -> None:
        """Have cattrs generate the (un)structuring code of the per-keystroke messages now."""
        for data in _WARM_IN:
            self._structure(data)
        item = types.InlineCompletionItem(
            insert_text="x", range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0))
        )
        self._converter.unstructure(types.InlineCompletionList(items=[item]))
        partial = {"requestId": 1, "uri": "file:///warm.py", "version": 2, "text": "x", "done": False}
        self._converter.unstructure(
            JsonRPCNotification(method="dscoder/partialCompletion", jsonrpc="2.0", params=partial)
        )
