"""Keep-warm replays (keep_warm.py): they run while typing, stop after the burst, and change nothing that
the client, the documents, the sessions or the engine would see."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lsp_dscoder import keep_warm
from lsp_dscoder.protocol import DscoderServer
from lsp_dscoder.server import create_server
from lsp_dscoder.settings import DEFAULTS, parse
from lsp_dscoder.transport import Dispatcher
from tests.lsp.test_keystroke_path import TEXT, URI, Writes, did_change, send, span


def serve(**options: Any) -> tuple[DscoderServer, Dispatcher, Writes]:
    ls = create_server(parse(options)[0])
    writes = Writes()
    ls.protocol.set_writer(writes)
    dispatch = Dispatcher(ls, ls.keep_warm.saw)
    init = {"processId": None, "rootUri": None, "capabilities": {"textDocument": {"inlineCompletion": {}}}}
    send(dispatch, {"id": 0, "method": "initialize", "params": init})
    item = {"uri": URI, "languageId": "python", "version": 1, "text": TEXT}
    send(dispatch, {"method": "textDocument/didOpen", "params": {"textDocument": item}})
    writes.calls.clear()
    return ls, dispatch, writes


def inline(line: int, character: int) -> dict[str, Any]:
    position = {"line": line, "character": character}
    return {"textDocument": {"uri": URI}, "position": position, "context": {"triggerKind": 2}}


def keystroke(dispatch: Dispatcher, version: int, line: int, character: int, text: str) -> None:
    change = did_change(version, {"range": span(line, character, line, character), "text": text})
    send(dispatch, {"method": "textDocument/didChange", "params": change})
    send(
        dispatch,
        {"id": version, "method": "textDocument/inlineCompletion", "params": inline(line, character + 1)},
    )


async def session(ls: DscoderServer, dispatch: Dispatcher, replays: int) -> list[Any]:
    """A request, a keystroke that types through its suggestion, one that does not; `replays` keep-warm
    replays after each. Returns each request's answer."""
    answers = []
    send(dispatch, {"id": 1, "method": "textDocument/inlineCompletion", "params": inline(1, 4)})
    for step in range(3):
        if step == 1:
            keystroke(dispatch, 2, 1, 4, answers[0].items[0].insert_text[0])
        elif step == 2:
            keystroke(dispatch, 3, 1, 5, "#")
        answers.append(await ls.protocol._request_futures[step + 1])
        await asyncio.sleep(0.05)  # the response's write, and the generation's end
        for _ in range(replays):
            ls.keep_warm.replay()
    return answers


async def test_replays_change_nothing_the_client_or_the_engine_sees(tiny_model: Path) -> None:
    options = {"model": str(tiny_model), "device": "cpu", "maxTokens": 6, "responseMode": "full"}
    runs = []
    for replays, warm_ms in ((0, 0), (4, 1000)):  # 1000 ms: only the replays the test asks for
        ls, dispatch, writes = serve(**options, keepWarmMs=warm_ms)
        assert await ls.host.load(ls.settings, lambda message, percent: None)
        try:
            answers = await session(ls, dispatch, replays)
            doc = ls.documents.get(URI)
            head = ls.completer.sessions[URI].head
            records = [(r["source"], r["outcome"]) for r in ls.stats.as_dict(8)["recent"]]
            runs.append((answers, writes.messages(), doc.text, doc.version, head, records, ls.host.stats()))
            assert ls.keep_warm.replays == 3 * replays
        finally:
            ls.keep_warm.close()
            ls.host.close()
    plain, warm = runs
    assert warm[0] == plain[0] and warm[0][0] is not None  # the same suggestions
    assert warm[1] == plain[1]  # the same partials and responses, nothing more
    assert warm[2:4] == plain[2:4] == (TEXT[:14] + warm[0][0].items[0].insert_text[0] + "#" + TEXT[14:], 3)
    assert warm[4].ids == plain[4].ids  # the same prompt head
    assert [source for source, _ in warm[5]] == ["engine", "memory", "engine"] and warm[5] == plain[5]
    for key in ("requests", "prefilled_tokens", "reused_tokens"):
        assert warm[6][key] == plain[6][key], key  # no request reached the engine


async def test_replays_run_while_typing_and_stop_after_the_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keep_warm, "WINDOW_S", 0.05)
    ls, dispatch, _ = serve(keepWarmMs=2)
    assert ls.keep_warm.replays == 0
    keystroke(dispatch, 2, 1, 4, "x")
    await asyncio.sleep(0.04)
    during = ls.keep_warm.replays
    assert during >= 3
    await asyncio.sleep(0.1)
    after = ls.keep_warm.replays
    await asyncio.sleep(0.05)
    assert ls.keep_warm.replays == after and ls.keep_warm._timer is None  # the burst is over
    keystroke(dispatch, 3, 1, 5, "y")  # a new burst
    await asyncio.sleep(0.02)
    assert ls.keep_warm.replays > after
    assert ls.documents.get(URI).text == "def f(x):\n    xyreturn x\n"
    ls.keep_warm.close()


