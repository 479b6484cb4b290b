"""Editor sessions through `lsp-dscoder --backend remote` against llama.cpp's server: streamed partials
equal to what llama.cpp generates for the same prompt, typing through from memory, the prompt cache hit
on a keystroke, $/cancelRequest stopping llama.cpp, and the engine dying mid-stream or never listening."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.prompt import Budgets, PromptBuilder
from tests.lsp.client import Editor, start
from tests.remote.llama_server import LlamaServer, free_port

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
REQUEST_CANCELLED = -32800
BODY = "import os\n\n\ndef main(args):\n    \n    return 0\n"
LINE, COLUMN = 4, 4
LONG = "VALUES = [\n    \n"  # inside brackets: no stop rule ends the suggestion at a blank line
# llama.cpp generates to max_tokens (EOS ignored): only a cut stream stops it early, whatever the model says
UNTIL_CUT = {"maxTokens": 400, "responseMode": "full", "remoteRequest": {"ignore_eos": True}}


def remote_args(url: str) -> tuple[str, ...]:
    return ("--backend", "remote", "--endpoint", url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(llama: LlamaServer, bundled: Path):
    ed = await start(bundled, *remote_args(llama.url), init=UNTIL_CUT)
    yield ed
    await ed.client.shutdown_session()
    await ed.client.stop()


async def wait_for(predicate, timeout: float = 20.0) -> None:
    async def poll() -> None:
        while not await predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def test_streamed_suggestion_is_what_llama_server_generates(
    editor: Editor, llama: LlamaServer, bundled
):
    doc = editor.open("file:///work/remote_stream.py", BODY)
    request = editor.inline(doc, LINE, COLUMN)
    final = (await request.result()).items[0].insert_text
    partials = editor.partials(request)
    texts = [p["text"] for p in partials]
    assert len(texts) >= 2 and all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert partials[-1]["done"] and texts[-1] == final
    assert editor.wire.index(("partial", partials[-1])) < editor.wire.index(("response", request.id))

    # The same prompt, built as the server builds it, sent to llama.cpp directly (greedy): the shaped
    # text is the suggestion, character for character.
    tok = Tokenizer(bundled)
    cursor = BODY.index("\n    return")
    prompt = PromptBuilder(tok, Budgets().fit(1024, 400)).build(BODY, cursor, language_id="python")
    ids = list(prompt.ids) + tok.encode(prompt.heal_text)
    direct = llama.complete(ids, 400, ignore_eos=True)["choices"][0]["text"]
    shaper = Shaper(CursorContext.at(BODY, cursor))
    shaper.feed(direct)  # after the healed text, which the prompt sent to llama.cpp ends with
    assert shaper.finish() == final != ""
    record = await editor.record(request)
    assert (record["source"], record["outcome"], record["promptTokens"]) == ("engine", "ok", len(ids))
    assert record["firstPartialEarly"] is True  # written as its chunk was parsed (first_text.py)


async def test_typing_through_from_memory_then_the_prompt_cache_on_the_next_keystroke(editor: Editor):
    doc = editor.open("file:///work/remote_through.py", BODY)
    offset = BODY.index("\n    return")
    first = editor.inline(doc, LINE, COLUMN)
    suggestion = (await first.result()).items[0].insert_text
    first_record = await editor.record(first)
    assert len(suggestion) >= 3 and "\n" not in suggestion[:3]
    engine_requests = (await editor.stats())["engine"]["requests"]
    for i, ch in enumerate(suggestion[:3]):
        editor.insert(doc, offset + i, ch, line=LINE, character=COLUMN + i)
    through = editor.inline(doc, LINE, COLUMN + 3)
    assert (await through.result()).items[0].insert_text == suggestion[3:]
    record = await editor.record(through)
    assert (record["source"], record["prefilledTokens"]) == ("memory", None)
    assert (await editor.stats())["engine"]["requests"] == engine_requests  # nothing sent to llama.cpp

    # A character the suggestion did not have: a new request, whose prompt only appends to the last
    # one, so llama.cpp computes only the new tokens and reports the rest as cached.
    editor.insert(doc, offset + 3, "\u00a7", line=LINE, character=COLUMN + 3)
    record = await editor.record(editor.inline(doc, LINE, COLUMN + 4))
    assert record["source"] == "engine"
    assert record["reusedTokens"] + record["prefilledTokens"] == record["promptTokens"]
    # The previous prompt is a prefix of this one: llama.cpp took all of it from its cache.
    assert record["reusedTokens"] >= first_record["promptTokens"] > 10
    assert 1 <= record["prefilledTokens"] <= record["promptTokens"] - first_record["promptTokens"]


async def cancel_mid_stream(ed: Editor, llama: LlamaServer, uri: str) -> None:
    """A suggestion cancelled after its first partial: the editor gets -32800, and llama.cpp stops
    generating long before its 400 tokens (its log says so)."""
    doc = ed.open(uri, LONG)
    cancels = llama.log().count("cancel task")
    request = ed.inline(doc, 1, 4)
    await ed.first_partial(request)
    ed.cancel(request)
    assert (await request.error()).code == REQUEST_CANCELLED
    record = await ed.record(request)
    assert record["stopReason"] == "cancelled" and record["generatedTokens"] < 50

    async def stopped() -> bool:
        return llama.log().count("cancel task") > cancels

    await wait_for(stopped)
    assert llama.released_at_last_cancel() < record["promptTokens"] + 50


async def test_cancel_request_closes_the_stream_and_llama_server_stops(editor: Editor, llama: LlamaServer):
    await cancel_mid_stream(editor, llama, "file:///work/remote_cancel.py")
    stats = (await editor.stats())["engine"]
    assert (stats["backend"], stats["reachable"], stats["connectsOnRequestPath"]) == ("remote", True, 1)


async def test_cancel_stops_llama_server_on_asyncio_loop_too(
    llama: LlamaServer, bundled: Path, tmp_path: Path
):
    """The server runs on uvloop's loop where it is installed (the tests' install has it) and on asyncio's
    otherwise: the two hand a transport's socket out differently, and a cut must reach llama.cpp on both.
    Here uvloop cannot be imported; the stand-in that refuses it leaves a mark that it was asked."""
    stub = tmp_path / "no_uvloop" / "uvloop"
    stub.mkdir(parents=True)
    asked = tmp_path / "uvloop-asked"
    stub.joinpath("__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(asked)!r}).touch()\nraise ImportError('uvloop left out')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(stub.parent), os.environ.get("PYTHONPATH")))),
    }
    ed = await start(bundled, *remote_args(llama.url), init=UNTIL_CUT, env=env)
    try:
        assert asked.exists()  # the server asked for uvloop, was refused, and runs on asyncio's loop
        await cancel_mid_stream(ed, llama, "file:///work/remote_cancel_asyncio.py")
    finally:
        await ed.client.shutdown_session()
        await ed.client.stop()


async def test_a_stop_rule_cuts_the_stream_and_llama_server_stops(llama: LlamaServer, bundled: Path):
    # A server of its own: the module's has other documents open, whose text would join the prompt as
    # context and change what the model writes here.
    ed = await start(bundled, *remote_args(llama.url), init=UNTIL_CUT)
    try:
        doc = ed.open("file:///work/remote_scope.py", "def f(x):\n    \n")
        cancels = llama.log().count("cancel task")
        request = ed.inline(doc, 1, 4)
        assert (await request.result()).items[0].insert_text == " return f(x)"
        record = await ed.record(request)
        assert (record["stopRule"], record["stopReason"]) == ("blank_after_block", "cancelled")

        async def stopped() -> bool:
            return llama.log().count("cancel task") > cancels

        await wait_for(stopped)  # llama.cpp saw the stream cut, not a finished generation
        released = llama.released_at_last_cancel()
        assert released < record["promptTokens"] + 400
    finally:
        await ed.client.shutdown_session()
        await ed.client.stop()


async def test_engine_killed_mid_stream(gguf: Path, bundled: Path, tmp_path: Path):
    llama = LlamaServer(gguf, tmp_path / "llama.log").start()
    revived = LlamaServer(gguf, tmp_path / "revived.log", port=llama.port)
    ed = await start(bundled, *remote_args(llama.url), init=UNTIL_CUT)
    try:
        doc = ed.open("file:///work/remote_killed.py", LONG)
        request = ed.inline(doc, 1, 4)
        await ed.first_partial(request)
        llama.kill()
        result = await request.result()
        shown = ed.partials(request)[-1]
        assert shown["done"] and result.items[0].insert_text == shown["text"] != ""  # what was streamed
        record = await ed.record(request)
        assert record["stopReason"] == "error"
        for column in (4, 5, 6):  # keystrokes while it is down: nothing, at once, and no more messages
            ed.insert(doc, len("VALUES = [\n") + column, "\u00a7", line=1, character=column)
            assert await ed.inline(doc, 1, column + 1).result() is None
        stats = (await ed.stats())["engine"]
        assert stats["reachable"] is False and stats["lastError"]
        assert [m.type for m in ed.client.messages] == [types.MessageType.Warning]
        assert "the completion endpoint failed" in ed.client.messages[0].message
        # The editors' status says so, once for the outage, with the same reason.
        down = {"backend": "remote", "endpoint": llama.url, "reachable": False, "error": stats["lastError"]}
        assert ed.statuses == [down]

        revived.start()  # back on the same port

        async def answered() -> bool:
            result = await ed.inline(doc, 1, 7).result()
            return result is not None and result.items[0].insert_text != ""

        await wait_for(answered, timeout=40)
        assert (await ed.stats())["engine"]["reachable"] is True
        assert ed.client.messages[-1].type == types.MessageType.Info
        assert "working again" in ed.client.messages[-1].message and len(ed.client.messages) == 2
        assert ed.statuses == [down, {**down, "reachable": True, "error": None}]
    finally:
        await ed.client.shutdown_session()
        await ed.client.stop()
        llama.kill()
        revived.kill()


async def test_nothing_listening(bundled: Path, tmp_path: Path):
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "server.log"
    ed = await start(bundled, *remote_args(url), "--log-file", str(log), "--log-level", "warning")
    try:
        doc = ed.open("file:///work/remote_down.py", BODY)
        for _ in range(3):
            assert await ed.inline(doc, LINE, COLUMN).result() is None
        # The outage is logged when it begins; the requests it refuses add nothing at warning level
        # (an editor such as Neovim records every stderr line of its server as an error).
        lines = log.read_text().splitlines()
        assert not [line for line in lines if "not submitted" in line], lines
        assert any("remote endpoint failed" in line for line in lines), lines
        stats = (await ed.stats())["engine"]
        assert (stats["reachable"], stats["lastError"]) == (False, f"nothing is listening at {url}")
        assert [(m.type, m.message) for m in ed.client.messages] == [
            (
                types.MessageType.Warning,
                f"dscoder: the completion endpoint failed: nothing is listening at {url}",
            )
        ]
        down = {"backend": "remote", "endpoint": url, "reachable": False}
        assert ed.statuses == [{**down, "error": f"nothing is listening at {url}"}]
    finally:
        await ed.client.shutdown_session()
        await ed.client.stop()
