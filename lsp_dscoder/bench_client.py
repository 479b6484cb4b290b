"""A raw JSON-RPC client for `lsp-dscoder bench --protocol`: asyncio pipes and the server's own
Content-Length framing (`framing.Framer`), no pygls, no pytest-lsp, so that the time it measures is the
server's and the pipes', not a client library's.

Every message read is stamped with `time.monotonic()` in the callback that receives its bytes (no reader
task to wake first): the clock the server's own request records use, so client and server durations are
comparable on one machine. The server's stderr is read as it comes; each request's log line
(`request id=... key=value ...`, see `lsp_dscoder/stats.py`) is kept by request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from lsp_dscoder.framing import Framer, framed

PARTIAL = "dscoder/partialCompletion"
_FIELD = re.compile(r"(\w+)=(\S+)")
_STDERR_TAIL = 40


@dataclass
class Call:
    """One request the client sent, and what came back for it."""

    id: int
    method: str
    written: float  # monotonic time when the request was handed to the pipe
    version: int | None = None  # the document version it was sent for (completions)
    response: dict[str, Any] | None = None  # the whole JSON-RPC response
    response_read: float | None = None
    partials: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # first partial or the response

    @property
    def first_read(self) -> float | None:
        times = [t for t, _ in self.partials[:1]] + ([self.response_read] if self.response_read else [])
        return min(times) if times else None

    @property
    def shown(self) -> str:
        """The suggestion the editor shows now: the last partial's text (or the response's)."""
        if self.partials:
            return str(self.partials[-1][1].get("text") or "")
        items = ((self.response or {}).get("result") or {}).get("items") or []
        return str(items[0].get("insertText") or "") if items else ""


def parse_record(line: str) -> dict[str, Any] | None:
    """The fields of a server request log line (`request id=7 uri=... v=3 firstPartialMs=2.1 ...`)."""
    at = line.find("request id=")
    if at < 0:
        return None
    record: dict[str, Any] = {}
    for key, raw in _FIELD.findall(line[at + len("request ") :]):
        try:
            record[key] = json.loads(raw)
        except json.JSONDecodeError:
            record[key] = raw
    return record


class _Pipes(asyncio.SubprocessProtocol):
    """Hands the server's output to the client the moment it arrives: a stdout chunk is stamped in the
    loop's callback, not after a reader task has been woken for it."""

    def __init__(self, client: RpcClient) -> None:
        self._client = client
        self._stderr = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._client._stdout(data, time.monotonic())
            return
        self._stderr += data
        *lines, rest = self._stderr.split(b"\n")
        self._stderr = bytearray(rest)
        for line in lines:
            self._client._stderr_line(line.decode(errors="replace").rstrip())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._client._stdout_closed()

    def process_exited(self) -> None:
        if not self._client.exit.done():
            self._client.exit.set_result(None)


