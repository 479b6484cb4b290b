"""A server that exits on its own, in a real headless Neovim: the plugin starts it again for the buffers
that want it (the model loads again and suggestions come back), at most four times in three minutes; a
server that keeps exiting stays `failed` with the reason. A server stopped on purpose is not restarted.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.editors.conftest import Editor, close_editor, launch_editor, wait_loaded
from tests.editors.test_nvim_setup import DEFAULT_CMD, POINT, POINT_SUGGESTION

pytestmark = pytest.mark.slow

SETUP = "require('lsp_dscoder').setup({ cmd = ... })"
CLIENT_ID = "local c = vim.lsp.get_clients({ name = 'lsp_dscoder', bufnr = 0 })[1]; return c and c.id"

# Answers `initialize`, then exits with code 3 once told `initialized`: a server that crashes at once.
CRASHING_SERVER = textwrap.dedent(
    """
    import json, sys

    def read():
        length = None
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                sys.exit(0)
            if line.strip() == b"":
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(sys.stdin.buffer.read(length))

    while True:
        msg = read()
        if msg.get("method") == "initialize":
            body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"capabilities": {}}}).encode()
            sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
            sys.stdout.buffer.flush()
        elif msg.get("method") == "initialized":
            sys.exit(3)
    """
)


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def messages(ed: Editor) -> str:
    return ed.nvim.command_output("messages")


def test_a_server_that_crashes_is_started_again(nvim_exe: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"  # on the server's command line: finds its process
    ed = launch_editor(nvim_exe, tmp_path, SETUP, [*DEFAULT_CMD, "--log-file", str(log)])
    try:
        ed.open([*POINT[:-1], "        "], 2, 0)
        wait_loaded(ed)
        first = ed.lua(CLIENT_ID)
        [pid] = processes_with(str(log))
        os.kill(pid, signal.SIGKILL)
        second = ed.wait_for(lambda: (c := ed.lua(CLIENT_ID)) not in (None, first) and c, "a new server")
        assert "lsp-dscoder: the server exited (signal 9); starting it again" in messages(ed)
        ed.wait_for(lambda: processes_with(str(log)) not in ([], [pid]), "the new server process")
        ed.wait_for(lambda: ed.lua("return require('lsp_dscoder').status_info().state") == "idle", "idle")
        ed.type("A")
        ed.type("self.")
        ed.wait_for(lambda: (g := ed.ghost()) is not None and g["text"] == POINT_SUGGESTION, "a suggestion")
        assert ed.lua(CLIENT_ID) == second
        # Stopped on purpose: not started again.
        ed.lua("vim.lsp.stop_client(vim.lsp.get_clients({ name = 'lsp_dscoder' }))")
        ed.wait_for(lambda: not ed.lua("return #vim.lsp.get_clients()"), "the server to exit", timeout=10)
        ed.nvim.command("sleep 300m")
        assert ed.lua("return #vim.lsp.get_clients()") == 0
        assert messages(ed).count("starting it again") == 1
    finally:
        close_editor(ed)


def test_a_server_that_keeps_crashing_is_given_up_with_the_reason(nvim_exe: Path, tmp_path: Path) -> None:
    script = tmp_path / "crashing_server.py"
    script.write_text(CRASHING_SERVER, encoding="utf-8")
    ed = launch_editor(nvim_exe, tmp_path, SETUP, [sys.executable, str(script)])
    try:
        ed.open(["x = 1"], 0, 0)
        why = "the server exited (code 3) 5 times in 3 minutes: not restarted"
        ed.wait_for(
            lambda: ed.lua("return require('lsp_dscoder').status()") == f"dscoder: failed · {why}",
            "the statusline to give up",
        )
        assert messages(ed).count("lsp-dscoder: the server exited (code 3); starting it again") == 4
        assert f"lsp-dscoder: {why}" in messages(ed)
        ed.nvim.command("sleep 300m")
        assert ed.lua("return #vim.lsp.get_clients()") == 0
    finally:
        ed.nvim.command("qa!", async_=True)
        ed.nvim.close()
