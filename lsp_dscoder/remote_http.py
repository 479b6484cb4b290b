"""The remote backend's HTTP/1.1, read on the server's event loop: the endpoint URL, the errors, a
response's head and body (chunked or not), and the server-sent events of a stream.

A response is parsed from an asyncio stream as its bytes arrive: no thread sits in a blocking read, so a
chunk's events reach the handler that waits for them without a hop between threads (a thread's wake-up
and a hand-over of the interpreter lock per chunk). Standard library only; `http.client` reads from
blocking sockets, hence this small parser.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lsp_dscoder.engine.errors import EngineError

DROPPED = "the stream ended before [DONE] (the engine dropped it)"


class RemoteError(EngineError):
    """The remote engine failed a request: unreachable, too slow, an HTTP error or a malformed stream."""


class EndpointDownError(RemoteError):
    """The endpoint failed recently and its retry time has not come: the request is not sent. The outage
    was logged and shown once when it began, so each request it refuses is logged at debug level only."""

    reported = True


class HttpStatusError(RemoteError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """Where the engine listens: `http://host:port` with an optional path prefix (`/v1` is implied)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @staticmethod
    def parse(url: str) -> Endpoint:
        try:
            parts = urlsplit(url.strip())
            explicit_port = parts.port  # urllib checks the port (and an IPv6 host) only when asked
        except ValueError as exc:
            raise ValueError(f"expected an http(s)://host[:port] URL, got {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://host[:port] URL, got {url!r}")
        if parts.query or parts.fragment or parts.username:
            raise ValueError(f"the endpoint URL takes no query, fragment or credentials: {url!r}")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        port = explicit_port or (443 if parts.scheme == "https" else 80)
        return Endpoint(parts.scheme, parts.hostname, port, prefix)

    def path(self, route: str) -> str:
        return f"{self.prefix}{route}"

    @property
    def authority(self) -> str:
        """The `Host` header's value."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


def describe(endpoint: Endpoint, exc: BaseException) -> str:
    """What went wrong, for the log and the user."""
    if isinstance(exc, socket.timeout | TimeoutError | asyncio.TimeoutError):
        return f"{endpoint} did not answer in time"
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return f"nothing is listening at {endpoint}"
    if isinstance(exc, RemoteError):
        return f"{endpoint}: {exc}"
    return f"{endpoint}: {type(exc).__name__}: {exc}"


def encode_json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def request_head(method: str, endpoint: Endpoint, path: str, headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 request's head up to its `Content-Length` value (the caller adds it, CRLF CRLF and
    the body)."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {endpoint.authority}", "Accept: text/event-stream"]
    head += ["Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\nContent-Length: ").encode("latin-1")


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: dict[str, str]  # names in lower case

    @property
    def will_close(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


async def read_head(reader: asyncio.StreamReader) -> ResponseHead:
    """The status line and headers (1xx interim answers are skipped). ConnectionResetError when the
    server closed the connection without answering: a kept-alive connection it dropped as the request
    went out, which the caller may retry since nothing was streamed."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionResetError("the endpoint closed the connection without answering")
        version, _, rest = line.decode("latin-1").partition(" ")
        if not version.startswith("HTTP/") or not rest[:3].isdigit():
            raise RemoteError(f"malformed HTTP response: {line[:120]!r}")
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n"):
            if not line:
                raise RemoteError("the endpoint closed the connection in the middle of a response head")
            name, colon, value = line.decode("latin-1").partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        if not 100 <= int(rest[:3]) < 200:
            return ResponseHead(int(rest[:3]), headers)


class Body:
    """A response's body as it arrives: chunked (as streams are sent), of a stated length, or up to the
    end of the connection. A connection that ends before the body does is a dropped stream."""

    def __init__(self, reader: asyncio.StreamReader, head: ResponseHead) -> None:
        self._reader = reader
        self._chunked = "chunked" in head.headers.get("transfer-encoding", "").lower()
        length = head.headers.get("content-length", "")
        self._left = int(length) if length.isdigit() and not self._chunked else None
        self.done = False

    async def read(self) -> bytes:
        """The next piece of the body; b"" once all of it has been read."""
        if self.done:
            return b""
        try:
            data = await self._next()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise RemoteError(DROPPED) from exc
        self.done = not data
        return data

    async def _next(self) -> bytes:
        reader = self._reader
        if self._chunked:
            line = await reader.readline()
            size = line.split(b";", 1)[0].strip()
            if not line or not size or size.strip(b"0123456789abcdefABCDEF"):
                raise RemoteError(DROPPED if not line else f"malformed chunk size: {line[:40]!r}")
            if int(size, 16) == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b""
            return (await reader.readexactly(int(size, 16) + 2))[:-2]
        if self._left is None:  # up to the end of the connection
            return await reader.read(65536)
        if self._left == 0:
            return b""
        data = await reader.read(min(self._left, 65536))
        if not data:
            raise RemoteError(DROPPED)
        self._left -= len(data)
        return data

    async def read_all(self, limit: int = 1 << 20) -> bytes:
        parts: list[bytes] = []
        while (piece := await self.read()) and sum(map(len, parts)) < limit:
            parts.append(piece)
        return b"".join(parts)[:limit]


async def check_status(head: ResponseHead, body: Body) -> None:
    if head.status != 200:
        text = (await body.read_all(4096)).decode("utf-8", "replace")
        raise HttpStatusError(head.status, text.strip())


class Events:
    """The `data` of each server-sent event of a body, in turn, until `[DONE]` (the body is then read to
    its end, so that the connection can carry another request). Comments (keep-alive pings) are
    skipped; a stream that ends without `[DONE]` was dropped and raises RemoteError. (A class, not an
    async generator: a stream cut mid-way leaves nothing suspended for the garbage collector to close.)"""

    def __init__(self, body: Body) -> None:
        self._body = body
        self._lines: list[bytes] = []
        self._pending = b""
        self._data: list[str] = []

    async def next(self) -> str | None:
        """The next event's data; None after `[DONE]`."""
        while True:
            while self._lines:
                event = self._line(self._lines.pop())
                if event is None:
                    continue
                if event.strip() == "[DONE]":
                    while await self._body.read():
                        pass
                    return None
                return event
            piece = await self._body.read()
            if not piece:
                raise RemoteError(DROPPED)
            *lines, self._pending = (self._pending + piece).split(b"\n")
            self._lines = lines[::-1]

    def _line(self, raw: bytes) -> str | None:
        """The event that a blank line ends, or None."""
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if line:
            if not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    self._data.append(value[1:] if value.startswith(" ") else value)
                elif field == "error":  # some servers name an error event so
                    self._data.append(json.dumps({"error": value.strip()}))
            return None
        if not self._data:
            return None
        event, self._data = "\n".join(self._data), []
        return event


def model_ids(listing: bytes) -> list[str]:
    """The model names in a `GET /v1/models` answer."""
    try:
        data = json.loads(listing).get("data")
    except (ValueError, AttributeError):
        raise RemoteError("GET /v1/models did not return an OpenAI model list") from None
    if not isinstance(data, list):
        raise RemoteError("GET /v1/models did not return an OpenAI model list")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
