"""The Neovim plugin as a new user meets it, in a real headless Neovim: the README's default setup
(bundled model, default filetypes, Neovim's default LSP log level), a model that does not load, a
server command that does not exist, a remote endpoint that is down, and typing before the model is ready.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lsp_dscoder.remote_llama import free_port
from tests.editors.conftest import Editor, close_editor, launch_editor, wait_loaded

pytestmark = pytest.mark.slow

# The README's setup, with the server run by this interpreter (`lsp-dscoder` is this module).
DEFAULT_CMD = [sys.executable, "-m", "lsp_dscoder", "--stdio"]
POINT = ["class Point:", "    def __init__(self, x, y):", "        self."]
# The bundled model's suggestion after `self.` (greedy decoding).
POINT_SUGGESTION = "x = x\n        self.y = y"


@pytest.fixture(scope="module")
def default_editor(nvim_exe: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Editor]:
    """`setup({})` with the bundled model and Neovim's default log level (WARN); not yet loaded."""
    ed = launch_editor(
        nvim_exe,
        tmp_path_factory.mktemp("nvim-default"),
        "require('lsp_dscoder').setup({ cmd = ... })",
        DEFAULT_CMD,
        log_level="WARN",
    )
    try:
        yield ed
    finally:
        close_editor(ed)


def test_typing_before_the_model_is_ready_gets_a_suggestion_when_it_is(default_editor: Editor) -> None:
    ed = default_editor
    ed.open([*POINT[:-1], "        "], 2, 0)
    ed.type("A")
    assert ed.lua("return require('lsp_dscoder').status_info().state") == "loading"
    ed.type("self.")
    wait_loaded(ed)
    # No key after the load: the plugin asks at the cursor when the model is ready.
    ghost = ed.wait_for(
        lambda: (g := ed.ghost()) is not None and g["text"] == POINT_SUGGESTION and g,
        "the whole suggestion after the model loaded",
    )
    assert ghost == {"row": 2, "col": len(POINT[2]), "text": POINT_SUGGESTION, "marks": 1}
    requests = ed.probe("requests")
    assert requests[-1]["position"] == {"line": 2, "character": len(POINT[2])}
    assert ed.lines() == POINT


def test_default_filetypes_follow_the_bundled_model(default_editor: Editor) -> None:
    ed = default_editor
    wait_loaded(ed)
    count = "return #vim.lsp.get_clients({bufnr = 0, name = 'lsp_dscoder'})"
    for suffix, attached in ((".lua", False), (".txt", False), (".py", True)):
        path = ed.workdir / f"other{suffix}"
        path.write_text("x = 1\n", encoding="utf-8")
        ed.nvim.command(f"edit {path}")
        if attached:
            ed.wait_for(lambda: ed.lua(count) == 1, f"the server to attach to {suffix}")
        else:
            assert ed.lua(count) == 0, suffix
    filetypes = """
        local config = require('lsp_dscoder.config')
        local function resolved(opts) return config.filetypes(config.resolve(opts)) or vim.NIL end
        return {
          resolved({}),
          resolved({ init_options = { model = '/models/deepseek-coder-1.3b-base' } }),
          resolved({ cmd = { 'lsp-dscoder', '--stdio', '--model', '/m' } }),
          resolved({ filetypes = { 'lua', 'python' } }),
          resolved({ filetypes = { '*' } }),
        }
    """
    assert ed.lua(filetypes) == [["python"], None, None, ["lua", "python"], None]


def test_the_default_setup_leaves_the_lsp_log_clean(default_editor: Editor) -> None:
    """Neovim logs every line of the server's stderr at ERROR: by default the server writes none."""
    ed = default_editor
    wait_loaded(ed)
    ed.lua("require('vim.lsp.log').warn('lsp-dscoder test: the log is on')")
    ed.open(["def add(a, b):", "    "], 1, 0)
    ed.type("Areturn")
    ed.wait_settled()
    ed.type("<Esc>")
    log_path = ed.lua("return vim.lsp.get_log_path()")
    assert log_path.startswith(str(ed.workdir)), log_path
    log = Path(log_path).read_text(encoding="utf-8")
    assert "lsp-dscoder test: the log is on" in log
    assert "stderr" not in log and "[ERROR]" not in log, log[-2000:]


