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
import os
import socket
import ssl
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from lsp_dscoder.engine.handle import on_loop
from lsp_dscoder.remote_http import Endpoint

if TYPE_CHECKING:
    from _typeshed import HasFileno

_IDLE_MAX = 4  # kept-alive connections per endpoint; more requests at once than this open new ones
# a spare that the server closed after this long idle is opened again (servers drop idle connections
# after a few seconds: llama.cpp and uvicorn after 5 s); one closed sooner is not (a server that closes
# every connection at once would be asked in a loop)
_SPARE_RENEW_S = 1.0
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


def cut_socket(sock: HasFileno) -> None:
    """Ends a stream from our side at once, as a superseded request's is: the shutdown tells the server
    now, and its close (whenever it comes) is a reset. Done on a duplicate of the descriptor (the same
    socket): uvloop's stand-in for a transport's socket refuses `shutdown` with a TypeError."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as same:
        same.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        same.shutdown(socket.SHUT_RDWR)


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, telling the pool when the server closes the connection."""

    def __init__(self, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(reader, loop=loop)
        self.lost: Callable[[], None] | None = None

    def eof_received(self) -> bool:
        keep = bool(super().eof_received())
        if self.lost is not None:
            self.lost()
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.lost is not None:
            self.lost()


class Connection:
    """One open connection (TCP, or TLS): its asyncio stream, and the loop that reads it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        protocol: _Protocol,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.reader, self.writer, self._protocol, self.loop = reader, writer, protocol, loop
        self.opened_at = loop.time()

    def on_close(self, lost: Callable[[], None] | None) -> None:
        """`lost` is called (on the loop) when the server closes the connection."""
        self._protocol.lost = lost

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
        if on_loop(self.loop):
            self._cut()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: so has the connection
                self.loop.call_soon_threadsafe(self._cut)

    def _cut(self) -> None:
        # asyncio's abort closes the socket one turn of the loop later, after the rest of the keystroke's
        # work (the next request is sent before it): the server is told now.
        transport = self.writer.transport
        sock = transport.get_extra_info("socket")
        try:
            if sock is not None and not transport.is_closing():
                cut_socket(sock)
        finally:
            transport.abort()  # whatever the cut did: a superseded stream is never left open

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
            conn.on_close(None)
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
        reader = asyncio.StreamReader(loop=self.loop)
        protocol = _Protocol(reader, self.loop)
        connect = self.loop.create_connection(lambda: protocol, e.host, e.port, ssl=self._ssl)
        transport, _ = await asyncio.wait_for(connect, self.connect_timeout)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # asyncio's loop sets it, uvloop's too; a request must never wait for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        return Connection(reader, writer, protocol, self.loop)

    async def _warm(self) -> None:
        try:
            with contextlib.suppress(OSError, asyncio.TimeoutError):  # down: the next request says so
                fresh = await self._open()
                old, self._spare = self._spare, fresh
                fresh.on_close(lambda: self._spare_closed(fresh))
                if old is not None:
                    old.close()
        finally:
            self._warming = None

    def _spare_closed(self, conn: Connection) -> None:
        if conn is self._spare:
            self._spare = None
            conn.close()
            if self.loop.time() - conn.opened_at >= _SPARE_RENEW_S:
                self.replenish()

    def release(self, conn: Connection) -> None:
        """Back to the pool, after a response read to its end on a connection the server keeps open."""
        if not conn.stale and len(self._idle) < _IDLE_MAX:
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Closes the pool, and waits for the connection being opened, if any, to give up."""
        warming = self._warming
        self.close()
        if warming is not None:
            await asyncio.wait([warming], timeout=1.0)

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
