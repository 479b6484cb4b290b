"""The language server object: its state (documents, completer, engine host, stats, settings), our
notification and request names, how malformed messages are reported, load progress, and document
snapshots in the client's position encoding. How messages reach the handlers is `dispatch.py`."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from lsp_dscoder import __version__
from lsp_dscoder.completer import Completer, Snapshot
from lsp_dscoder.dispatch import PARTIAL_COMPLETION, DocumentProtocol, Starter
from lsp_dscoder.documents import Change, Document, Documents, Edit
from lsp_dscoder.engine_host import EngineHost
from lsp_dscoder.errors import DocumentNotOpenError, DocumentSyncError
from lsp_dscoder.keep_warm import KeepWarm
from lsp_dscoder.positions import Encoding
from lsp_dscoder.prompt import ContextFile
from lsp_dscoder.settings import CompletionFallback, Settings
from lsp_dscoder.stats import Stats

STATS = "dscoder/stats"

__all__ = ["PARTIAL_COMPLETION", "STATS", "DscoderServer"]
log = logging.getLogger(__name__)


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
        self.keep_warm = KeepWarm(self)

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
        return self._snapshot_at(doc, cursor), types.Position(line=position.line, character=character)

    def _snapshot_at(self, doc: Document, cursor: int) -> Snapshot:
        return Snapshot(doc.uri, doc.version, doc.text, cursor, doc.language_id, lambda: self._context(doc))

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
        self.completer.changed(uri, doc.text, doc.version, doc.splice)
        if (splice := doc.splice) is not None:  # one ranged edit: the cursor is most likely at its end
            self.completer.anticipate(uri, lambda: self._snapshot_at(doc, splice.start + splice.length))

    def sync_refused(self, uri: str, method: str, reason: str) -> None:
        """A didOpen/didChange that could not be applied: say so, and answer nothing from the old text."""
        self.documents.refuse(uri, reason)
        self.completer.closed(uri)
        message = (
            f"dscoder: {method} for {uri} refused: {reason}; "
            "no suggestions for it until it is reopened or its whole text is sent"
        )
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
