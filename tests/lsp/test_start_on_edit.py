"""A keystroke's suggestion starts from its didChange (`startOnEdit`) when the client asks later (as VS Code
does, 50 ms after the last keystroke): the engine has the request before the completion request comes, the
request takes the running generation over, and the session answers exactly what it answers when every
suggestion starts from its request. A request read with its didChange starts as before. Real engine (tiny
checkpoint on the CPU), real dispatcher; no clock except the one that decides whether the client asks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lsp_dscoder import completer as completer_mod
from lsp_dscoder.protocol import PARTIAL_COMPLETION, DscoderServer
from lsp_dscoder.settings import parse
from lsp_dscoder.transport import Dispatcher
from tests.lsp.test_keystroke_path import URI, Writes, did_change, send, serve, span

# What each request's record must agree on with and without the early start.
SAME = (
    "source",
    "outcome",
    "promptTokens",
    "reusedTokens",
    "prefilledTokens",
    "generatedTokens",
    "stopReason",
)


async def loaded(tiny_model: Path, **options: Any) -> tuple[DscoderServer, Dispatcher, Writes]:
    ls, dispatch, writes = serve(model=str(tiny_model), device="cpu", responseMode="full", **options)
    assert await ls.host.load(ls.settings, lambda message, percent: None)
    return ls, dispatch, writes


async def ask(ls: DscoderServer, dispatch: Dispatcher, request_id: int, line: int, character: int) -> Any:
    position = {"line": line, "character": character}
    inline = {"textDocument": {"uri": URI}, "position": position, "context": {"triggerKind": 2}}
    send(dispatch, {"id": request_id, "method": "textDocument/inlineCompletion", "params": inline})
    answer = await ls.protocol._request_futures[request_id]
    await asyncio.sleep(0)  # the response is written by the future's callback
    return None if answer is None else [item.insert_text for item in answer.items]


async def edit(
    dispatch: Dispatcher, version: int, line: int, character: int, text: str, turns: int = 2
) -> None:
    """A didChange typing `text`; then `turns` turns of the event loop. Two (one to handle what was read
    with the edit, one what the next poll found) are a request that comes later."""
    change = did_change(version, {"range": span(line, character, line, character), "text": text})
    send(dispatch, {"method": "textDocument/didChange", "params": change})
    for _ in range(turns):
        await asyncio.sleep(0)


async def session(
    ls: DscoderServer, dispatch: Dispatcher, steps: list[tuple[str, int]], turns: int = 2
) -> list[Any]:
    """A first request at (1, 4), then per step: type `text` at column `col` of line 1 and ask at the
    end of what was typed. Returns the answers and the engine's request count after each edit."""
    out = [await ask(ls, dispatch, 1, 1, 4)]
    for version, (text, col) in enumerate(steps, start=2):
        await edit(dispatch, version, 1, col, text, turns)
        out.append(ls.host.stats()["requests"])
        out.append(await ask(ls, dispatch, version, 1, col + len(text)))
    return out


async def test_the_request_takes_over_the_suggestion_its_edit_started(tiny_model: Path) -> None:
    steps = [("Z", 4), ("Q", 5), ("#", 6)]  # none continues a suggestion of the tiny model
    runs = {}
    for on in (True, False):
        ls, dispatch, _ = await loaded(tiny_model, maxTokens=6, startOnEdit=on)
        try:
            before = ls.host.stats()["requests"]
            got = await session(ls, dispatch, steps)
            runs[on] = (got, before, ls.stats.as_dict(8), ls.host.stats()["requests"] - before)
        finally:
            ls.host.close()
    (got_on, before_on, stats_on, sent_on), (got_off, before_off, stats_off, sent_off) = (
        runs[True],
        runs[False],
    )
    assert [a for a in got_on[::2]] == [a for a in got_off[::2]]  # the same answers
    assert got_on[0] is not None and all(got_on[::2])
    # Early: the engine had each keystroke's request once its didChange was dispatched, before the
    # completion request was read; late: only the first request's was there.
    assert got_on[1::2] == [before_on + 2, before_on + 3, before_on + 4]
    assert got_off[1::2] == [before_off + 1, before_off + 2, before_off + 3]
    assert sent_on == sent_off == 4  # one engine request per keystroke either way
    recent_on, recent_off = stats_on["recent"], stats_off["recent"]
    assert [{k: r[k] for k in SAME} for r in recent_on] == [{k: r[k] for k in SAME} for r in recent_off]
    assert [r["source"] for r in recent_on] == ["engine"] * 4
    assert [r["earlyMs"] is not None for r in recent_on] == [False, True, True, True]
    assert all(r["earlyMs"] >= 0 for r in recent_on[1:])
    assert [r["earlyMs"] for r in recent_off] == [None] * 4
    assert (stats_on["counts"]["edit_starts"], stats_on["counts"]["edit_starts_taken"]) == (3, 3)
    assert "edit_starts" not in stats_off["counts"]


@pytest.mark.parametrize("turns", [0, 1], ids=["same read", "next poll"])
async def test_a_request_read_with_its_edit_starts_as_before(tiny_model: Path, turns: int) -> None:
    ls, dispatch, _ = await loaded(tiny_model, maxTokens=6)
    try:
        before = ls.host.stats()["requests"]
        got = await session(ls, dispatch, [("Z", 4), ("Q", 5)], turns=turns)
        assert got[1::2] == [before + 1, before + 2] and got[0] is not None
        assert [r["earlyMs"] for r in ls.stats.as_dict(8)["recent"]] == [None] * 3
        assert "edit_starts" not in ls.stats.counts
    finally:
        ls.host.close()


