"""The TCP transport: one client at a time, the server gone when its client leaves (even mid-message), and
a port or host it cannot listen on refused in one line. A raw client speaks to a real `lsp-dscoder`."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.lsp.test_transport import WAIT_S, Raw, command, frame, stats, stderr_lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def tcp_server(model: Path) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *command(model, "--tcp", "--port", str(port)), stderr=asyncio.subprocess.PIPE
    )
    return process, port


async def tcp_client(process: asyncio.subprocess.Process, port: int) -> tuple[Raw, asyncio.StreamWriter]:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            return Raw(reader, writer.write), writer
        except OSError:
            assert process.returncode is None and time.monotonic() < deadline, "the server did not listen"
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_second_tcp_client_is_refused_and_the_first_keeps_its_session(tiny_model):
    process, port = await tcp_server(tiny_model)
    first, first_writer = await tcp_client(process, port)
    await first.initialize()
    for attempt in range(2):
        second_reader, second_writer = await asyncio.open_connection("127.0.0.1", port)
        second_writer.write(frame(stats(50 + attempt)))
        try:
            received = await asyncio.wait_for(second_reader.read(), WAIT_S)
        except ConnectionResetError:  # closed before it read what the client sent
            received = b""
        assert received == b""  # closed at once, nothing sent
        second_writer.close()
        reply = await first.request(60 + attempt, "dscoder/stats", {})
        assert reply["result"]["engineState"] == "idle"
    first_writer.close()  # the client leaves: the server ends, as it did before
    assert await asyncio.wait_for(process.wait(), WAIT_S) == 0
    lines = await stderr_lines(process)
    assert [line.split(": ", 1)[1] for line in lines] == [
        "refused a second client (1 so far): the server has one client"
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "tail",
    [b'Content-Length: 500\r\n\r\n{"jsonrpc"', b"Content-Len", b"Content-Length: 1" + b"0" * 70_000],
    ids=["mid-body", "mid-header", "header line over 64 KiB"],
)
async def test_tcp_exits_when_the_client_leaves_mid_message(tiny_model, tail):
    process, port = await tcp_server(tiny_model)
    client, writer = await tcp_client(process, port)
    await client.initialize()
    writer.write(tail)
    await writer.drain()
    if len(tail) < 1000:
        writer.close()  # disconnect in the middle of a message
    assert await asyncio.wait_for(process.wait(), WAIT_S) == 0
    writer.close()


def test_tcp_port_in_use_is_one_line_and_exit_status_2(tiny_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            command(tiny_model, "--tcp", "--port", str(port)), capture_output=True, text=True, timeout=WAIT_S
        )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.rstrip().endswith(f"cannot listen on 127.0.0.1:{port}: Address already in use")


def test_tcp_host_that_is_no_address_is_one_line_and_exit_status_2(tiny_model):
    done = subprocess.run(
        command(tiny_model, "--tcp", "--host", "999.1.1.1", "--port", "2099"),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert (
        "cannot listen on 999.1.1.1:2099: '999.1.1.1' is not an address or host name of this machine ("
        in (done.stderr)
    )
