"""The Neovim plugin in a real headless Neovim against the real server on the tiny checkpoint.

The tiny model writes deterministic gibberish, so every expectation is derived from what the server sent
(recorded by the probe in conftest.py), never guessed.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tests.editors.conftest import PLUGIN_DIR, Editor

pytestmark = pytest.mark.slow

# A Python file; the cursor goes at the end of the last line.
SOURCE = ["import os", "", "", "def main(path):", "    parts = os.path.split("]


def keys(text: str) -> str:
    """`nvim_input` notation for literal text."""
    return text.replace("<", "<lt>")


def typeable(ch: str) -> bool:
    return ch.isascii() and ch.isprintable()


def inserted(lines: list[str], row: int, col: int, text: str) -> tuple[list[str], tuple[int, int]]:
    """`lines` with `text` inserted at (row, byte col), and the cursor after it."""
    line = lines[row].encode()
    new = (line[:col].decode() + text + line[col:].decode()).split("\n")
    out = lines[:row] + new + lines[row + 1 :]
    if len(new) == 1:
        return out, (row, col + len(text.encode()))
    return out, (row + len(new) - 1, len(new[-1].encode()) - len(line[col:]))


# Lua's %w and %s are ASCII; bytes >= 0x80 count as word characters in the plugin.
_WORD = r"[A-Za-z0-9_\u0080-\U0010ffff]"
_OTHER = r"[^A-Za-z0-9_\u0080-\U0010ffff \t\n\r\v\f]"


def next_word(text: str) -> str:
    """The plugin's accept-word rule (`:help lsp_dscoder.accept_word()`)."""
    for pattern in (r"\n[ \t]*", rf"[ \t]*{_WORD}+", rf"[ \t]*{_OTHER}+", r"[ \t]+"):
        m = re.match(pattern, text)
        if m:
            return m.group(0)
    return text


def next_line(text: str) -> str:
    if text.startswith("\n"):
        return "\n" + text[1:].split("\n", 1)[0]
    return text.split("\n", 1)[0]


def final_text(entry: dict) -> str:
    """What the server settled on for a request: the text of its last (`done`) partial."""
    return entry["partials"][-1]["text"]


def start_suggestion(ed: Editor, lines: list[str] = SOURCE) -> dict:
    """Open `lines`, append at the end of the last line, and wait for the suggestion to settle."""
    row = len(lines) - 1
    ed.open(lines, row, 0)
    ed.type("A")
    assert ed.mode() == "i"
    entry = ed.wait_settled()
    assert entry["position"]["line"] == row
    text = final_text(entry)
    assert text, "the tiny model suggested nothing here; pick another SOURCE"
    ghost = ed.wait_for(ed.ghost, "ghost text")
    assert ghost == {"row": row, "col": len(lines[row].encode()), "text": text, "marks": 1}
    assert ed.lines() == lines
    return entry


def assert_only_current_rendered(ed: Editor) -> None:
    """Every partial or response that changed the ghost text belonged to the buffer's version and
    cursor line of then, and no error response (a cancelled request) changed it."""
    renders = ed.renders()
    for m in ed.probe("partials") + ed.probe("responses"):
        if m["after"] > m["before"]:
            r = renders[m["after"] - 1]
            assert m.get("err") is None, (m, r)
            assert r["version"] == m["version"], (m, r)
            assert r["cursor"][0] == m["position"]["line"], (m, r)


def test_ghost_text_grows_with_the_partials(editor: Editor) -> None:
    entry = start_suggestion(editor)
    renders = editor.renders()
    shown = []
    for p in entry["partials"]:
        assert p["version"] == entry["version"]
        assert p["position"] == entry["position"]
        if p["after"] > p["before"]:
            r = renders[p["after"] - 1]
            if p["text"]:
                assert r["op"] == "show" and r["text"] == p["text"]
                shown.append(r["text"])
            else:
                assert r["op"] == "clear"
    assert len(set(shown)) >= 2, f"expected the ghost text to grow over several partials: {shown}"
    for a, b in itertools.pairwise(shown):
        assert b.startswith(a)
    assert shown[-1] == final_text(entry)
    # The response agrees with the stream: it is the suggestion, or its first line.
    items = entry["response"]["result"]["items"]
    assert final_text(entry).startswith(items[0]["insertText"])
    assert editor.lines() == SOURCE
    assert_only_current_rendered(editor)


