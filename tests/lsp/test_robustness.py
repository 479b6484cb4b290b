"""Bad input against the real server (UTF-8 positions negotiated): each gets a clear error or an empty
result and the server keeps serving; it exits cleanly when stdin closes."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp_dscoder.positions import Encoding, position_at
from tests.lsp.client import Editor, start

pytestmark = pytest.mark.asyncio(loop_scope="module")
INVALID_PARAMS = -32602
BODY = "def main(args):\n    \n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(tiny_model):
    ed = await start(tiny_model, init={"maxTokens": 0, "colour": "red"}, encodings=["utf-8"], wait=False)
    yield ed
    if ed.client._server.returncode is None:
        await ed.client.shutdown_session()
    await ed.client.stop()


def raw(editor: Editor, message: bytes | dict) -> None:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    editor.client._server.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


async def test_requests_while_loading_get_an_empty_result(editor):
    doc = editor.open("file:///work/early.py", BODY)
    early = editor.inline(doc, 1, 4)
    assert await early.result() is None
    assert (await editor.record(early))["outcome"] == "not_ready"
    await editor.ready()
    later = editor.inline(doc, 1, 4)
    await later.result()
    assert (await editor.record(later))["outcome"] in ("ok", "empty")


async def test_bad_initialization_options_fall_back_with_a_message(editor):
    await editor.ready()
    assert [m.message for m in editor.client.messages[:2]] == [
        "dscoder: setting 'maxTokens': expected an integer in [1, 65536], got 0; using the default 128",
        "dscoder: unknown setting 'colour' ignored",
    ]
    assert (await editor.stats())["settings"]["maxTokens"] == 128


async def test_unknown_document_and_positions_past_the_end(editor):
    doc = editor.open("file:///work/short.py", "a = 1\nb = 2\n")
    missing = editor.inline(type(doc)("file:///work/never-opened.py", ""), 0, 0)
    error = await missing.error()
    assert (error.code, error.message) == (
        INVALID_PARAMS,
        "document is not open: file:///work/never-opened.py",
    )
    error = await editor.inline(doc, 9, 0).error()
    assert (error.code, error.message) == (INVALID_PARAMS, "line 9 is past the end of the document (3 lines)")
    clamped = await editor.inline(doc, 0, 99).result()  # past the line's end: the line's end (LSP)
    if clamped is not None:
        assert clamped.items[0].range.start == types.Position(line=0, character=5)


async def test_utf8_positions_when_negotiated(editor):
    assert editor.initialize_result.capabilities.position_encoding == types.PositionEncodingKind.Utf8
    text = 'x = "😀你" + f()\n'
    doc = editor.open("file:///work/utf8.py", text)
    assert position_at(text, text.index("()") + 1, Encoding.UTF8) == (0, 18)
    request = editor.inline(doc, 0, 18)
    result = await request.result()
    if result is not None:
        assert result.items[0].range.start == types.Position(line=0, character=18)
    assert (await editor.record(request))["outcome"] in ("ok", "empty")


async def test_lone_surrogates_are_served(editor):
    text = 's = "\ud800"\nt = "\udfff'
    doc = editor.open("file:///work/surrogates.py", text)
    editor.insert(doc, len(text), "\ud83d", line=1, character=8)  # half an emoji
    request = editor.inline(doc, 1, 11)
    await request.result()
    assert (await editor.record(request))["outcome"] in ("ok", "empty")


async def test_huge_document(editor):
    text = "".join(f"value_{i} = compute({i})\n" for i in range(60_000))  # 1.5 MB
    doc = editor.open("file:///work/huge.py", text)
    middle = text.index("value_30000 ")
    line, _ = position_at(text, middle, Encoding.UTF8)
    editor.insert(doc, middle, "x", line=line, character=0)
    for position in ((line, 1), (60_000, 0)):
        request = editor.inline(doc, *position)
        await request.result()
        record = await editor.record(request)
        assert record["outcome"] in ("ok", "empty") and record["promptTokens"] <= 1024


async def test_malformed_messages_leave_the_server_serving(editor):
    doc = editor.open("file:///work/malformed.py", BODY)
    raw(editor, b"{not json")
    answer: Future = Future()
    editor.client.protocol._request_futures[77] = answer  # a raw request the client did not make
    bad_params = {"textDocument": {"uri": doc.uri}, "context": {"triggerKind": 1}}  # no position
    raw(editor, {"jsonrpc": "2.0", "id": 77, "method": "textDocument/inlineCompletion", "params": bad_params})
    raw(editor, {"jsonrpc": "2.0", "method": "dscoder/noSuchNotification", "params": {}})
    with pytest.raises(JsonRpcException) as error:
        await asyncio.wait_for(asyncio.wrap_future(answer), 30)
    assert (error.value.code, error.value.message) == (
        INVALID_PARAMS,
        "invalid params for textDocument/inlineCompletion: required field missing @ $.params.position",
    )
    request = editor.inline(doc, 1, 4)
    await request.result()
    assert (await editor.record(request))["outcome"] in ("ok", "empty")
    assert any(m.message.startswith("dscoder: ignored a malformed message") for m in editor.client.messages)


async def test_a_request_flood_while_typing(editor):
    doc = editor.open("file:///work/flood.py", BODY)
    offset, requests = BODY.index("\n", 16), []
    for i, ch in enumerate("result = compute(args, 42)"):
        editor.insert(doc, offset + i, ch, line=1, character=4 + i)
        requests.append(editor.inline(doc, 1, 5 + i))
    results = [await r.result() for r in requests]
    assert results[:-1] == [None] * (len(requests) - 1)  # superseded or stale: never an old version
    records = [await editor.record(r) for r in requests]
    assert {r["outcome"] for r in records[:-1]} <= {"superseded"}
    assert records[-1]["outcome"] in ("ok", "empty") and records[-1]["version"] == doc.version


async def test_debounce_submits_only_the_last_keystroke(editor):
    settings = {"dscoder": {"debounceMs": 300}}
    editor.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))
    try:
        doc = editor.open("file:///work/debounce.py", BODY)
        before = (await editor.stats())["engine"]["requests"]
        offset, requests = BODY.index("\n", 16), []
        for i, ch in enumerate("abc"):
            editor.insert(doc, offset + i, ch, line=1, character=4 + i)
            requests.append(editor.inline(doc, 1, 5 + i))
        records = [await editor.record(r) for r in requests]
        assert [(r["source"], r["outcome"]) for r in records[:-1]] == [("none", "superseded")] * 2
        assert records[-1]["source"] == "engine"
        assert (await editor.stats())["engine"]["requests"] == before + 1
    finally:
        settings = {"dscoder": {"debounceMs": 0}}
        editor.client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings=settings)
        )


async def test_did_change_configuration_pushed_and_pulled(editor):
    settings = types.DidChangeConfigurationParams(
        settings={"dscoder": {"debounceMs": 5, "responseMode": "x"}}
    )
    editor.client.workspace_did_change_configuration(settings)
    await asyncio.sleep(0.2)
    stats = await editor.stats()
    assert (stats["settings"]["debounceMs"], stats["settings"]["responseMode"]) == (5, "firstLine")
    assert editor.client.messages[-1].message == (
        "dscoder: setting 'responseMode': expected one of 'firstLine', 'full', got 'x'; using the default "
        '"firstLine"'
    )
    editor.client.set_configuration({"maxTokens": 50}, section="dscoder")
    editor.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    await asyncio.sleep(0.2)
    assert (await editor.stats())["settings"]["maxTokens"] == 50


async def test_stdin_eof_exits_cleanly(editor):
    editor.client._server.stdin.close()
    assert await asyncio.wait_for(editor.client._server.wait(), 30) == 0
