"""A pytest-lsp client on a real `lsp-dscoder --stdio` process, with the editor actions the tests need
and a log of partial notifications and responses in the order they came off the wire."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp.client import LanguageClient, make_test_lsp_client

PARTIAL = "dscoder/partialCompletion"
STATUS = "dscoder/status"
TIMEOUT_S = 60.0


@dataclass
class Request:
    id: int
    version: int
    sent_at: float
    future: Future
    first_partial_at: float | None = None

    async def result(self) -> Any:
        return await asyncio.wait_for(asyncio.wrap_future(self.future), TIMEOUT_S)

    async def error(self) -> JsonRpcException:
        try:
            result = await self.result()
        except JsonRpcException as exc:
            return exc
        raise AssertionError(f"request {self.id} answered {result!r}, expected an error")


@dataclass
class Doc:
    uri: str
    text: str
    version: int = 1


@dataclass
class Editor:
    client: LanguageClient
    wire: list[tuple[str, Any]] = field(default_factory=list)  # ("partial", params) | ("response", id)
    statuses: list[dict[str, Any]] = field(default_factory=list)  # `dscoder/status` params, in order
    ids: itertools.count = field(default_factory=lambda: itertools.count(1000))
    requests: dict[int, Request] = field(default_factory=dict)
    initialize_result: types.InitializeResult | None = None

    def __post_init__(self) -> None:
        @self.client.feature(PARTIAL)
        def partial(ls: LanguageClient, params: Any) -> None:
            params = to_plain(params)
            self.wire.append(("partial", params))
            request = self.requests.get(params["requestId"])
            if request is not None and request.first_partial_at is None:
                request.first_partial_at = time.perf_counter()

        @self.client.feature(STATUS)
        def status(ls: LanguageClient, params: Any) -> None:
            self.statuses.append(to_plain(params))

    def partials(self, request: Request) -> list[dict[str, Any]]:
        return [p for kind, p in self.wire if kind == "partial" and p["requestId"] == request.id]

    def open(self, uri: str, text: str, language_id: str = "python") -> Doc:
        item = types.TextDocumentItem(uri=uri, language_id=language_id, version=1, text=text)
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
        return Doc(uri, text)

    def insert(self, doc: Doc, offset: int, text: str, *, line: int, character: int) -> None:
        """Insert at (line, character) (client units), which is `offset` in the Python string."""
        doc.text = doc.text[:offset] + text + doc.text[offset:]
        doc.version += 1
        at = types.Position(line=line, character=character)
        change = types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)
        ident = types.VersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version)
        params = types.DidChangeTextDocumentParams(text_document=ident, content_changes=[change])
        self.client.text_document_did_change(params)

    def request(self, method: str, params: Any, version: int = 0) -> Request:
        msg_id = next(self.ids)
        sent_at = time.perf_counter()  # before writing: the process may be descheduled right after
        future = self.client.protocol.send_request(method, params, msg_id=msg_id)
        request = Request(msg_id, version, sent_at, future)
        self.requests[msg_id] = request
        future.add_done_callback(lambda _: self.wire.append(("response", msg_id)))
        return request

    def inline(self, doc: Doc, line: int, character: int) -> Request:
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(uri=doc.uri),
            position=types.Position(line=line, character=character),
        )
        return self.request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, doc.version)

    def cancel(self, request: Request) -> None:
        self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=request.id))

    async def first_partial(self, request: Request) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while not self.partials(request):
                await asyncio.sleep(0.002)
            return self.partials(request)[0]

        return await asyncio.wait_for(wait(), TIMEOUT_S)

    async def done(self, request: Request) -> dict[str, Any]:
        """The last partial (done=true) of a request whose generation runs to its end."""

        async def wait() -> dict[str, Any]:
            while not any(p["done"] for p in self.partials(request)):
                await asyncio.sleep(0.005)
            return self.partials(request)[-1]

        return await asyncio.wait_for(wait(), TIMEOUT_S)

    async def stats(self) -> dict[str, Any]:
        result = await self.client.protocol.send_request_async("dscoder/stats", {})
        return to_plain(result)

    async def record(self, request: Request) -> dict[str, Any]:
        """The server's record of a request, once it has been logged."""

        async def wait() -> dict[str, Any]:
            while True:
                recent = (await self.stats())["requests"]["recent"]
                found = [r for r in recent if r["requestId"] == request.id]
                if found:
                    return found[0]
                await asyncio.sleep(0.01)

        return await asyncio.wait_for(wait(), TIMEOUT_S)

    async def ready(self) -> list[Any]:
        """Wait for the model-load progress to end; returns its reports."""

        async def wait() -> list[Any]:
            while True:
                for reports in self.client.progress_reports.values():
                    if reports and getattr(reports[-1], "kind", "") == "end":
                        return reports
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(wait(), TIMEOUT_S)


def to_plain(value: Any) -> Any:
    """pygls turns unknown results into namedtuple-like `Object`s; tests want dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: to_plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def server_command(model: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lsp_dscoder",
        "--stdio",
        "--model",
        str(model),
        "--max-context",
        "1024",
        *extra,
    ]


async def start(
    model: Path,
    *extra: str,
    init: dict[str, Any] | None = None,
    encodings: list[str] | None = None,
    wait: bool = True,
    env: dict[str, str] | None = None,
) -> Editor:
    """`env`: the server process's whole environment (None: this one's)."""
    client = make_test_lsp_client()
    editor = Editor(client)
    await client.start_io(*server_command(model, *extra), env=env)
    capabilities = types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True),
        workspace=types.WorkspaceClientCapabilities(configuration=True),
        general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None,
    )
    params = types.InitializeParams(capabilities=capabilities, initialization_options=init)
    editor.initialize_result = await client.initialize_session(params)
    if wait:
        await editor.ready()
    return editor