def test_typing_a_continuing_character_keeps_the_ghost_text(editor: Editor) -> None:
    text = final_text(start_suggestion(editor))
    assert typeable(text[0]), f"first character {text[0]!r} cannot be typed; pick another SOURCE"
    start = len(editor.renders())
    tick = editor.tick()
    editor.type(keys(text[0]))
    first = editor.wait_for(lambda: editor.renders(start), "a render after the keystroke")[0]
    assert first["op"] == "show" and first["tick"] > tick
    assert first["text"] == text[1:]
    row = len(SOURCE) - 1
    assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + text[0]]
    entry = editor.wait_settled()
    assert entry["version"] == editor.version()
    if final_text(entry):
        ghost = editor.wait_for(editor.ghost, "ghost text")
        assert ghost["text"] == final_text(entry)
        assert (ghost["row"], ghost["col"]) == (row, len(SOURCE[-1]) + 1)
    assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + text[0]]
    assert_only_current_rendered(editor)


def test_a_diverging_character_clears_it_and_a_new_suggestion_follows(editor: Editor) -> None:
    text = final_text(start_suggestion(editor))
    typed = "Q" if text[0] != "Q" else "Z"
    start = len(editor.renders())
    editor.type(typed)
    first = editor.wait_for(lambda: editor.renders(start), "a render after the keystroke")[0]
    assert first["op"] == "clear" and first["ghost"] is None
    expected = [*SOURCE[:-1], SOURCE[-1] + typed]
    assert editor.lines() == expected
    entry = editor.wait_settled()
    assert entry["version"] == editor.version()
    assert entry["position"] == {"line": len(SOURCE) - 1, "character": len(SOURCE[-1]) + 1}
    new = final_text(entry)
    assert new, "the server suggested nothing after the diverging key"
    ghost = editor.wait_for(editor.ghost, "the new ghost text")
    assert ghost == {"row": len(SOURCE) - 1, "col": len(SOURCE[-1]) + 1, "text": new, "marks": 1}
    assert editor.lines() == expected
    assert_only_current_rendered(editor)


def test_fast_typing_shows_only_the_latest_request(editor: Editor) -> None:
    start_suggestion(editor)
    typed = ""
    for ch in "Qx_7":  # each key a request that cancels the one before
        editor.type(ch)
        typed += ch
    entry = editor.wait_settled()
    assert entry["position"] == {"line": len(SOURCE) - 1, "character": len(SOURCE[-1]) + len(typed)}
    # Each request superseded by the next key was answered already or cancelled by the plugin.
    requests = editor.probe("requests")
    superseded = {r["id"] for r in requests[-len(typed) - 1 : -1]}
    answered = {r["id"] for r in editor.probe("responses")}
    assert superseded <= answered | set(editor.probe("cancelled")), (superseded, answered)
    if final_text(entry):
        assert editor.ghost()["text"] == final_text(entry)
    assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + typed]
    assert_only_current_rendered(editor)


def test_accept_inserts_exactly_the_suggestion(editor: Editor) -> None:
    text = final_text(start_suggestion(editor))
    assert "\n" in text, "expected a multi-line suggestion here; pick another SOURCE"
    row, col = editor.cursor()
    editor.type("<Tab>")
    want_lines, want_cursor = inserted(SOURCE, row, col, text)
    assert editor.lines() == want_lines
    assert editor.cursor() == want_cursor
    assert editor.mode() == "i"
    # Whatever comes next is a new suggestion at the new cursor, never a leftover.
    ghost = editor.ghost()
    assert ghost is None or (ghost["row"], ghost["col"]) == want_cursor


def test_accept_word_then_lines(editor: Editor) -> None:
    text = final_text(start_suggestion(editor))
    lines, cursor = SOURCE, editor.cursor()
    word = next_word(text)
    start = len(editor.renders())
    editor.type("<C-Right>")
    lines, cursor = inserted(lines, *cursor, word)
    assert editor.lines() == lines
    assert editor.cursor() == cursor
    first = editor.wait_for(lambda: editor.renders(start), "a render after accepting a word")[0]
    assert first["op"] == "show" and first["text"] == text[len(word) :]
    assert (first["ghost"]["row"], first["ghost"]["col"]) == cursor

    # Accept line by line until a line break has been accepted (a line starting with one).
    for _ in range(3):
        rest = final_text(editor.wait_settled())
        assert rest, "nothing left to accept"
        assert editor.ghost()["text"] == rest
        line = next_line(rest)
        editor.type("<C-Down>")
        lines, cursor = inserted(lines, *cursor, line)
        assert editor.lines() == lines
        assert editor.cursor() == cursor
        if line.startswith("\n"):
            break
    else:
        pytest.fail("no line break in the suggestion; pick another SOURCE")


