"""Keep-alive connections to the endpoint, owned by the server's event loop.

Besides the connections given back after a request, one spare that has never carried a request is kept
open ahead of need, so that a keystroke never waits for a handshake. Some servers (llama.cpp's) close the
connection after each stream without saying so, and a cancelled stream must be cut: the next keystroke
then finds the spare. A connection the server closed while it sat idle is known to the loop (its end of
file arrived) and is never handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

from lsp_dscoder.remote_http import Endpoint

_IDLE_MAX = 4  # kept-alive connections per endpoint; more requests at once than this open new ones


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on `loop`'s thread (inside one of its callbacks or tasks)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Connection:
    """One open connection (TCP, or TLS): its asyncio stream, and the loop that reads it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.reader, self.writer, self.loop = reader, writer, loop

    @property
    def stale(self) -> bool:
        """Closed by either side (a server that closes an idle connection sends its end of file)."""
        return self.writer.is_closing() or self.reader.at_eof()

    def write(self, data: bytes) -> None:
        """On the loop's thread. The transport sends at once what the socket takes (a keystroke's whole
        request, on an idle connection): the endpoint starts before this call returns."""
        self.writer.write(data)

    def abort(self) -> None:
        """Cuts the connection at once, from any thread: a read waiting on it returns, and the server
        sees the client go (engines stop generating then)."""
        transport = self.writer.transport
        if on_loop(self.loop):
            transport.abort()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: so has the connection
                self.loop.call_soon_threadsafe(transport.abort)

    def close(self) -> None:
        """On the loop's thread: a connection whose response was read to its end, not to be reused."""
        self.writer.close()


class ConnectionPool:
    """Connections to one endpoint. Every method runs on the loop's thread."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float, loop: asyncio.AbstractEventLoop) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.loop = loop
        self._ssl = ssl.create_default_context() if endpoint.scheme == "https" else None
        self._idle: list[Connection] = []  # given back after a request
        self._spare: Connection | None = None
        self._warming: asyncio.Task[None] | None = None
        self._closed = False
        self.opened = 0  # connections opened (TCP handshakes paid), for the stats
        self.opened_on_request = 0  # of which a request had to wait for

    def take(self) -> Connection | None:
        """An open connection the server has not closed (a reused one first), or None."""
        while self._idle or self._spare is not None:
            conn: Connection | None
            if self._idle:
                conn = self._idle.pop()
            else:
                conn, self._spare = self._spare, None
            assert conn is not None
            if not conn.stale:
                return conn
            conn.close()
        return None

    async def acquire(self) -> Connection:
        """An open connection: an idle one if there is one, otherwise a new one (connects now)."""
        conn = self.take()
        if conn is None:
            self.opened_on_request += 1
            conn = await self._open()
        return conn

    def replenish(self) -> None:
        """Opens the spare connection, if there is none, without waiting for it."""
        if self._spare is None and self._warming is None and not self._closed:
            self._warming = self.loop.create_task(self._warm())

    async def _open(self) -> Connection:
        e = self.endpoint
        connect = asyncio.open_connection(e.host, e.port, ssl=self._ssl)
        reader, writer = await asyncio.wait_for(connect, self.connect_timeout)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # asyncio's loop sets it, uvloop's too; a request must never wait for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return Connection(reader, writer, self.loop)

    async def _warm(self) -> None:
        try:
            with contextlib.suppress(OSError, asyncio.TimeoutError):  # down: the next request says so
                fresh = await self._open()
                old, self._spare = self._spare, fresh
                if old is not None:
                    old.close()
        finally:
            self._warming = None

    def release(self, conn: Connection) -> None:
        """Back to the pool, after a response read to its end on a connection the server keeps open."""
        if not conn.stale and len(self._idle) < _IDLE_MAX:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        if self._spare is not None:
            idle.append(self._spare)
            self._spare = None
        if self._warming is not None:
            self._warming.cancel()
        for conn in idle:
            conn.close()
