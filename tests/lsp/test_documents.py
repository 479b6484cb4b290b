"""The server's own documents: LSP line breaks only, incremental line index, positions in all encodings,
work per keystroke bounded by the edit, and strict sync (invalid changes refused as a whole)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_dscoder.documents import Document, Documents
from lsp_dscoder.errors import DocumentNotOpenError, DocumentOutOfSyncError, DocumentSyncError
from lsp_dscoder.positions import Encoding, LineIndex, Scan, position_at
from tests.lsp.client import Editor, start

URI = "file:///work/a.py"
BODY = "def main(args):\n    \n"


def change(sl: int, sc: int, el: int, ec: int, text: str) -> types.TextDocumentContentChangePartial:
    r = types.Range(start=types.Position(line=sl, character=sc), end=types.Position(line=el, character=ec))
    return types.TextDocumentContentChangePartial(range=r, text=text)


def whole(text: str) -> types.TextDocumentContentChangeWholeDocument:
    return types.TextDocumentContentChangeWholeDocument(text=text)


def starts_of(text: str) -> list[int]:
    return [int(s) for s in LineIndex(text, Scan()).starts]


def test_only_lsp_line_breaks_split_lines():
    doc = Document(URI, "python", 1, "import os\n\x0c\ndef f():\x0b\x85\u2028\u2029 pass\r\nx\ry")
    assert starts_of(doc.text) == [0, 10, 12, 31, 33]
    doc.apply(2, [change(2, 0, 2, 0, "X")], Encoding.UTF16)
    assert doc.text.startswith("import os\n\x0c\nXdef f():\x0b\x85\u2028\u2029 pass\r\n")
    doc.apply(3, [change(2, 9, 2, 9, "Y")], Encoding.UTF16)  # after "Xdef f():", before "\x0b"
    assert doc.text.split("\n")[2] == "Xdef f():Y\x0b\x85\u2028\u2029 pass\r"
    assert doc.locate(4, 1, Encoding.UTF16) == (len(doc.text), 1)


def test_crlf_joined_and_split_by_edits():
    doc = Document(URI, None, 1, "a\rb")
    assert starts_of(doc.text) == [0, 2]
    doc.apply(2, [change(0, 1, 1, 0, "\r\n")], Encoding.UTF16)  # replace "\r" by "\r\n"
    doc.apply(3, [change(1, 0, 1, 0, "\n")], Encoding.UTF16)  # "a\r\n\nb"
    assert doc.text == "a\r\n\nb" and [int(s) for s in doc.index.starts] == [0, 3, 4]
    doc.apply(4, [change(0, 1, 1, 0, "\r")], Encoding.UTF16)  # "a\r\nb": the new "\r" meets the "\n"
    assert doc.text == "a\r\nb" and [int(s) for s in doc.index.starts] == [0, 3]


@pytest.mark.parametrize("encoding", list(Encoding))
def test_random_edits_keep_text_and_index_exact(encoding):
    rng = random.Random(7)
    alphabet = ["a", "b", " ", "\n", "\r", "\r\n", "😀", "你", "é", "\x0c", "\u2028", "\ud800"]
    reference = "".join(rng.choice(alphabet) for _ in range(200))
    doc = Document(URI, "python", 0, reference)
    reference = doc.text  # sanitised
    assert "\ud800" not in reference
    for version in range(1, 400):
        a = rng.randint(0, len(reference))
        b = rng.randint(a, min(len(reference), a + 5))
        if reference[a - 1 : a + 1] == "\r\n" or reference[b - 1 : b + 1] == "\r\n":
            continue  # not a position: between "\r" and "\n"
        new = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
        (sl, sc), (el, ec) = position_at(reference, a, encoding), position_at(reference, b, encoding)
        doc.apply(version, [change(sl, sc, el, ec, new)], encoding)
        reference = reference[:a] + new.replace("\ud800", "\ufffd") + reference[b:]
        assert doc.text == reference
        assert [int(s) for s in doc.index.starts] == starts_of(reference)
    for offset in range(len(reference) + 1):
        if reference[offset - 1 : offset + 1] == "\r\n":
            continue
        line, character = doc.position_at(offset, encoding)
        assert (line, character) == position_at(reference, offset, encoding)
        assert doc.locate(line, character, encoding) == (offset, character)


def test_positions_inside_a_character_and_past_the_line_end():
    doc = Document(URI, None, 1, "a😀b\nxy")
    assert doc.locate(0, 2, Encoding.UTF16) == (1, 1)  # inside the surrogate pair: before the emoji
    assert doc.locate(0, 3, Encoding.UTF16) == (2, 3)
    assert doc.locate(0, 3, Encoding.UTF8) == (1, 1)  # inside the emoji's 4 bytes
    assert doc.locate(0, 99, Encoding.UTF16) == (3, 4)  # clamped to the line end
    assert doc.locate(1, 99, Encoding.UTF32) == (6, 2)


def test_typing_on_a_line_keeps_every_position_exact_while_the_lines_below_move():
    # Edits on one line leave the move of the lines below pending; edits elsewhere, deletions that
    # reach a line break, and inserted breaks apply it. Every step is checked against a fresh index.
    reference = "ab\ncd\r\nef\rgh\n\nij"
    doc = Document(URI, "python", 0, reference)
    steps = [  # (line, start character, end character, new text): each on the line it names
        (1, 2, 2, "x"),
        (1, 3, 3, "yy"),
        (1, 0, 0, "z"),  # at the line's start
        (1, 1, 3, ""),  # a deletion within the line
        (1, 3, 3, "😀"),
        (3, 1, 1, "q"),  # another line: the pending move is applied first
        (3, 0, 2, ""),
        (1, 2, 2, "\r"),  # a break typed on a line with "\r\n" after it
        (0, 2, 2, "\n"),
        (6, 0, 0, "w"),  # the empty line
    ]
    for version, (line, sc, ec, new) in enumerate(steps, start=1):
        a = doc.locate(line, sc, Encoding.UTF16)[0]
        b = doc.locate(line, ec, Encoding.UTF16)[0]
        doc.apply(version, [change(line, sc, line, ec, new)], Encoding.UTF16)
        reference = reference[:a] + new + reference[b:]
        assert doc.text == reference
        assert [int(s) for s in doc.index.starts] == starts_of(reference)
        for offset in range(len(reference) + 1):
            if reference[offset - 1 : offset + 1] == "\r\n":
                continue
            assert doc.position_at(offset, Encoding.UTF16) == position_at(reference, offset, Encoding.UTF16)
    assert reference == "ab\n\nzx\ry😀y\r\nef\rh\nw\nij"


def test_keystroke_work_is_bounded_by_the_edit_not_the_document():
    lines = [f"    value_{i} = compute({i}, 'ü😀')  # comment\n" for i in range(200_000)]
    doc = Document(URI, "python", 1, "".join(lines))
    assert doc.scan.chars == 2 * len(doc.text)  # opening: sanitize + line index, once
    line = 100_000
    column = len("    value_100000 = comp")
    for version, ch in enumerate("ute_more(", start=2):
        before = doc.scan.chars
        doc.apply(version, [change(line, column, line, column, ch)], Encoding.UTF16)
        at = doc.locate(line, column + 1, Encoding.UTF16)
        doc.position_at(at[0], Encoding.UTF16)
        column += 1
        # The edit's text (twice: sanitize, breaks), its window, and the line before the cursor (three times).
        assert doc.scan.chars - before <= 3 + 3 * 2 * (column + 1) + 2
    assert doc.text.split("\n")[line] == "    value_100000 = compute_more(ute(100000, 'ü😀')  # comment"
    before = doc.scan.chars
    doc.apply(20, [change(5, 0, 150_000, 0, "")], Encoding.UTF16)  # a large deletion scans nothing big
    assert doc.scan.chars - before < 100 and doc.index.line_count == 200_001 - 149_995


def test_invalid_changes_are_refused_whole_and_the_document_goes_out_of_sync():
    docs = Documents()
    docs.open(URI, "python", 1, "abc\ndef\n")
    doc = docs.get(URI)
    cases = [
        (2, [change(0, 0, 0, 0, "X"), change(1, 2, 1, 0, "Y")], "change 1: reversed range (1,2)-(1,0)"),
        (2, [change(0, 0, 0, 0, "X"), change(3, 0, 3, 0, "Y")], "line 3 is past the end of the document"),
        (1, [change(0, 0, 0, 0, "X")], "version 1 does not follow version 1"),
        (0, [change(0, 0, 0, 0, "X")], "version 0 does not follow version 1"),
        ("3", [change(0, 0, 0, 0, "X")], "version '3' is not an integer"),
        (True, [change(0, 0, 0, 0, "X")], "version True is not an integer"),
        (2.5, [change(0, 0, 0, 0, "X")], "version 2.5 is not an integer"),
    ]
    for version, changes, message in cases:
        with pytest.raises(DocumentSyncError, match=message.replace("(", r"\(").replace(")", r"\)")):
            docs.change(URI, version, changes, Encoding.UTF16)  # type: ignore[arg-type]
        assert (doc.text, doc.version) == ("abc\ndef\n", 1)  # nothing of it applied
        with pytest.raises(DocumentOutOfSyncError, match="reopen it"):
            docs.get(URI)
        assert not docs.is_current(doc, 1)
        docs.open(URI, "python", 1, "abc\ndef\n")  # the editor's whole text again
        doc = docs.get(URI)
    # A later incremental change cannot repair it; a full-text change does.
    docs.refuse(URI, "version '4' is not an integer")
    with pytest.raises(DocumentSyncError, match="still out of sync"):
        docs.change(URI, 5, [change(0, 0, 0, 0, "X")], Encoding.UTF16)
    assert docs.change(URI, 6, [whole("new\n"), change(1, 0, 1, 0, "x")], Encoding.UTF16).text == "new\nx"
    assert docs.is_current(docs.get(URI), 6)


def test_reopen_replaces_close_forgets():
    docs = Documents()
    assert docs.open(URI, "python", 3, "one") is None
    first = docs.get(URI)
    assert docs.open(URI, "python", 3, "two") is first
    assert not docs.is_current(first, 3) and docs.is_current(docs.get(URI), 3)
    assert docs.close(URI) and not docs.close(URI) and len(docs) == 0
    with pytest.raises(DocumentNotOpenError):
        docs.change(URI, 4, [whole("x")], Encoding.UTF16)


def test_a_five_megabyte_line_costs_a_keystroke_nothing_big():
    doc = Document(URI, "python", 1, "x = '" + "a" * 5_000_000 + "'")
    before = doc.scan.chars
    for version, column in enumerate(range(5_000_006, 5_000_016), start=2):
        doc.apply(version, [change(0, column, 0, column, "b")], Encoding.UTF16)
        doc.position_at(doc.locate(0, column + 1, Encoding.UTF16)[0], Encoding.UTF16)
    assert doc.scan.chars - before <= 10 * 4  # ASCII line: positions are arithmetic, not scans
    assert doc.text.endswith("'" + "b" * 10)


# The real server (stdio), debug log to a file: its prompts show the text it holds.


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_model, tmp_path_factory):
    log_file = tmp_path_factory.mktemp("log") / "server.log"
    ed = await start(tiny_model, "--log-file", str(log_file), "--log-level", "debug")
    ed.log_file = log_file  # type: ignore[attr-defined]
    yield ed
    await ed.client.shutdown_session()
    await ed.client.stop()


def raw(editor: Editor, message: dict) -> None:
    body = json.dumps(message).encode()
    editor.client._server.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def did_change(uri: str, version: object, *changes: dict) -> dict:
    params = {"textDocument": {"uri": uri, "version": version}, "contentChanges": list(changes)}
    return {"jsonrpc": "2.0", "method": "textDocument/didChange", "params": params}


def insert_at(line: int, character: int, text: str, end: tuple[int, int] | None = None) -> dict:
    end_line, end_character = end or (line, character)
    return {
        "range": {
            "start": {"line": line, "character": character},
            "end": {"line": end_line, "character": end_character},
        },
        "text": text,
    }


@pytest.mark.asyncio(loop_scope="module")
async def test_the_server_keeps_form_feeds_and_separators_inside_lines(server):
    doc = server.open("file:///work/ff.py", "import os\n\x0c\ndef f():\u2028\x85\n    ")
    server.insert(doc, len("import os\n\x0c\n"), "X", line=2, character=0)
    request = server.inline(doc, 3, 4)
    await request.result()
    assert (await server.record(request))["version"] == 2
    prompts = [line for line in server.log_file.read_text().splitlines() if " prompt (" in line]
    assert "'import os\\n\\x0c\\nXdef f():\\u2028\\x85\\n'" in prompts[-1]  # "    ": healed


async def next_message(editor: Editor, count: int) -> str:
    async def wait() -> str:
        while len(editor.client.messages) <= count:
            await asyncio.sleep(0.01)
        return editor.client.messages[count].message

    return await asyncio.wait_for(wait(), 30)


@pytest.mark.asyncio(loop_scope="module")
async def test_invalid_sync_is_refused_with_a_message_and_a_reopen_recovers(server):
    uri = "file:///work/strict.py"
    cases = [
        (did_change(uri, "3", insert_at(0, 0, "X")), "version '3' is not an integer"),
        (did_change(uri, True, insert_at(0, 0, "X")), "version True is not an integer"),
        (did_change(uri, 1.5, insert_at(0, 0, "X")), "version 1.5 is not an integer"),
        (did_change(uri, 2, insert_at(1, 4, "X", end=(1, 0))), "change 0: reversed range (1,4)-(1,0)"),
        (
            did_change(uri, 2, insert_at(7, 0, "X")),
            "change 0: range (7,0)-(7,0): line 7 is past the end of the document (3 lines)",
        ),
        (did_change(uri, 1, insert_at(0, 0, "X")), "version 1 does not follow version 1"),
    ]
    for message, reason in cases:
        doc = server.open(uri, BODY)
        seen = len(server.client.messages)
        raw(server, message)
        assert await next_message(server, seen) == (
            f"dscoder: textDocument/didChange for {uri} refused: {reason}; "
            "no suggestions for it until it is reopened or its whole text is sent"
        )
        request = server.inline(doc, 1, 4)
        assert await request.result() is None
        assert (await server.stats())["requests"]["recent"][-1]["requestId"] != request.id  # not served
    doc = server.open(uri, BODY)
    server.insert(doc, len(BODY), "x", line=2, character=0)
    request = server.inline(doc, 2, 1)
    await request.result()
    assert (await server.record(request))["version"] == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_did_open_answers_requests_for_the_old_text_with_null(server):
    uri = "file:///work/reopen.py"
    doc = server.open(uri, BODY)
    settings = types.DidChangeConfigurationParams(settings={"dscoder": {"debounceMs": 300}})
    server.client.workspace_did_change_configuration(settings)
    try:
        request = server.inline(doc, 1, 4)  # waits 300 ms before it starts
        server.open(uri, "x = 1\n")  # the same version, another text
        assert await request.result() is None
    finally:
        settings = types.DidChangeConfigurationParams(settings={"dscoder": {"debounceMs": 0}})
        server.client.workspace_did_change_configuration(settings)
    assert (await server.record(request))["uri"] == uri


def test_closing_a_document_lets_its_text_go():
    import gc
    import weakref

    docs = Documents()
    docs.open(URI, "python", 1, "x" * 5_000_000)
    ref = weakref.ref(docs.get(URI))
    docs.change(URI, 2, [change(0, 0, 0, 0, "y")], Encoding.UTF16)
    docs.close(URI)
    gc.collect()
    assert ref() is None and len(docs) == 0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_cancel_after_the_answer_is_not_a_warning(server):
    doc = server.open("file:///work/late-cancel.py", BODY)
    request = server.inline(doc, 1, 4)
    await request.result()
    server.cancel(request)  # editors cancel as the user types on, answered or not
    await server.stats()  # after the cancel, in order
    assert "Cancel notification for unknown message id" not in server.log_file.read_text()