def test_dismiss_trigger_and_tab_falling_through(editor: Editor) -> None:
    start_suggestion(editor)
    requests = len(editor.probe("requests"))
    editor.type("<C-]>")
    assert editor.ghost() is None
    assert editor.lines() == SOURCE
    # No request is sent until the next change, and nothing comes back to show.
    editor.wait_for(
        lambda: editor.lua("return require('lsp_dscoder').status_info().state") == "idle", "no request"
    )
    assert len(editor.probe("requests")) == requests
    assert editor.ghost() is None
    # The trigger key asks at once (an invoked request), the next change asks again.
    editor.type("<M-\\>")
    entry = editor.wait_settled()
    assert editor.probe("requests")[-1]["kind"] == 1  # InlineCompletionTriggerKind.Invoked
    assert editor.ghost()["text"] == final_text(entry)
    editor.type("<C-]>")
    assert editor.ghost() is None
    # Without a suggestion <Tab> is an ordinary Tab.
    editor.type("<Tab>")
    assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + "\t"]
    assert editor.probe("requests")[-1]["kind"] == 2  # Automatic


def test_leaving_insert_mode_clears_it_and_the_buffer_holds_only_what_was_typed(editor: Editor) -> None:
    text = final_text(start_suggestion(editor))
    typed = "Q" if text[0] != "Q" else "Z"
    editor.type(typed)
    editor.wait_settled()
    editor.type("<Esc>")
    assert editor.mode() == "n"
    assert editor.ghost() is None
    assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + typed]
    editor.type("u")
    assert editor.lines() == SOURCE


