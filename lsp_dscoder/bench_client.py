"""A raw JSON-RPC client for `lsp-dscoder bench --protocol`: asyncio pipes and the server's own
Content-Length framing (`framing.Framer`), no pygls, no pytest-lsp, so that the time it measures is the
server's and the pipes', not a client library's.

Every message read is stamped with `time.monotonic()` as soon as its body is in: the clock the server's
own request records use, so client and server durations are comparable on one machine. The server's
stderr is read as it comes; each request's log line (`request id=... key=value ...`, see
`lsp_dscoder/stats.py`) is kept by request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lsp_dscoder.framing import Framer

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


class RpcClient:
    """One server process over stdio."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.calls: dict[int, Call] = {}
        self.records: dict[Any, dict[str, Any]] = {}  # request id -> the server's log record
        self.unknown: list[dict[str, Any]] = []  # messages for request ids this client never sent
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self.exited = False  # the server closed its stdout
        self._next_id = 0
        self._tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]

    @classmethod
    async def start(cls, argv: list[str]) -> RpcClient:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=1 << 24,  # a stderr line can be long
        )
        return cls(proc)

    def _write(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, ensure_ascii=False).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def send(self, *messages: dict[str, Any]) -> float:
        """Write messages back to back; the monotonic time once the pipe has taken them."""
        for message in messages:
            self._write({"jsonrpc": "2.0", **message})
        assert self.proc.stdin is not None
        await self.proc.stdin.drain()
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

    async def _read_stdout(self) -> None:
        reader = self.proc.stdout
        assert reader is not None
        framer = Framer(lambda reason: self.stderr_tail.append(f"(client) bad framing on stdout: {reason}"))
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                read = time.monotonic()
                for body in framer.feed(data):
                    await self._dispatch(json.loads(body), read)
        self.exited = True
        for c in self.calls.values():  # nothing more will come: wake whoever waits
            c.answered.set()
            c.done.set()

    async def _dispatch(self, message: dict[str, Any], read: float) -> None:
        if "method" in message and "id" in message:  # a request from the server: progress, configuration
            await self.send({"id": message["id"], "result": None})
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

    async def _read_stderr(self) -> None:
        reader = self.proc.stderr
        assert reader is not None
        while line := await reader.readline():
            text = line.decode(errors="replace").rstrip()
            self.stderr_tail.append(text)
            record = parse_record(text)
            if record is not None and "id" in record:
                self.records[record["id"]] = record

    async def close(self, timeout: float = 30.0) -> int:
        """shutdown + exit; the exit code (the process is killed if it does not end in time)."""
        with contextlib.suppress(RuntimeError, ConnectionError):
            await self.call("shutdown", None, timeout)
            await self.notify("exit", None)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        for task in self._tasks:
            task.cancel()
        return code
