"""The wire, byte by byte: framing that resynchronises after bad input (the framer alone, then a real
server over stdio), exits at any moment (while the model loads, when the client stops reading), and
JSON-RPC answers for malformed requests (TCP: test_tcp.py). A raw client speaks to a real
`lsp-dscoder` process; no model is loaded unless the test needs one (`initialized` starts the load)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lsp_dscoder.framing import Framer, HeaderTooLong

WAIT_S = 60.0  # generous: the machine may be busy; a deaf server waits forever, not 60 s
INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32600, -32601, -32602


def frame(body: bytes | dict[str, Any], header: str = "Content-Length") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return b"%s: %d\r\n\r\n%s" % (header.encode(), len(data), data)


def stats(msg_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "dscoder/stats", "params": {}}


GOOD = json.dumps(stats(1)).encode()
BAD_FRAMING = {
    "negative length": b"Content-Length: -5\r\n\r\n" + GOOD,
    "non-numeric length": b"Content-Length: abc\r\n\r\n" + GOOD,
    "length too large": b"Content-Length: %d\r\n\r\n" % (len(GOOD) + 500) + GOOD,
    "length too small": b"Content-Length: 10\r\n\r\n" + GOOD,
    "huge length": b"Content-Length: 99999999999999999999\r\n\r\n" + GOOD,
    "zero length": b"Content-Length: 0\r\n\r\n" + GOOD,
    "missing header": b"Content-Type: application/json\r\n\r\n" + GOOD,
    "bare body": GOOD,
    "binary garbage": bytes(range(256)) * 3,
    "garbage lines": b"hello\r\nworld: yes\r\n\r\n\x00\xff\r\n",
}


# --- the framer alone ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD_FRAMING))
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_the_framer_resynchronises_on_the_next_header(case, chunk):
    skipped: list[str] = []
    framer = Framer(skipped.append)
    stream = BAD_FRAMING[case] + frame(stats(2)) + frame(stats(3), "content-length")
    bodies = [b for i in range(0, len(stream), chunk) for b in framer.feed(stream[i : i + chunk])]
    assert [json.loads(b)["id"] for b in bodies[-2:]] == [2, 3]
    # The bad message is skipped, or (too small a length) handed on as the invalid JSON it is.
    assert [json.loads(b)["id"] for b in bodies[:-2] if b.startswith(b"{") and b.endswith(b"}")] == []
    assert len(skipped) <= 1 and framer.pending == 0
    if case != "length too small":
        assert len(skipped) == 1 and len(bodies) == 2


def test_the_framer_reports_one_line_per_stretch_of_garbage():
    skipped: list[str] = []
    framer = Framer(skipped.append)
    bodies = framer.feed(b"junk\r\nmore junk\r\nContent-Length: x\r\n\r\n{}" + frame(stats(4)))
    assert ([json.loads(b)["id"] for b in bodies], skipped) == ([4], ["bytes that are not a header"])
    assert framer.feed(b"junk\r\n" + frame(stats(5))) == [json.dumps(stats(5)).encode()]
    assert len(skipped) == 2  # the junk after message 4 is a new stretch


def test_the_framer_keeps_bodies_that_mention_headers_in_strings():
    text = 'resp = "Content-Length: 12\\r\\n\\r\\n{}"\ncontent-length: 5\n'
    message = {"jsonrpc": "2.0", "method": "x", "params": {"text": text}}
    pretty = json.dumps(message, indent=2).encode()  # raw line breaks between tokens
    skipped: list[str] = []
    framer = Framer(skipped.append)
    assert framer.feed(frame(pretty) + frame(message)) == [pretty, json.dumps(message).encode()]
    assert skipped == []


def test_a_header_line_over_64_kib():
    skipped: list[str] = []
    framer = Framer(skipped.append)
    assert framer.feed(b"x" * 70_000) == []
    assert framer.feed(b"\r\n" + frame(stats(6))) == [json.dumps(stats(6)).encode()]
    assert skipped == ["a header line longer than 64 KiB"]
    with pytest.raises(HeaderTooLong):
        Framer(skipped.append, overlong_is_fatal=True).feed(b"Content-Length: " + b"1" * 70_000)


# --- a raw client on a real server ----------------------------------------------------------------


class Raw:
    """Writes bytes, reads framed messages; answers the server's own requests with null."""

    def __init__(self, reader: asyncio.StreamReader, write: Any) -> None:
        self.reader, self.write = reader, write
        self.notifications: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any] | bytes) -> None:
        self.write(message if isinstance(message, bytes) else frame(message))

    async def message(self) -> dict[str, Any]:
        length = None
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        assert length is not None
        return json.loads(await self.reader.readexactly(length))

    async def answer(self, msg_id: Any) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while True:
                message = await self.message()
                if "method" not in message and message.get("id") == msg_id:
                    return message
                if "method" in message and "id" in message:
                    self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
                elif "method" in message:
                    self.notifications.append(message)

        return await asyncio.wait_for(wait(), WAIT_S)

    async def request(self, msg_id: int, method: str, params: Any = None) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return await self.answer(msg_id)

    async def initialize(self, progress: bool = False) -> None:
        caps = {"window": {"workDoneProgress": progress}}
        reply = await self.request(
            0, "initialize", {"processId": None, "rootUri": None, "capabilities": caps}
        )
        assert "result" in reply

    async def shutdown_and_exit(self, process: asyncio.subprocess.Process) -> int:
        reply = await self.request(99_999, "shutdown")
        assert reply == {"jsonrpc": "2.0", "id": 99_999, "result": None}, reply
        self.send({"jsonrpc": "2.0", "method": "exit"})
        return await asyncio.wait_for(process.wait(), WAIT_S)


