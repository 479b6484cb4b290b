"""An HTTP server that speaks `/v1/completions` streaming badly on purpose, for the failure tests.

It is no stand-in for an engine (the happy path is tested against llama.cpp's server): it only answers
the way a failing engine or a broken proxy does. It runs its own event loop on a thread, so that both
synchronous tests and the language server under test can talk to it; it records what it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

MODES = ("ok", "drop", "garbage", "error_event", "http500", "http401", "silent", "stall")


@dataclass
class Record:
    connections: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    closed_by_client: int = 0  # streams the client cut before they ended
    closed_idle: int = 0  # connections closed by the server after `idle_close_s` without a request


class BadServer:
    """`mode` picks the behaviour of the next completion requests; GET /v1/models always answers."""

    def __init__(self, pieces: list[tuple[int, str]] | None = None) -> None:
        self.mode = "ok"
        self.pieces = pieces or [(100, "a"), (101, "b"), (102, "c")]  # (token id, text) per chunk
        self.pieces_have_ids = True  # as llama.cpp's logprobs; False: text only, as SGLang's chunks
        self.idle_close_s: float | None = None  # close a connection idle this long, as servers do
        self.record = Record()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            clients = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in clients:  # connections still open: closed while the loop runs
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.record.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self.record.closed_by_client += 1
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_close_s)
        except asyncio.TimeoutError:
            self.record.closed_idle += 1
            return False
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.record.paths.append(f"{method} {path}")
        self.record.headers.append(headers)
        if path.endswith("/v1/models"):
            payload = json.dumps({"object": "list", "data": [{"id": "bad-model", "object": "model"}]})
            await _send(writer, 200, "application/json", payload.encode())
            return True
        self.record.requests.append(json.loads(body))
        return await self._complete(reader, writer)

    async def _complete(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        mode = self.mode
        if mode == "http500":
            await _send(writer, 500, "application/json", b'{"error":{"message":"boom"}}')
            return True
        if mode == "http401":
            await _send(writer, 401, "application/json", b'{"error":{"message":"bad key"}}')
            return True
        if mode == "silent":  # accepts the request, never answers
            await reader.read()
            return False
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for i, (token, text) in enumerate(self.pieces):
            if mode == "drop" and i == 2:
                writer.transport.abort()  # the engine died: no terminating chunk
                return False
            if mode == "garbage" and i == 2:
                await _chunk(writer, b"data: {this is not json\n\n")
                continue
            if mode == "error_event" and i == 2:
                await _chunk(writer, b'error: {"message":"out of memory"}\n\n')
                continue
            if mode == "stall" and i == 2:
                await reader.read()  # waits for the client to give up
                self.record.closed_by_client += 1
                return False
            logprobs = {"content": [{"id": token}]} if self.pieces_have_ids else None
            choice = {"text": text, "index": 0, "finish_reason": None, "logprobs": logprobs}
            event = {"choices": [choice]}
            await _chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
        final = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "timings": {"cache_n": 0}}
        await _chunk(writer, b"data: " + json.dumps(final).encode() + b"\n\n")
        await _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return True


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def _send(writer: asyncio.StreamWriter, status: int, kind: str, body: bytes) -> None:
    reason = {200: "OK", 401: "Unauthorized", 500: "Internal Server Error"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
