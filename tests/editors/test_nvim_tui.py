"""The Neovim plugin in Neovim's real terminal UI under tmux: what the screen shows, with keys sent
through the terminal. The server runs the bundled model (the README's default setup); a pynvim
connection to the same Neovim (`--listen`) reads the buffer and the plugin's state.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.editors.conftest import PLUGIN_DIR, TIMEOUT_S, wait_for

pytestmark = pytest.mark.slow

T = TypeVar("T")

POINT = ["class Point:", "    def __init__(self, x, y):", "        self."]
# The bundled model's suggestion after `self.` (greedy decoding); its second line is drawn as a
# virtual line below the cursor's.
SUGGESTION = "x = x\n        self.y = y"
SECOND_LINE = "self.y = y"

INIT = """
vim.opt.runtimepath:prepend(vim.env.LSP_DSCODER_PLUGIN)
vim.o.swapfile = false
vim.o.laststatus = 0
vim.o.cmdheight = 1
vim.o.shortmess = vim.o.shortmess .. 'I'
require('lsp_dscoder').setup({ cmd = vim.json.decode(vim.env.LSP_DSCODER_CMD) })
"""


class Tui:
    """Neovim in a tmux pane of `width` x `height`, plus a pynvim client on its --listen socket."""

    def __init__(self, nvim_exe: Path, workdir: Path, file: Path, width: int, height: int) -> None:
        pynvim = pytest.importorskip("pynvim")
        self.socket = f"lsp-dscoder-{time.monotonic_ns()}"
        listen = workdir / "nvim.sock"
        init = workdir / "init.lua"
        init.write_text(INIT, encoding="utf-8")
        cmd = f'["{sys.executable}", "-m", "lsp_dscoder", "--stdio"]'
        env = {
            "LSP_DSCODER_PLUGIN": str(PLUGIN_DIR),
            "LSP_DSCODER_CMD": cmd,
            "XDG_STATE_HOME": str(workdir / "state"),
            "TERM": "xterm-256color",
        }
        exports = " ".join(f"{k}='{v}'" for k, v in env.items())
        shell = f"env {exports} {nvim_exe} --clean -u {init} -n --listen {listen} {file}"
        self.tmux("new-session", "-d", "-x", str(width), "-y", str(height), shell)
        self.nvim = self.wait_for(lambda: self._attach(pynvim, listen), f"Neovim on {listen}")

    def _attach(self, pynvim: Any, listen: Path) -> Any:
        """A client on Neovim's socket once it accepts connections, else None."""
        if not listen.exists():
            return None
        try:
            return pynvim.attach("socket", path=str(listen))
        except OSError:
            return None

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        return out.stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def lua(self, code: str, *args: Any) -> Any:
        return self.nvim.exec_lua(code, *args)

    def wait_for(self, fn: Callable[[], T], what: str, timeout: float = TIMEOUT_S) -> T:
        return wait_for(fn, what, timeout, poll_s=0.02)

    def wait_screen(self, test: Callable[[str], bool], what: str) -> str:
        try:
            return self.wait_for(lambda: test(s := self.screen()) and s, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.screen()}") from None

    def wait_suggestion(self) -> None:
        self.wait_for(
            lambda: (
                (self.lua("return require('lsp_dscoder').get_suggestion()") or {}).get("text") == SUGGESTION
            ),
            "the whole suggestion",
        )

    def close(self) -> None:
        try:
            self.nvim.command("qa!", async_=True)
            self.nvim.close()
        finally:
            self.tmux("kill-server")


@pytest.fixture
def tui(nvim_exe: Path, tmp_path: Path) -> Iterator[Callable[..., Tui]]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    opened: list[Tui] = []

    def open_tui(lines: list[str], width: int = 60, height: int = 12) -> Tui:
        file = tmp_path / "point.py"
        file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        t = Tui(nvim_exe, tmp_path, file, width, height)
        opened.append(t)
        t.wait_for(
            lambda: t.lua("return require('lsp_dscoder').status_info().state") == "idle",
            "the bundled model to load",
            timeout=60,
        )
        return t

    yield open_tui
    for t in opened:
        t.close()


def test_ghost_text_shows_only_in_the_window_with_the_cursor(tui: Callable[..., Tui]) -> None:
    t = tui(POINT, height=16)
    t.nvim.command("split")  # two windows on the same buffer, cursor in the top one
    t.nvim.command(f"call cursor({len(POINT)}, 1)")
    t.keys("A")
    t.wait_suggestion()
    screen = t.wait_screen(lambda s: SECOND_LINE in s, "the ghost text on screen")
    assert screen.count(SECOND_LINE) == 1, screen
    assert screen.count("x = x") == 1, screen
    assert t.nvim.current.buffer[:] == POINT


def test_tab_scrolls_a_suggestion_below_the_window_into_view_before_accepting(
    tui: Callable[..., Tui],
) -> None:
    lines = POINT
    t = tui(lines, height=4)  # a window of 3 lines (and the command line): the file fills it
    t.nvim.command(f"call cursor({len(lines)}, 1)")
    assert t.lua("return vim.fn.line('w$')") == len(lines)  # the cursor's line is the window's last
    t.keys("A")
    t.wait_suggestion()
    t.wait_screen(lambda s: s.count("x = x") == 1, "the first line of the suggestion")
    assert SECOND_LINE not in t.screen()  # drawn below the window's last line
    t.keys("Tab")
    t.wait_screen(lambda s: SECOND_LINE in s, "the suggestion scrolled into view")
    assert t.nvim.current.buffer[:] == lines  # not accepted: the user had not seen all of it
    t.keys("Tab")
    accepted = [*lines[:-1], *(POINT[-1] + SUGGESTION).split("\n")]
    t.wait_for(lambda: t.nvim.current.buffer[:] == accepted, "the suggestion to be inserted")
