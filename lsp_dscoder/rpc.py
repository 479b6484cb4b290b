"""JSON-RPC details below the handlers: how malformed and unparsable requests are answered."""

from __future__ import annotations

import logging
from typing import Any

from cattrs import ClassValidationError, transform_error
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger(__name__)


class _Answered:
    """Stands in for a request that was already answered with an error while it was being parsed."""


class DscoderProtocol(LanguageServerProtocol):
    """pygls drops a request whose params do not parse without answering it; answer -32602 instead."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" not in data or "method" not in data:
                raise
            cause = exc.__cause__
            detail = "; ".join(transform_error(cause)) if isinstance(cause, ClassValidationError) else exc
            message = f"invalid params for {data['method']}: {detail}"
            log.warning("request %s: %s", data["id"], message)
            self._send_response(data["id"], error=JsonRpcInvalidParams(message).to_response_error())
            return _Answered()

    def handle_message(self, message: Any) -> None:
        if not isinstance(message, _Answered):
            super().handle_message(message)