async def test_no_replays_when_switched_off() -> None:
    ls, dispatch, _ = serve(keepWarmMs=0)
    keystroke(dispatch, 2, 1, 4, "x")
    await asyncio.sleep(0.03)
    assert ls.keep_warm.replays == 0 and ls.keep_warm._timer is None


async def test_a_replay_of_a_closed_document_is_skipped_and_serving_goes_on() -> None:
    ls, dispatch, _ = serve(keepWarmMs=1000)
    keystroke(dispatch, 2, 1, 4, "x")
    send(dispatch, {"method": "textDocument/didClose", "params": {"textDocument": {"uri": URI}}})
    ls.keep_warm._tick()  # the replay raises inside; the tick logs it and schedules the next
    assert ls.keep_warm.replays == 1 and ls.keep_warm._timer is not None
    item = {"uri": URI, "languageId": "python", "version": 1, "text": TEXT}
    send(dispatch, {"method": "textDocument/didOpen", "params": {"textDocument": item}})
    keystroke(dispatch, 2, 0, 0, "#")
    assert ls.documents.get(URI).text == "#" + TEXT
    ls.keep_warm.close()


async def test_a_malformed_request_is_answered_once_and_not_replayed(tiny_model: Path) -> None:
    ls, dispatch, writes = serve(keepWarmMs=1)
    bad = {
        "textDocument": {"uri": URI},
        "position": {"line": -1, "character": 0},
        "context": {"triggerKind": 2},
    }
    send(dispatch, {"id": 7, "method": "textDocument/inlineCompletion", "params": bad})
    send(dispatch, {"id": 8, "method": "textDocument/inlineCompletion"})  # no params at all
    await asyncio.sleep(0.1)  # a burst of replays every millisecond
    answers = [m for m in writes.messages() if m.get("id") in (7, 8)]
    assert [(m["id"], m["error"]["code"]) for m in answers] == [(7, -32602), (8, -32602)]
    assert ls.keep_warm._bodies == {}  # dropped after the first replay that failed
    ls.keep_warm.close()


async def test_a_replay_at_a_position_past_the_copy_takes_a_new_copy() -> None:
    ls, dispatch, _ = serve(keepWarmMs=1000)
    keystroke(dispatch, 2, 1, 4, "x")
    ls.keep_warm.replay()  # copy taken at version 2; types "x" into it
    ls.keep_warm.replay()  # and deletes it again
    change = did_change(3, {"range": span(2, 0, 2, 0), "text": "\n\n"})
    send(dispatch, {"method": "textDocument/didChange", "params": change})
    keystroke(dispatch, 4, 4, 0, "z")  # line 4 exists in the document, not in the copy
    ls.keep_warm.replay()
    assert ls.keep_warm._shadow_of is None  # the next replay copies the document again
    ls.keep_warm.replay()
    assert ls.keep_warm._shadow_of == URI
    assert ls.documents.get(URI).text == "def f(x):\n    xreturn x\n\n\nz"
    ls.keep_warm.close()


def test_the_setting() -> None:
    assert DEFAULTS.keep_warm_ms == 5
    assert parse({"keepWarmMs": 0}) == (DEFAULTS.__class__(keep_warm_ms=0), [])
    settings, problems = parse({"keepWarmMs": -1})
    assert settings.keep_warm_ms == 5
    expected = "expected an integer in [0, 1000], got -1; using the default 5"
    assert problems == [f"dscoder: setting 'keepWarmMs': {expected}"]


async def test_the_engine_thread_replays_follow_the_setting(tiny_model: Path) -> None:
    ls, dispatch, _ = serve(model=str(tiny_model), device="cpu", keepWarmMs=7)
    assert await ls.host.load(ls.settings, lambda message, percent: None)
    try:
        assert ls.host.engine is not None and ls.host.engine._warm_interval == 0.007  # type: ignore[attr-defined]
        config = {"settings": {"dscoder": {"model": str(tiny_model), "device": "cpu", "keepWarmMs": 0}}}
        send(dispatch, {"method": "workspace/didChangeConfiguration", "params": config})
        await asyncio.sleep(0.05)
        assert ls.settings.keep_warm_ms == 0 and ls.host.engine._warm_interval is None  # type: ignore[attr-defined]
        assert ls.loading is None  # not an engine setting: no reload
    finally:
        ls.keep_warm.close()
        ls.host.close()


async def test_a_paste_is_not_replayed() -> None:
    ls, dispatch, _ = serve(keepWarmMs=1000)
    keystroke(dispatch, 2, 1, 4, "x")
    assert set(ls.keep_warm._bodies) == {"textDocument/didChange", "textDocument/inlineCompletion"}
    keystroke(dispatch, 3, 1, 5, "y" * 5000)
    assert set(ls.keep_warm._bodies) == {"textDocument/inlineCompletion"}  # the paste's didChange is not kept
    ls.keep_warm.replay()
    assert ls.documents.get(URI).text == "def f(x):\n    x" + "y" * 5000 + "return x\n"
    ls.keep_warm.close()