@pytest.fixture
def failing_editor(nvim_exe: Path, tmp_path: Path) -> Iterator[Editor]:
    """The default command with a model folder that does not exist."""
    setup = "require('lsp_dscoder').setup({ cmd = ..., init_options = { model = select(2, ...) } })"
    ed = launch_editor(nvim_exe, tmp_path, setup, DEFAULT_CMD, str(tmp_path / "no-such-model"))
    try:
        yield ed
    finally:
        close_editor(ed)


def test_a_model_that_does_not_load_shows_why(failing_editor: Editor) -> None:
    ed = failing_editor
    ed.open(["x = 1"], 0, 0)
    reason = f"model folder {ed.workdir / 'no-such-model'} does not exist"
    status = ed.wait_for(
        lambda: (s := ed.lua("return require('lsp_dscoder').status()")).startswith("dscoder: failed") and s,
        "the statusline to show the failure",
    )
    assert reason in status, status
    info = ed.lua("return require('lsp_dscoder').status_info()")
    assert info["state"] == "failed" and reason in info["error"], info
    ed.nvim.command("checkhealth lsp_dscoder")
    health = "\n".join(ed.nvim.current.buffer[:])
    assert "ERROR server: " in health and reason in health, health


def test_a_remote_endpoint_that_is_down_shows_in_the_statusline(nvim_exe: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cmd = [*DEFAULT_CMD, "--backend", "remote", "--endpoint", url]
    ed = launch_editor(nvim_exe, tmp_path, "require('lsp_dscoder').setup({ cmd = ... })", cmd)
    try:
        ed.open(["x = 1"], 0, 0)
        why = f"nothing is listening at {url}"
        status = ed.wait_for(
            lambda: (
                (s := ed.lua("return require('lsp_dscoder').status()")).startswith("dscoder: unreachable")
                and s
            ),
            "the statusline to show the outage",
        )
        assert status == f"dscoder: unreachable · {why}"
        info = ed.lua("return require('lsp_dscoder').status_info()")
        assert (info["state"], info["error"]) == ("unreachable", why), info
        ed.type("A2")  # a keystroke while it is down: the server answers at once, the state stays
        assert ed.wait_settled()["response"]["result"] is None
        assert ed.lua("return require('lsp_dscoder').status_info().state") == "unreachable"
        ed.nvim.command("checkhealth lsp_dscoder")
        health = "\n".join(ed.nvim.current.buffer[:])
        assert f"WARNING remote endpoint: {why}" in health, health
    finally:
        close_editor(ed)


def test_a_wrong_cmd_reports_its_spawn_error_once_per_buffer(nvim_exe: Path, tmp_path: Path) -> None:
    ed = launch_editor(
        nvim_exe,
        tmp_path,
        """
        _G._notified = {}
        vim.notify = function(msg) table.insert(_G._notified, msg) end
        require('lsp_dscoder').setup({ cmd = ... })
        """,
        [str(tmp_path / "no-such-server"), "--stdio"],
    )
    try:
        path = tmp_path / "a.py"
        path.write_text("x = 1\n", encoding="utf-8")
        ed.nvim.command(f"edit {path}")
        ed.nvim.command("edit")  # :e again: FileType and BufEnter once more
        notified = ed.lua("return _G._notified")
        assert len(notified) == 1 and "no-such-server" in notified[0], notified
        status = ed.lua("return require('lsp_dscoder').status()")
        assert status == f"dscoder: failed · not executable: {tmp_path / 'no-such-server'}"
        other = tmp_path / "b.py"
        other.write_text("y = 2\n", encoding="utf-8")
        ed.nvim.command(f"edit {other}")
        assert len(ed.lua("return _G._notified")) == 2
    finally:
        ed.nvim.command("qa!", async_=True)
        ed.nvim.close()
