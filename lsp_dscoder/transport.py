"""The wire below pygls: stdio and TCP transports on the event loop, with our own framing.

pygls' stdio reader does a thread-pool round trip per header line and per body, trusts every header, and
goes deaf for good after one badly framed message; over TCP it accepts a second client that then receives
the first one's responses. Here bytes arrive through asyncio transports (`connect_read_pipe` for stdin: one
callback per chunk, no thread), `framing.Framer` resynchronises after bad input, and each message's
envelope is checked before pygls structures it (a bad request gets an InvalidRequest reply). Responses are
written to the file descriptor at once. The TCP server has one client: any other connection is closed at
once, and the server stops when its client leaves.

The loop is stopped, not drained, at exit: a model still loading in a thread is not waited for (the
caller ends the process once it has cleaned up).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import select
import socket
import stat
import threading
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO, cast

from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.server import JsonRPCServer

from lsp_dscoder.framing import Framer, HeaderTooLong

log = logging.getLogger(__name__)
READ_SIZE = 1 << 16
Seen = Callable[[Any, bytes], None]


class ListenError(Exception):
    """The TCP server could not listen (e.g. the port is in use); the message says where and why."""


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (an optional extra), asyncio's otherwise."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def envelope_problem(data: Any) -> str | None:
    """Why `data` is not a JSON-RPC 2.0 message, or None."""
    if not isinstance(data, dict):
        return f"a message must be a JSON object, got {type(data).__name__}"
    if data.get("jsonrpc") != "2.0":
        return "'jsonrpc' must be \"2.0\""
    if "id" in data and not _valid_id(data["id"]):
        return "'id' must be an integer or a string"
    if "method" in data:
        if not isinstance(data["method"], str):
            return "'method' must be a string"
        if not isinstance(data.get("params"), dict | list | None):
            return "'params' must be an object or an array"
    elif "result" not in data and "error" not in data:
        return "a message needs a 'method', a 'result' or an 'error'"
    return None


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


class Dispatcher:
    """Hands each message body to pygls; returns False once the server has been told to exit. `seen`
    (method, body) is told of each well-formed message first."""

    def __init__(self, server: JsonRPCServer, seen: Seen | None = None) -> None:
        self._server = server
        self._seen = seen

    def __call__(self, body: bytes) -> bool:
        protocol = self._server.protocol
        try:
            data = json.loads(body)
        except ValueError as exc:  # not JSON, or not UTF-8
            self._server.report_server_error(exc, JsonRpcException)
            return True
        if (problem := envelope_problem(data)) is not None:
            self._refuse(data, problem)
            return True
        if self._seen is not None:
            self._seen(data.get("method"), body)
        try:
            protocol.handle_message(protocol.structure_message(data))
        except SystemExit:  # pygls ends the `exit` notification with sys.exit()
            return False
        except JsonRpcException as exc:  # a notification whose params do not parse: no one to answer
            self._server.report_server_error(exc, JsonRpcException)
        except Exception as exc:  # a defect in a handler: keep serving the others
            log.exception("could not handle %s", data.get("method", "a response"))
            self._server.report_server_error(exc, JsonRpcException)
        return True

    def _refuse(self, data: Any, problem: str) -> None:
        if isinstance(data, dict):
            request = "id" in data and ("method" in data or not {"result", "error"} & data.keys())
            if not request:  # a notification or a response: there is no one to answer
                self._server.report_server_error(JsonRpcInvalidRequest(problem), JsonRpcException)
                return
        msg_id = data["id"] if isinstance(data, dict) and _valid_id(data["id"]) else None  # JSON-RPC: null
        log.warning("invalid request %s: %s", msg_id, problem)
        error = JsonRpcInvalidRequest(problem).to_response_error()
        self._server.protocol._send_response(msg_id, error=error)  # type: ignore[arg-type]


class PipeWriter:
    """Writes each message to a file descriptor at once: no buffer, no hop to another thread. Any thread
    may write (a suggestion's first text goes out from the engine's: first_text.py); a lock keeps each
    message whole. When the reader has gone (EPIPE), writing stops quietly and `lost()` is called once,
    from whichever thread found it."""

    any_thread = True

    def __init__(self, fd: int, lost: Callable[[], None]) -> None:
        self._fd = fd
        self._lost = lost
        self._closed = False
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        with self._lock:
            while view and not self._closed:
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:  # a terminal shared with non-blocking stdin
                    select.select([], [self._fd], [])
                except OSError as exc:
                    log.info("the client stopped reading (%s): stopping", exc.strerror)
                    self._closed = True
                    self._lost()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)


class SocketWriter:
    """pygls' writer interface on an asyncio transport (the event loop's thread only); writes after the
    client left are dropped."""

    any_thread = False

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._transport.close()


class Wire(asyncio.Protocol):
    """One client's byte stream: frames it, dispatches each message, and resolves `done` when the
    client leaves, is dropped, or the server is told to exit."""

    def __init__(self, dispatch: Callable[[bytes], bool], done: asyncio.Future[None], *, tcp: bool) -> None:
        self._dispatch = dispatch
        self._done = done
        self._framer = Framer(self._skipped, overlong_is_fatal=tcp)
        self.transport: asyncio.BaseTransport | None = None
        self.ended = False

    @staticmethod
    def _skipped(reason: str) -> None:
        log.warning("skipped badly framed input (%s): reading on from the next header", reason)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.ended:
            return
        try:
            bodies = self._framer.feed(data)
        except HeaderTooLong as exc:
            log.warning("dropped the client: %s", exc)
            self.end()
            return
        for body in bodies:
            if not self._dispatch(body):
                self.end()
                return

    def eof_received(self) -> bool:
        if self._framer.pending and not self.ended:
            log.info("the client left in the middle of a message (%d bytes)", self._framer.pending)
        self.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.end()

    def end(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.close()
        if not self._done.done():
            self._done.set_result(None)


def serve_stdio(server: JsonRPCServer, stdin: BinaryIO, stdout_fd: int, seen: Seen | None = None) -> None:
    """Serve one client on stdin and `stdout_fd` until it exits or closes either pipe."""

    def writer(wire: Wire) -> None:
        loop = asyncio.get_running_loop()

        def lost() -> None:  # found by a write on any thread: the wire ends on the loop's
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody left to tell
                loop.call_soon_threadsafe(wire.end)

        server.protocol.set_writer(PipeWriter(stdout_fd, lost))

    read_stdin(stdin, Dispatcher(server, seen), writer)


def read_stdin(
    stdin: BinaryIO, dispatch: Callable[[bytes], bool], ready: Callable[[Wire], None] | None = None
) -> None:
    """Frame `stdin` on an event loop of `new_loop()` and hand each message body to `dispatch` (False:
    stop reading) until it ends. `ready(wire)` is called on the loop before the first read."""
    loop = new_loop()

    async def main() -> None:
        done: asyncio.Future[None] = loop.create_future()
        wire = Wire(dispatch, done, tcp=False)
        if ready is not None:
            ready(wire)
        fd = stdin.fileno()
        was_blocking = os.get_blocking(fd)
        pump: asyncio.Future[None] | None = None  # held: the loop keeps only a weak reference to tasks
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
            await loop.connect_read_pipe(lambda: wire, stdin)
        else:  # a regular file or a device such as /dev/null, which epoll refuses: read it off the loop
            pump = asyncio.ensure_future(_pump_file(loop, fd, wire))
        try:
            await done
        finally:
            os.set_blocking(fd, was_blocking)  # a terminal must not stay non-blocking for the shell
            if pump is not None:
                pump.cancel()

    _run(loop, main())


async def _pump_file(loop: asyncio.AbstractEventLoop, fd: int, wire: Wire) -> None:
    while not wire.ended and (data := await loop.run_in_executor(None, os.read, fd, READ_SIZE)):
        wire.data_received(data)
    wire.eof_received()


def serve_tcp(server: JsonRPCServer, host: str, port: int, seen: Seen | None = None) -> None:
    """Serve the first client that connects until it leaves; refuse every other connection meanwhile.
    Raises ListenError when the address cannot be bound."""
    loop = new_loop()

    async def main() -> None:
        done: asyncio.Future[None] = loop.create_future()
        refusals = 0
        client: Wire | None = None

        def connection() -> asyncio.Protocol:
            nonlocal client
            if client is None:
                client = _Client(Dispatcher(server, seen), done, server)
                return client
            refusals_made()
            return _Refused()

        def refusals_made() -> None:
            nonlocal refusals
            refusals += 1
            level = logging.WARNING if refusals == 1 else logging.INFO
            log.log(level, "refused a second client (%d so far): the server has one client", refusals)

        try:
            listener = await loop.create_server(connection, host, port)
        except OSError as exc:
            if isinstance(exc, socket.gaierror):  # getaddrinfo's codes are not errno values
                reason = f"{host!r} is not an address or host name of this machine ({exc.strerror})"
            else:
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
        log.info("listening on %s:%d", host, port)
        try:
            await done
        finally:
            listener.close()

    _run(loop, main())


class _Client(Wire):
    def __init__(self, dispatch: Callable[[bytes], bool], done: asyncio.Future[None], server: JsonRPCServer):
        super().__init__(dispatch, done, tcp=True)
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # a socket transport writes (uvloop's do not subclass asyncio.WriteTransport)
        self._server.protocol.set_writer(SocketWriter(cast(asyncio.WriteTransport, transport)))
        log.info("client connected from %s", transport.get_extra_info("peername"))


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _run(loop: asyncio.AbstractEventLoop, main: Coroutine[Any, Any, None]) -> None:
    """Run `main`, then cancel what is left without waiting for threads (a model load may be stuck in
    one: the caller ends the process). The loop is closed only when no other thread could use it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        asyncio.set_event_loop(None)
        if threading.active_count() == 1:
            loop.close()
