"""The messages of a keystroke take the short path, and its answer is one exact write: `didChange` and
`$/cancelRequest` are read straight from the JSON (the same edits cattrs' params give, or cattrs for any
other shape), and a partial completion is one framed message in one write."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from lsp_dscoder.documents import Edit, keystroke_change
from lsp_dscoder.framing import Framer
from lsp_dscoder.protocol import PARTIAL_COMPLETION, DscoderServer
from lsp_dscoder.server import create_server
from lsp_dscoder.settings import parse
from lsp_dscoder.transport import Dispatcher

URI = "file:///work/k.py"
TEXT = "def f(x):\n    return x\n"


def span(sl: int, sc: int, el: int, ec: int) -> dict[str, Any]:
    return {"start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}}


def did_change(version: int, *changes: dict[str, Any]) -> dict[str, Any]:
    return {"textDocument": {"uri": URI, "version": version}, "contentChanges": list(changes)}


class Writes:
    """The server's writer: every write call, as made."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.calls.append(data)

    def close(self) -> None:
        pass

    def messages(self) -> list[dict[str, Any]]:
        out = []
        for data in self.calls:
            header, body = data.split(b"\r\n\r\n", 1)
            assert header.split(b"\r\n")[0] == b"Content-Length: %d" % len(body)
            out.append(json.loads(body))
        return out


def serve(**options: Any) -> tuple[DscoderServer, Dispatcher, Writes]:
    ls = create_server(parse(options)[0])
    writes = Writes()
    ls.protocol.set_writer(writes)
    dispatch = Dispatcher(ls)
    init = {"processId": None, "rootUri": None, "capabilities": {}}
    send(dispatch, {"id": 0, "method": "initialize", "params": init})
    item = {"uri": URI, "languageId": "python", "version": 1, "text": TEXT}
    send(dispatch, {"method": "textDocument/didOpen", "params": {"textDocument": item}})
    writes.calls.clear()
    return ls, dispatch, writes


def send(dispatch: Dispatcher, message: dict[str, Any]) -> None:
    assert dispatch(json.dumps({"jsonrpc": "2.0", **message}).encode())


@pytest.mark.parametrize(
    "raw",
    [
        did_change(2, {"range": span(1, 4, 1, 4), "text": "y"}),
        did_change(3, {"range": span(0, 0, 1, 2), "rangeLength": 12, "text": "😀 你\r\n"}),
        did_change(4, {"text": "whole\n"}, {"range": span(0, 5, 0, 5), "text": ""}),
        did_change(5),
    ],
)
def test_keystroke_changes_are_what_cattrs_builds(raw: dict[str, Any]) -> None:
    ls = create_server(parse({})[0])
    params = ls.protocol._converter.structure(raw, types.DidChangeTextDocumentParams)
    edits = [Edit.of(change) for change in params.content_changes]
    assert keystroke_change(raw) == (params.text_document.uri, params.text_document.version, edits)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"textDocument": {"uri": URI, "version": 2}},  # no contentChanges
        {"textDocument": {"uri": 7, "version": 2}, "contentChanges": []},
        did_change(2, {"range": span(-1, 0, 0, 0), "text": "x"}),  # a negative line
        did_change(2, {"range": span(1.5, 0, 2, 0), "text": "x"}),  # type: ignore[arg-type]
        did_change(2, {"range": None, "text": "x"}),
        did_change(2, {"range": span(0, 0, 0, 0), "text": 5}),
        did_change(2, {"range": span(0, 0, 0, 0), "text": "x", "rangeLength": "1"}),
        did_change(2, {"range": span(0, 0, 0, 0), "text": "x", "rangeLength": -1}),
        did_change(2, {"range": span(0, 0, 2**31, 0), "text": "x"}),  # past LSP's uinteger
        did_change(2, {"range": span(0, True, 0, 0), "text": "x"}),
    ],
)
def test_other_shapes_are_left_to_cattrs(raw: Any) -> None:
    assert keystroke_change(raw) is None


def test_a_keystroke_writes_nothing_and_keeps_no_future() -> None:
    ls, dispatch, writes = serve()
    for version, column in enumerate(range(4, 10), start=2):
        send(
            dispatch,
            {
                "method": "textDocument/didChange",
                "params": did_change(version, {"range": span(1, column, 1, column), "text": "z"}),
            },
        )
        send(dispatch, {"method": "$/cancelRequest", "params": {"id": 1000 + version}})  # already answered
    doc = ls.documents.get(URI)
    assert (doc.version, doc.text) == (7, "def f(x):\n    zzzzzzreturn x\n")
    assert writes.calls == [] and ls.protocol._request_futures == {}