def command(model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lsp_dscoder", "serve", "--model", str(model), *extra]


async def stdio_server(model: Path, *extra: str) -> tuple[asyncio.subprocess.Process, Raw]:
    pipe = asyncio.subprocess.PIPE
    process = await asyncio.create_subprocess_exec(
        *command(model, "--stdio", *extra), stdin=pipe, stdout=pipe, stderr=pipe, limit=1 << 24
    )
    assert process.stdin is not None and process.stdout is not None
    return process, Raw(process.stdout, process.stdin.write)


async def stderr_lines(process: asyncio.subprocess.Process) -> list[str]:
    assert process.stderr is not None
    return (await process.stderr.read()).decode().splitlines()


def error_code(reply: dict[str, Any]) -> int:
    return int(reply["error"]["code"])


@pytest.mark.asyncio
async def test_stdio_stays_in_step_after_every_kind_of_bad_framing(tiny_model):
    process, raw = await stdio_server(tiny_model)
    await raw.initialize()
    for i, case in enumerate(sorted(BAD_FRAMING), start=1):
        raw.send(BAD_FRAMING[case])
        reply = await raw.request(100 + i, "dscoder/stats", {})  # answered: the server is not deaf
        assert reply["result"]["engineState"] == "idle", case
    raw.send(frame(stats(200), "content-length"))  # header names are case-insensitive
    assert (await raw.answer(200))["result"]["engineState"] == "idle"
    assert await raw.shutdown_and_exit(process) == 0
    lines = await stderr_lines(process)
    skipped = [line for line in lines if "skipped badly framed input" in line]
    # one line per bad message (a "too small" length also leaves a tail that is not JSON)
    assert len(skipped) == len(BAD_FRAMING), lines
    assert not [line for line in lines if "Traceback" in line]


@pytest.mark.asyncio
async def test_malformed_requests_get_a_json_rpc_error_and_no_popup(tiny_model):
    process, raw = await stdio_server(tiny_model)
    await raw.initialize()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": 5})
    assert error_code(await raw.answer(1)) == INVALID_REQUEST
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "dscoder/stats", "params": 5})
    assert error_code(await raw.answer(2)) == INVALID_REQUEST
    raw.send({"jsonrpc": "1.0", "id": 3, "method": "dscoder/stats"})
    assert error_code(await raw.answer(3)) == INVALID_REQUEST
    raw.send({"jsonrpc": "2.0", "id": 4})
    assert error_code(await raw.answer(4)) == INVALID_REQUEST
    raw.send(frame(b"[1, 2]"))
    assert error_code(await raw.answer(None)) == INVALID_REQUEST
    raw.send({"jsonrpc": "2.0", "id": {"a": 1}, "method": "dscoder/stats"})
    assert error_code(await raw.answer(None)) == INVALID_REQUEST
    assert error_code(await raw.request(5, "textDocument/inlineCompletion", {})) == INVALID_PARAMS
    where = {"textDocument": {"uri": "file:///nowhere.py"}, "position": {"line": 0, "character": 0}}
    reply = await raw.request(6, "textDocument/inlineCompletion", {**where, "context": {"triggerKind": 1}})
    assert reply["error"] == {"code": INVALID_PARAMS, "message": "document is not open: file:///nowhere.py"}
    assert error_code(await raw.request(7, "dscoder/noSuchMethod", {})) == METHOD_NOT_FOUND
    # dscoder/stats without params (VS Code sends it so), and with null params: valid JSON-RPC
    raw.send({"jsonrpc": "2.0", "id": 8, "method": "dscoder/stats"})
    assert (await raw.answer(8))["result"]["engineState"] == "idle"
    assert (await raw.request(9, "dscoder/stats", None))["result"]["engineState"] == "idle"
    assert [n for n in raw.notifications if n["method"] == "window/showMessage"] == []
    # after shutdown: InvalidRequest for requests, and exit still works
    assert (await raw.request(10, "shutdown"))["result"] is None
    reply = await raw.request(11, "dscoder/stats", {})
    assert reply["error"] == {
        "code": INVALID_REQUEST,
        "message": "dscoder/stats after shutdown: only exit is accepted",
    }
    raw.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(process.wait(), WAIT_S) == 0
    assert not [line for line in await stderr_lines(process) if "Traceback" in line]


