"""The remote backend's connections, against a real socket on loopback: a cut stream reaches the server
before the event loop turns again."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop

from lsp_dscoder.remote_http import Endpoint
from lsp_dscoder.remote_pool import ConnectionPool

# the server runs on uvloop's loop where it is installed (lsp_dscoder/transport.py), on asyncio's otherwise
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.mark.parametrize("loop", LOOPS)
def test_an_aborted_connection_is_cut_before_the_loop_turns(loop: str) -> None:
    """A keystroke cuts the stream it supersedes and then sends its own request in the same turn of the
    loop: the server must see the cut first, not one turn later (asyncio closes an aborted transport's
    socket only then). Checked from the server's side while the loop is still inside that turn."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        async def cut_and_read() -> bytes | type[ConnectionResetError]:
            pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{port}"), 2.0, asyncio.get_running_loop())
            conn = await pool.acquire()
            peer, _ = listener.accept()
            with peer:
                conn.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                peer.settimeout(2.0)
                assert peer.recv(100).startswith(b"GET / ")
                conn.abort()  # the loop does not turn before the read below
                try:
                    return peer.recv(100)  # the end of the stream: b""
                except ConnectionResetError:
                    return ConnectionResetError
                finally:
                    pool.close()

        factory: Callable[[], asyncio.AbstractEventLoop] = LOOPS[loop]
        with asyncio.Runner(loop_factory=factory) as runner:
            assert runner.run(cut_and_read()) in (b"", ConnectionResetError)