def test_emoji_and_cjk_before_the_cursor(editor: Editor) -> None:
    lines = ["import os", "", "", 'def main(path="héllo 你好 😀"):', '    print("你好 😀", os.path.join(']
    entry = start_suggestion(editor, lines)
    row, col = len(lines) - 1, len(lines[-1].encode())
    encoding = editor.lua("return vim.lsp.get_clients({name = 'lsp_dscoder'})[1].offset_encoding")
    width = {"utf-8": 1, "utf-16": 2, "utf-32": 4}[encoding]
    codec = {"utf-8": "utf-8", "utf-16": "utf-16-le", "utf-32": "utf-32-le"}[encoding]
    assert entry["position"] == {"line": row, "character": len(lines[-1].encode(codec)) // width}
    assert editor.cursor() == (row, col)
    text = final_text(entry)
    editor.type("<Tab>")
    want_lines, want_cursor = inserted(lines, row, col, text)
    editor.wait_for(lambda: editor.lines() == want_lines, "the accepted text in the buffer")
    assert editor.cursor() == want_cursor


def test_stale_partials_are_dropped(editor: Editor) -> None:
    entry = start_suggestion(editor)
    text = final_text(entry)
    send = """
        local params = ...
        local client = vim.lsp.get_clients({name = 'lsp_dscoder'})[1]
        client.handlers['dscoder/partialCompletion'](nil, params, {client_id = client.id, method = 'x'})
    """
    uri = editor.lua("return vim.uri_from_bufnr(0)")
    good = {
        "requestId": entry["id"],
        "uri": uri,
        "version": entry["version"],
        "position": entry["position"],
        "text": text + "STALE",
        "done": False,
    }
    moved = dict(entry["position"], character=entry["position"]["character"] - 1)
    for stale in (
        dict(good, version=entry["version"] - 1),
        dict(good, position=moved),
        dict(good, requestId=entry["id"] - 1),
        dict(good, uri=uri + "x"),
    ):
        editor.lua(send, stale)
        assert editor.ghost()["text"] == text, stale
    editor.lua(send, good)
    assert editor.ghost()["text"] == text + "STALE"
    assert editor.lines() == SOURCE


def test_status_reports_loading_idle_and_ttft(editor: Editor) -> None:
    start_suggestion(editor)
    statuses = editor.probe("statuses")
    loading = [i for i, s in enumerate(statuses) if s.startswith("dscoder: loading")]
    assert loading, statuses
    assert any(s.startswith("dscoder: idle") for s in statuses[loading[-1] :]), statuses
    assert any(s.startswith("dscoder: generating") for s in statuses), statuses
    info = editor.lua("return require('lsp_dscoder').status_info()")
    assert info["state"] in ("idle", "generating")
    assert 0 < info["ttft_ms"] < 30_000
    assert re.search(r"TTFT \d+ ms", editor.lua("return require('lsp_dscoder').status()"))


def test_setup_rejects_a_bad_option(editor: Editor) -> None:
    err = editor.lua(
        "local ok, err = pcall(require('lsp_dscoder.config').resolve, {keymaps = {accept = 3}}); return err"
    )
    assert "keymaps.accept must be a key string or false, got 3" in err
    err = editor.lua(
        "local ok, err = pcall(require('lsp_dscoder.config').resolve, {filetype = {'python'}}); return err"
    )
    assert "option filetype must be one of cmd, init_options, filetypes, enabled, root_markers," in err


def test_setup_again_with_filetypes_and_an_enabled_predicate(editor: Editor) -> None:
    bufnr = editor.open(SOURCE, 0, 0)
    cmd = editor.lua("return require('lsp_dscoder').config().cmd")
    attached = "return #vim.lsp.get_clients({bufnr = ..., name = 'lsp_dscoder'}) > 0"
    tab_desc = "return vim.fn.maparg('<Tab>', 'i', false, true).desc or vim.NIL"
    try:
        editor.lua(
            """
            require('lsp_dscoder').setup({
              cmd = ..., root_markers = {}, filetypes = { 'lua' },
              enabled = function(b) return not vim.api.nvim_buf_get_name(b):find('skip') end,
            })
            """,
            cmd,
        )
        # The Python buffer no longer qualifies: detached, its keymaps gone.
        editor.wait_for(lambda: not editor.lua(attached, bufnr), "the Python buffer to be detached")
        assert editor.lua(tab_desc) != "lsp-dscoder: accept"
        for name, want in (("other.py", False), ("skip.lua", False), ("init.lua", True)):
            path = editor.workdir / name
            path.write_text("local x = 1\n", encoding="utf-8")
            editor.nvim.command(f"edit {path}")
            assert editor.lua(attached, editor.nvim.current.buffer.number) == want, name
        assert editor.lua(tab_desc) == "lsp-dscoder: accept"
        # `:set filetype=` to one that gets no suggestions detaches the buffer, and back attaches it.
        lua_buf = editor.nvim.current.buffer.number
        editor.nvim.command("set filetype=python")
        editor.wait_for(lambda: not editor.lua(attached, lua_buf), "the buffer to be detached")
        assert editor.lua(tab_desc) != "lsp-dscoder: accept"
        editor.nvim.command("set filetype=lua")
        editor.wait_for(lambda: editor.lua(attached, lua_buf), "the buffer to be attached again")
    finally:
        editor.lua("require('lsp_dscoder').setup({ cmd = ..., root_markers = {} })", cmd)


def test_keys_fall_through_to_the_mappings_they_shadow(editor: Editor) -> None:
    editor.lua(
        """
        vim.keymap.set('i', '<C-Right>', 'WORD')
        vim.keymap.set('i', '<C-Down>', function() vim.api.nvim_put({ 'CB' }, 'c', false, true) end)
        """
    )
    try:
        start_suggestion(editor)
        editor.type("<C-]>")
        assert editor.ghost() is None
        editor.type("<C-Right>")  # nothing shown: the global mapping's text
        assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + "WORD"]
        editor.type("<C-]>")  # hides or cancels whatever the change asked for
        assert editor.ghost() is None
        editor.type("<C-Down>")  # the global mapping's callback
        assert editor.lines() == [*SOURCE[:-1], SOURCE[-1] + "WORDCB"]
    finally:
        editor.lua("vim.keymap.del('i', '<C-Right>'); vim.keymap.del('i', '<C-Down>')")


def test_help_doc_has_its_tags(editor: Editor, tmp_path: Path) -> None:
    doc = tmp_path / "doc"
    doc.mkdir()
    (doc / "lsp-dscoder.txt").write_bytes((PLUGIN_DIR / "doc" / "lsp-dscoder.txt").read_bytes())
    editor.nvim.command(f"helptags {doc}")  # raises on duplicate tags
    editor.nvim.command(f"set runtimepath+={tmp_path}")
    for tag in ("lsp-dscoder", "lsp-dscoder-keymaps", "lsp_dscoder.accept_word()", "lsp-dscoder-native"):
        editor.nvim.command(f"help {tag}")
        assert editor.lua("return vim.fn.expand('%:t')") == "lsp-dscoder.txt", tag
        editor.nvim.command("helpclose")