async def test_a_request_elsewhere_cancels_the_early_start(tiny_model: Path) -> None:
    ls, dispatch, writes = await loaded(tiny_model, maxTokens=6)
    try:
        await ask(ls, dispatch, 1, 1, 4)
        before = ls.host.stats()["requests"]
        await edit(dispatch, 2, 1, 4, "Z")  # the cursor is expected at (1, 5)
        early = ls.completer.sessions[URI].generation
        assert early is not None and early.record is None and ls.host.stats()["requests"] == before + 1
        writes.calls.clear()
        answer = await ask(ls, dispatch, 2, 0, 3)  # the client asks at another place
        assert early.cancelled and early.record is None
        assert ls.host.stats()["requests"] == before + 2
        partials = [m["params"] for m in writes.messages() if m.get("method") == PARTIAL_COMPLETION]
        assert {p["requestId"] for p in partials} == {2}
        assert {(p["position"]["line"], p["position"]["character"]) for p in partials} == {(0, 3)}
        assert answer is None or answer == [partials[-1]["text"]]
        record = ls.stats.as_dict(1)["recent"][-1]
        assert (record["source"], record["earlyMs"]) == ("engine", None)
        assert ls.stats.counts["edit_starts"] == 1 and "edit_starts_taken" not in ls.stats.counts
    finally:
        ls.host.close()


@pytest.mark.parametrize(
    "options",
    [{"startOnEdit": False}, {"debounceMs": 1}],
    ids=["off", "with a debounce"],
)
async def test_no_early_start_when_off_or_debounced(tiny_model: Path, options: dict[str, Any]) -> None:
    ls, dispatch, _ = await loaded(tiny_model, maxTokens=6, **options)
    try:
        await ask(ls, dispatch, 1, 1, 4)
        before = ls.host.stats()["requests"]
        await edit(dispatch, 2, 1, 4, "Z")
        assert ls.host.stats()["requests"] == before
        assert "edit_starts" not in ls.stats.counts
    finally:
        ls.host.close()


async def test_no_early_start_while_the_client_does_not_ask(tiny_model: Path) -> None:
    """Edits of a document no request came for, or none for longer than ASKING_S, start nothing: a
    client that does not show suggestions costs no engine work."""
    ls, dispatch, _ = await loaded(tiny_model, maxTokens=6)
    now = [1000.0]
    ls.stats.clock = lambda: now[0]
    try:
        before = ls.host.stats()["requests"]
        await edit(dispatch, 2, 1, 4, "Z")  # never asked
        assert ls.host.stats()["requests"] == before
        await ask(ls, dispatch, 1, 1, 5)
        now[0] += completer_mod.ASKING_S + 0.001
        await edit(dispatch, 3, 1, 5, "Q")  # asked, but too long ago
        assert ls.host.stats()["requests"] == before + 1
        now[0] += 0.001
        await ask(ls, dispatch, 2, 1, 6)
        await edit(dispatch, 4, 1, 6, "#")  # asked just now
        assert ls.host.stats()["requests"] == before + 3
        # A change of several edits, or of the whole text, leaves no cursor to guess: nothing starts.
        two = did_change(
            5,
            {"range": span(0, 0, 0, 0), "text": "#"},
            {"range": span(1, 0, 1, 0), "text": " "},
        )
        send(dispatch, {"method": "textDocument/didChange", "params": two})
        send(dispatch, {"method": "textDocument/didChange", "params": did_change(6, {"text": "x = 1\n"})})
        assert ls.host.stats()["requests"] == before + 3
    finally:
        ls.host.close()


async def test_an_early_start_no_request_takes_is_stopped(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(completer_mod, "CLAIM_S", 0.0)
    ls, dispatch, _ = await loaded(tiny_model, maxTokens=500, deadlineMs=60_000)
    try:
        await ask(ls, dispatch, 1, 1, 4)
        await edit(dispatch, 2, 1, 4, "Z")
        early = ls.completer.sessions[URI].generation
        assert early is not None and early.record is None
        while not (early.cancelled or early.finished):  # the claim window's timer (0 s: the next turn)
            await asyncio.sleep(0.001)
        assert early.cancelled
        completion = await early.handle.wait()
        assert completion.stats.stop_reason.value == "cancelled"
        assert completion.stats.generated_tokens < 500
        assert ls.stats.counts["edit_starts_unclaimed"] == 1
        # The request that comes after all is started anew, at the same place.
        before = ls.host.stats()["requests"]
        assert await ask(ls, dispatch, 3, 1, 5) is not None
        assert ls.host.stats()["requests"] == before + 1
    finally:
        ls.host.close()


def test_the_setting_is_a_boolean() -> None:
    settings, problems = parse({"startOnEdit": "yes"})
    assert settings.start_on_edit is True
    assert problems == [
        "dscoder: setting 'startOnEdit': expected true or false, got 'yes'; using the default true"
    ]
    assert parse({"startOnEdit": False})[0].start_on_edit is False


async def test_the_request_finds_the_early_start_after_an_emoji(tiny_model: Path) -> None:
    """The edit's end is found in code points, the request's position in UTF-16 units: "😀" is one code
    point and two units, and the request at the unit after it takes the suggestion over."""
    ls, dispatch, _ = await loaded(tiny_model, maxTokens=6)
    try:
        await ask(ls, dispatch, 1, 1, 4)
        before = ls.host.stats()["requests"]
        await edit(dispatch, 2, 1, 4, "😀")
        early = ls.completer.sessions[URI].generation
        assert early is not None and early.record is None
        await ask(ls, dispatch, 2, 1, 6)
        assert ls.host.stats()["requests"] == before + 1
        assert early.record is not None and early.record.request_id == 2
        assert ls.stats.counts["edit_starts_taken"] == 1
    finally:
        ls.host.close()