class RpcClient:
    """One server process over stdio."""

    def __init__(self) -> None:
        self.transport: asyncio.SubprocessTransport | None = None
        self.calls: dict[int, Call] = {}
        self.records: dict[Any, dict[str, Any]] = {}  # request id -> the server's log record
        self.unknown: list[dict[str, Any]] = []  # messages for request ids this client never sent
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self.exited = False  # the server closed its stdout
        self.exit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._framer = Framer(
            lambda reason: self.stderr_tail.append(f"(client) bad framing on stdout: {reason}")
        )
        self._next_id = 0

    @classmethod
    async def start(cls, argv: list[str]) -> RpcClient:
        client = cls()
        loop = asyncio.get_running_loop()
        client.transport, _ = await loop.subprocess_exec(lambda: _Pipes(client), *argv)
        return client

    def _write(self, *messages: dict[str, Any]) -> None:
        """The messages framed and handed to the pipe in one write (one read for the server, usually)."""
        data = b"".join(framed(json.dumps(message, ensure_ascii=False).encode()) for message in messages)
        assert self.transport is not None
        stdin = cast(asyncio.WriteTransport | None, self.transport.get_pipe_transport(0))
        if stdin is not None and not stdin.is_closing():
            stdin.write(data)

    async def send(self, *messages: dict[str, Any]) -> float:
        """Write messages back to back; the monotonic time once the pipe has taken them."""
        self._write(*({"jsonrpc": "2.0", **message} for message in messages))
        return time.monotonic()

    def request_message(self, method: str, params: Any) -> tuple[int, dict[str, Any]]:
        self._next_id += 1
        return self._next_id, {"id": self._next_id, "method": method, "params": params}

    async def request(
        self, method: str, params: Any, *before: dict[str, Any], version: int | None = None
    ) -> Call:
        """Send `before` (notifications) and then the request, in one write; the Call is timed from it."""
        rid, message = self.request_message(method, params)
        call = Call(rid, method, 0.0, version)
        self.calls[rid] = call
        if self.exited:  # no answer will come
            call.answered.set()
            call.done.set()
        call.written = await self.send(*before, message)
        return call

    async def call(self, method: str, params: Any, timeout: float = 60.0) -> Any:
        """A request and its result; RuntimeError with the server's error or its stderr tail."""
        c = await self.request(method, params)
        await self.wait(c, timeout)
        assert c.response is not None
        if "error" in c.response:
            raise RuntimeError(f"{method} failed: {c.response['error']}")
        return c.response.get("result")

    async def notify(self, method: str, params: Any) -> None:
        await self.send({"method": method, "params": params})

    async def wait(self, c: Call, timeout: float, *, first: bool = False) -> None:
        """Until `c` is answered (its response; with `first`, its first partial will do); RuntimeError with
        the server's stderr tail if that takes over `timeout` s or the server exits first."""
        try:
            await asyncio.wait_for((c.answered if first else c.done).wait(), timeout)
        except TimeoutError as exc:
            raise self._failure(f"no answer to {c.method} (id {c.id}) in {timeout} s") from exc
        if c.response is None and self.exited:
            raise self._failure(f"the server exited before answering {c.method} (id {c.id})")

    def _failure(self, what: str) -> RuntimeError:
        return RuntimeError(what + "; server stderr:\n" + "\n".join(self.stderr_tail))

    def _stdout(self, data: bytes, read: float) -> None:
        for body in self._framer.feed(data):
            self._dispatch(json.loads(body), read)

    def _stdout_closed(self) -> None:
        self.exited = True
        for c in self.calls.values():  # nothing more will come: wake whoever waits
            c.answered.set()
            c.done.set()

    def _dispatch(self, message: dict[str, Any], read: float) -> None:
        if "method" in message and "id" in message:  # a request from the server: progress, configuration
            self._write({"jsonrpc": "2.0", "id": message["id"], "result": None})
            return
        if message.get("method") == PARTIAL:
            params = message["params"]
            c = self.calls.get(params.get("requestId"))
            if c is None:
                self.unknown.append(message)
                return
            c.partials.append((read, params))
            c.answered.set()
            return
        if "id" in message and "method" not in message:
            c = self.calls.get(message["id"])
            if c is None:
                self.unknown.append(message)
                return
            c.response, c.response_read = message, read
            c.answered.set()
            c.done.set()

    def _stderr_line(self, text: str) -> None:
        self.stderr_tail.append(text)
        record = parse_record(text)
        if record is not None and "id" in record:
            self.records[record["id"]] = record

    async def close(self, timeout: float = 30.0) -> int:
        """shutdown + exit; the exit code (the process is killed if it does not end in time)."""
        with contextlib.suppress(RuntimeError, ConnectionError):
            await self.call("shutdown", None, timeout)
            await self.notify("exit", None)
        assert self.transport is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.exit), timeout)
        except TimeoutError:
            self.transport.kill()
            await self.exit
        code = self.transport.get_returncode()
        self.transport.close()
        return -1 if code is None else code