def test_a_change_the_short_path_cannot_read_is_still_applied() -> None:
    ls, dispatch, _ = serve()
    change = {"range": span(1, 4, 1, 4), "rangeLength": 0.0, "text": "y"}  # cattrs accepts a float length
    assert keystroke_change(did_change(2, change)) is None
    send(dispatch, {"method": "textDocument/didChange", "params": did_change(2, change)})
    assert ls.documents.get(URI).text == "def f(x):\n    yreturn x\n"


def test_a_partial_completion_is_one_exact_write() -> None:
    ls, _, writes = serve()
    params = {"requestId": 3, "uri": URI, "version": 2, "position": {"line": 1, "character": 4}}
    ls.protocol.notify_json(PARTIAL_COMPLETION, {**params, "text": "ret😀", "done": False})
    assert len(writes.calls) == 1
    assert writes.messages() == [
        {"jsonrpc": "2.0", "method": PARTIAL_COMPLETION, "params": {**params, "text": "ret😀", "done": False}}
    ]


async def test_a_request_before_the_engine_is_ready_is_one_null_response() -> None:
    ls, dispatch, writes = serve()
    position = {"line": 1, "character": 4}
    inline = {"textDocument": {"uri": URI}, "position": position, "context": {"triggerKind": 2}}
    send(dispatch, {"id": 9, "method": "textDocument/inlineCompletion", "params": inline})
    await ls.protocol._request_futures[9]
    await asyncio.sleep(0)  # the response is written by the future's callback
    assert writes.messages() == [{"jsonrpc": "2.0", "id": 9, "result": None}]


async def test_a_completion_request_starts_as_it_is_read(tiny_model: Path) -> None:
    """The engine has the request, and a typed-through answer its partial, by the time the message that
    carried the request has been dispatched: no turn of the loop in between."""
    ls, dispatch, writes = serve(model=str(tiny_model), device="cpu", maxTokens=6, responseMode="full")
    assert await ls.host.load(ls.settings, lambda message, percent: None)
    try:
        position = {"line": 1, "character": 4}
        inline = {"textDocument": {"uri": URI}, "position": position, "context": {"triggerKind": 2}}
        before = ls.host.stats()["requests"]  # the load's own warm-up requests
        send(dispatch, {"id": 1, "method": "textDocument/inlineCompletion", "params": inline})
        assert ls.host.stats()["requests"] == before + 1  # submitted before dispatch returned
        first = await ls.protocol._request_futures[1]
        assert first is not None and first.items[0].insert_text
        shown = first.items[0].insert_text
        await asyncio.sleep(0)  # the response is written by the future's callback
        writes.calls.clear()

        change = did_change(2, {"range": span(1, 4, 1, 4), "text": shown[0]})
        send(dispatch, {"method": "textDocument/didChange", "params": change})
        inline["position"] = {"line": 1, "character": 5}
        send(dispatch, {"id": 2, "method": "textDocument/inlineCompletion", "params": inline})
        partial = {"requestId": 2, "uri": URI, "version": 2, "position": {"line": 1, "character": 5}}
        partial.update(text=shown[1:], done=True)
        assert writes.messages() == [{"jsonrpc": "2.0", "method": PARTIAL_COMPLETION, "params": partial}]
        assert ls.host.stats()["requests"] == before + 1  # typed through: from memory, not the engine
        assert ls.stats.as_dict(1)["recent"][-1]["source"] == "memory"
    finally:
        ls.host.close()


def test_canonical_headers_frame_the_same_in_any_chunking() -> None:
    bodies = [
        json.dumps({"jsonrpc": "2.0", "method": "m", "params": {"i": i, "s": "😀" * i}}).encode()
        for i in range(3)
    ]
    stream = b"".join(b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    skipped: list[str] = []
    for size in (1, 2, 7, 16, 17, 19, len(stream)):
        framer = Framer(skipped.append)
        got = [body for at in range(0, len(stream), size) for body in framer.feed(stream[at : at + size])]
        assert got == bodies and framer.pending == 0
    assert skipped == []
