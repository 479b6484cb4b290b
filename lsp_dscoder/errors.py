"""The server's error hierarchy.

Handlers turn a `ServerError` into an empty result plus one logged line; only `ProtocolMisuse` (a request
about a document the client never opened, a position outside the document) becomes a JSON-RPC error,
because the client, not the server, has to change.
"""


class ServerError(Exception):
    """Base class for the refusals the language server makes."""


class NotReadyError(ServerError):
    """The engine is still loading (or failed to load); the request gets an empty result."""


class ProtocolMisuse(ServerError):
    """The client sent a request that cannot refer to anything; answered with InvalidParams (-32602)."""


class DocumentNotOpenError(ProtocolMisuse):
    def __init__(self, uri: str) -> None:
        super().__init__(f"document is not open: {uri}")
        self.uri = uri


class PositionError(ProtocolMisuse):
    """A position whose line is past the end of the document (or negative)."""