@pytest.mark.slow  # three server processes
@pytest.mark.asyncio
async def test_stderr_has_warnings_only_by_default(tiny_model, tmp_path):
    for extra, expect_info in (((), False), (("--log-level", "info"), True)):
        process, raw = await stdio_server(tiny_model, *extra)
        await raw.initialize()
        assert await raw.shutdown_and_exit(process) == 0
        lines = await stderr_lines(process)
        assert any(" INFO " in line for line in lines) == expect_info, lines
    log_file = tmp_path / "server.log"
    process, raw = await stdio_server(tiny_model, "--log-file", str(log_file))
    await raw.initialize()
    assert await raw.shutdown_and_exit(process) == 0
    assert await stderr_lines(process) == []
    assert "INFO lsp_dscoder.server_main: server stopped (exit code 0)" in log_file.read_text()


def test_a_client_that_stops_reading_ends_the_server_quietly(tiny_model):
    process = subprocess.Popen(
        command(tiny_model, "--stdio"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the editor (or its terminal) is gone
    for i in range(3):
        try:
            process.stdin.write(frame(stats(i)))
            process.stdin.flush()
        except BrokenPipeError:
            break
    assert process.wait(WAIT_S) == 0
    err = process.stderr.read().decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Error sending data" not in err, err


@pytest.fixture
def stalled_model(tiny_model, tmp_path) -> Path:
    """A checkpoint whose config.json is a FIFO nobody writes: reading it blocks, as on a stalled
    network file system. The real loader blocks in it for as long as the test runs."""
    folder = tmp_path / "stalled"
    shutil.copytree(tiny_model, folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    return folder


@pytest.mark.slow  # starts torch in the server (several seconds on 2 busy cores)
@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["exit", "stdin closed"])
async def test_exit_while_the_model_is_loading(stalled_model, how):
    process, raw = await stdio_server(stalled_model)
    await raw.initialize(progress=True)
    raw.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})

    async def loading() -> None:
        while True:
            message = await raw.message()
            if "id" in message and "method" in message:
                raw.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
            if message.get("method") == "$/progress" and "import 1/1" in str(message["params"]):
                return

    await asyncio.wait_for(loading(), WAIT_S)
    await asyncio.sleep(0.3)  # the loader is now reading config.json: stuck
    assert (await raw.request(1, "dscoder/stats"))["result"]["engineState"] == "loading"
    started = time.monotonic()
    if how == "exit":
        assert await raw.shutdown_and_exit(process) == 0
    else:
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), WAIT_S)
    elapsed = time.monotonic() - started
    lines = await stderr_lines(process)
    assert elapsed < 10, f"exit took {elapsed:.1f} s"  # it used to take until the load ended: never here
    assert len(lines) <= 3 and not [line for line in lines if "Traceback" in line or "Error" in line], lines


def test_stdin_from_dev_null_is_an_empty_session_not_a_crash(tiny_model):
    # epoll refuses /dev/null (a character device): it is read like a regular file, to its end at once.
    with open(os.devnull, "rb") as nothing:
        done = subprocess.run(
            command(tiny_model, "--stdio"), stdin=nothing, capture_output=True, timeout=WAIT_S
        )
    assert (done.returncode, done.stdout) == (0, b"")
    assert b"Traceback" not in done.stderr and b"Error" not in done.stderr
