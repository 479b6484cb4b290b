"""The language server object and the JSON-RPC details around the handlers: our notification and request
names, malformed messages, load progress, and document snapshots in the client's position encoding."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer

from lsp_dscoder import __version__
from lsp_dscoder.completer import Completer, Snapshot
from lsp_dscoder.engine_host import EngineHost
from lsp_dscoder.errors import DocumentNotOpenError
from lsp_dscoder.positions import Encoding, offset_at, position_at, sanitize
from lsp_dscoder.prompt import ContextFile
from lsp_dscoder.rpc import DscoderProtocol
from lsp_dscoder.settings import Settings
from lsp_dscoder.stats import Stats

PARTIAL_COMPLETION = "dscoder/partialCompletion"
STATS = "dscoder/stats"

log = logging.getLogger(__name__)


class DscoderServer(LanguageServer):
    """Holds the server's state; the handlers in `server.py` are registered on it."""

    def __init__(self, base: Settings) -> None:
        super().__init__("lsp-dscoder", __version__, protocol_cls=DscoderProtocol, max_workers=4)
        self.base = base  # defaults with the command line applied
        self.settings = base
        self.stats = Stats()
        self.host = EngineHost()
        self.completer = Completer(self.host, base, self.stats)
        self.shutdown_requested = False
        self.exit_code = 0
        self.loading: asyncio.Future[None] | None = None
        self._progress_ids = itertools.count(1)

    def report_server_error(self, error: Exception, source: Any) -> None:
        if isinstance(error, json.JSONDecodeError | UnicodeDecodeError | JsonRpcException):
            log.warning("ignored a malformed message: %s", error)
            self.show(f"dscoder: ignored a malformed message ({error})", types.MessageType.Warning)
            return
        super().report_server_error(error, source)

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    @property
    def encoding(self) -> Encoding:
        return Encoding.parse(self.workspace.position_encoding)

    def document(self, uri: str) -> Any:
        doc = self.workspace.text_documents.get(unquote(uri))
        if doc is None:
            raise DocumentNotOpenError(uri)
        return doc

    def snapshot(self, uri: str, position: types.Position) -> Snapshot:
        """Raises DocumentNotOpenError / PositionError (the client's mistakes)."""
        doc = self.document(uri)
        text = sanitize(doc.source)
        cursor = offset_at(text, position.line, position.character, self.encoding)
        return Snapshot(uri, doc.version, text, cursor, doc.language_id, lambda: self._context(uri, doc))

    def position(self, snap: Snapshot, offset: int) -> types.Position:
        line, character = position_at(snap.text, offset, self.encoding)
        return types.Position(line=line, character=character)

    def current_version(self, uri: str) -> int | None:
        doc = self.workspace.text_documents.get(unquote(uri))
        return None if doc is None else doc.version

    def _context(self, uri: str, current: Any) -> list[ContextFile]:
        """Other open documents of the same language (any, if unknown), in URI order."""
        files = []
        root = self.workspace.root_path
        for other_uri, doc in sorted(self.workspace.text_documents.items()):
            if len(files) >= self.settings.context_files:
                break
            if other_uri == unquote(uri):
                continue
            if current.language_id and doc.language_id and doc.language_id != current.language_id:
                continue
            path = doc.path or other_uri
            if root and os.path.commonpath([os.path.abspath(path), root]) == root:
                path = os.path.relpath(path, root)
            else:
                path = os.path.basename(path)
            files.append(ContextFile(path, sanitize(doc.source), doc.language_id, (other_uri, doc.version)))
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
