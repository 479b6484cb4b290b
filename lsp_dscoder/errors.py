"""The server's error hierarchy.

Handlers turn a `ServerError` into an empty result plus one logged line; only `ProtocolMisuse` (a request
about a document the client never opened, a position outside the document) becomes a JSON-RPC error,
because the client, not the server, has to change.
"""


class ServerError(Exception):
    """Base class for the refusals the language server makes."""


class ProtocolMisuse(ServerError):
    """The client sent a request that cannot refer to anything; answered with InvalidParams (-32602)."""


class DocumentNotOpenError(ProtocolMisuse):
    def __init__(self, uri: str) -> None:
        super().__init__(f"document is not open: {uri}")
        self.uri = uri


class PositionError(ProtocolMisuse):
    """A position whose line is past the end of the document (or negative)."""


class DocumentSyncError(ServerError):
    """A didOpen/didChange that cannot be applied (reversed range, position past the end, a version that
    does not increase or is not an integer). The server's copy no longer matches the editor's, so the
    document is marked out of sync until the editor sends its whole text again."""


class DocumentOutOfSyncError(ServerError):
    """A request about a document whose copy missed a change: answered with an empty result."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"document {uri} is out of sync ({reason}); reopen it to get suggestions again")
        self.uri = uri
