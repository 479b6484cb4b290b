"""The remote backend's HTTP: an endpoint URL, a pool of keep-alive connections, a request handle whose
cancel cuts its connection, and server-sent events.

Plain sockets and `http.client`'s response parser: no dependency. A request is written straight to the
socket (by the submitting thread when a connection is idle, see remote.py); its stream is read on a worker
thread and stopped at once by shutting the socket down from the thread that cancels (the engine then sees
the client go away and stops generating). A connection is reused while the server keeps it open; one that
the server closed while it sat idle is noticed before the request is written (its socket reads as at end
of file).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lsp_dscoder.engine.api import CompletionRequest, TokenEvent
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.handle import CompletionHandle

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
    """Keep-alive connections to one endpoint, shared by the backend's threads.

    Besides the connections given back after a request, one spare that has never carried a request is
    kept open ahead of need (`replenish`, which the backend calls once a request is written, so that the
    handshake never delays a keystroke). Some servers (llama.cpp's) close the connection
    after each stream without saying so, and a cancelled stream must be cut: the next keystroke then
    finds the spare."""

    def __init__(
        self, endpoint: Endpoint, connect_timeout: float, spawn: Callable[[Callable[[], None]], object]
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self._spawn = spawn
        self._idle: list[http.client.HTTPConnection] = []  # given back after a request
        self._spare: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._warming = False
        self.opened = 0  # connections opened (TCP handshakes paid), for the stats
        self.opened_on_request = 0  # of which a request had to wait for

    def take(self) -> http.client.HTTPConnection | None:
        """An open connection the server has not closed (a reused one first), or None; never waits for
        the network."""
        with self._lock:
            while self._idle or self._spare is not None:
                conn = self._idle.pop() if self._idle else self._spare
                if conn is self._spare:
                    self._spare = None
                assert conn is not None
                if not _stale(conn):
                    return conn
                conn.close()
        return None

    def acquire(self) -> http.client.HTTPConnection:
        """An open connection: an idle one if there is one, otherwise a new one (connects now)."""
        conn = self.take()
        if conn is None:
            with self._lock:
                self.opened_on_request += 1
            conn = self._open()
        return conn

    def replenish(self) -> None:
        """Opens the spare connection in the background, if there is none."""
        with self._lock:
            warm = self._spare is None and not self._warming
            self._warming |= warm
        if warm:
            self._spawn(self._warm)

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
                fresh = self._open()
                with self._lock:
                    old, self._spare = self._spare, fresh
                if old is not None:
                    old.close()
        finally:
            with self._lock:
                self._warming = False

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            if self._spare is not None:
                idle.append(self._spare)
                self._spare = None
        for conn in idle:
            conn.close()


class RemoteHandle(CompletionHandle):
    """A CompletionHandle whose cancel also cuts the HTTP stream, so the engine stops at once."""

    def __init__(self, request: CompletionRequest, seq: int) -> None:
        super().__init__(request)
        self.seq = seq  # the backend's count of requests when this one came
        self._conn_lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def cancel(self) -> None:
        super().cancel()
        with self._conn_lock:
            if self._conn is not None:
                abort(self._conn)

    def publish_events(self, events: list[TokenEvent]) -> None:
        """Several events at once, with one wake-up of the consumer (per event, the consumer's thread
        would take the interpreter lock from the reader before the event with text is out)."""
        with self._cond:
            self._events.extend(events[:-1])
        self._publish(event=events[-1])

    @property
    def connection(self) -> http.client.HTTPConnection | None:
        return self._conn

    def attach(self, conn: http.client.HTTPConnection | None) -> None:
        with self._conn_lock:
            self._conn = conn
            if conn is not None and self.cancelled:
                abort(conn)


def describe(endpoint: Endpoint, exc: BaseException) -> str:
    """What went wrong, for the log and the user."""
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"{endpoint} did not answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return f"nothing is listening at {endpoint}"
    if isinstance(exc, RemoteError):
        return f"{endpoint}: {exc}"
    return f"{endpoint}: {type(exc).__name__}: {exc}"


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


def send_now(conn: http.client.HTTPConnection, data: bytes) -> int:
    """Writes what the socket takes without waiting (an idle connection's buffer takes a keystroke's
    whole request); returns the number of bytes written. TLS sockets take no such flag: 0."""
    sock = conn.sock
    if sock is None or isinstance(sock, ssl.SSLSocket):
        return 0
    return int(sock.send(data, socket.MSG_DONTWAIT))


def read_response(conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
    """The response to a request written straight to `conn`'s socket, once its headers are in."""
    assert conn.sock is not None
    response = http.client.HTTPResponse(conn.sock, method="POST")
    response.begin()
    return response


def request_json(
    conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str], body: Any = None
) -> http.client.HTTPResponse:
    """Send a request; returns the response once its status line and headers are in."""
    data = None if body is None else encode_json(body)
    head = {"Accept": "text/event-stream, application/json", **headers}
    if data is not None:
        head["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=head)
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
