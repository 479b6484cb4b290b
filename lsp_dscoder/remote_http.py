"""The remote backend's HTTP: an endpoint URL, a pool of keep-alive connections, and server-sent events.

Plain `http.client` on the backend's worker threads: no dependency, and a stream is stopped at once by
shutting its socket down from the thread that cancels (the engine then sees the client go away and stops
generating). A connection is reused while the server keeps it open; one that the server closed while it
sat idle is noticed before the request is written (its socket reads as at end of file), so a stale
connection never costs a request.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lsp_dscoder.engine.errors import EngineError

_IDLE_MAX = 4  # kept-alive connections per endpoint; more requests at once than this open new ones


class RemoteError(EngineError):
    """The remote engine failed a request: unreachable, too slow, an HTTP error or a malformed stream."""


class EndpointDownError(RemoteError):
    """The endpoint failed recently and its retry time has not come: the request is not sent."""


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
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://host[:port] URL, got {url!r}")
        if parts.query or parts.fragment or parts.username:
            raise ValueError(f"the endpoint URL takes no query, fragment or credentials: {url!r}")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return Endpoint(parts.scheme, parts.hostname, port, prefix)

    def path(self, route: str) -> str:
        return f"{self.prefix}{route}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


def _stale(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by its server: an idle socket has nothing to read."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class ConnectionPool:
    """Keep-alive connections to one endpoint, shared by the backend's worker threads.

    One spare connection is kept open ahead of need: taking the last idle one opens the next in the
    background (`spawn`). Some servers (llama.cpp's) close the connection after each stream, and a
    cancelled stream must be cut; either way the next keystroke finds a connection already open."""

    def __init__(
        self, endpoint: Endpoint, connect_timeout: float, spawn: Callable[[Callable[[], None]], object]
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self._spawn = spawn
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._warming = False
        self.opened = 0  # connections opened (TCP handshakes paid), for the stats
        self.opened_on_request = 0  # of which a request had to wait for

    def acquire(self) -> http.client.HTTPConnection:
        """An open connection: an idle one if the server kept it, otherwise a new one (connects now)."""
        conn = None
        with self._lock:
            while self._idle and conn is None:
                conn = self._idle.pop()
                if _stale(conn):
                    conn.close()
                    conn = None
            self.opened_on_request += conn is None
            warm = not self._idle and not self._warming
            self._warming |= warm
        if warm:
            self._spawn(self._warm)
        return conn if conn is not None else self._open()

    def _open(self) -> http.client.HTTPConnection:
        e = self.endpoint
        cls = http.client.HTTPSConnection if e.scheme == "https" else http.client.HTTPConnection
        conn = cls(e.host, e.port, timeout=self.connect_timeout)
        conn.connect()
        if conn.sock is not None:  # a keystroke's request is small: send it without waiting for an ACK
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.opened += 1
        return conn

    def release(self, conn: http.client.HTTPConnection) -> None:
        """Back to the pool, if the last response was read to its end and the server keeps it open."""
        with self._lock:
            if conn.sock is not None and len(self._idle) < _IDLE_MAX:
                self._idle.append(conn)
                return
        conn.close()

    def _warm(self) -> None:
        try:
            with contextlib.suppress(OSError):  # the endpoint is down: the next request will say so
                self.release(self._open())
        finally:
            with self._lock:
                self._warming = False

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def abort(conn: http.client.HTTPConnection) -> None:
    """Cut a connection from another thread: a read blocked on it returns at once."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def set_read_timeout(conn: http.client.HTTPConnection, seconds: float) -> None:
    if conn.sock is not None:
        conn.sock.settimeout(max(seconds, 1e-3))


def encode_json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def send_json(
    conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str], data: bytes | None
) -> None:
    """Write a request (its body already encoded)."""
    head = {"Accept": "text/event-stream, application/json", **headers}
    if data is not None:
        head["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=head)


def request_json(
    conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str], body: Any = None
) -> http.client.HTTPResponse:
    """Send a request; returns the response once its status line and headers are in."""
    send_json(conn, method, path, headers, None if body is None else encode_json(body))
    return conn.getresponse()


def check_status(response: http.client.HTTPResponse) -> None:
    if response.status != 200:
        body = response.read(4096).decode("utf-8", "replace")
        raise HttpStatusError(response.status, body.strip())


def sse_events(response: http.client.HTTPResponse) -> Iterator[str]:
    """The `data` of each server-sent event, until `[DONE]`. Comments (keep-alive pings) are skipped;
    a stream that ends without `[DONE]` was dropped and raises RemoteError."""
    data: list[str] = []
    while True:
        raw = response.readline()
        if not raw:
            raise RemoteError("the stream ended before [DONE] (the engine dropped it)")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line:
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
            elif field == "error":  # some servers name an error event so
                data.append(json.dumps({"error": value.strip()}))
            continue
        if not data:
            continue
        event, data = "\n".join(data), []
        if event.strip() == "[DONE]":
            response.read()  # the chunked body's end: the connection is then reusable
            return
        yield event


def model_ids(listing: bytes) -> list[str]:
    """The model names in a `GET /v1/models` answer."""
    try:
        data = json.loads(listing).get("data")
    except (ValueError, AttributeError):
        raise RemoteError("GET /v1/models did not return an OpenAI model list") from None
    if not isinstance(data, list):
        raise RemoteError("GET /v1/models did not return an OpenAI model list")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
