"""`python -m lsp_dscoder.bench_null`, the server that does no work under `bench --protocol`'s floor:
a real process on real pipes, read by the bench's own client."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from lsp_dscoder.bench_client import RpcClient
from lsp_dscoder.bench_protocol import NULL_SERVER, Plan, null_round_trips
from lsp_dscoder.bench_report import print_null


async def _session() -> tuple[list[dict[str, object]], int, list[str]]:
    client = await RpcClient.start(NULL_SERVER)
    await client.notify("textDocument/didChange", {"textDocument": {"uri": "file:///a.py", "version": 2}})
    transport = client.transport
    assert transport is not None
    stdin = transport.get_pipe_transport(0)
    stdin.write(b"Content-Length: 9\r\n\r\nnot json!")  # a body that does not parse: skipped
    first = await client.request("textDocument/inlineCompletion", {"position": {"line": 0, "character": 0}})
    second = await client.request("dscoder/stats", None)
    await client.wait(second, 30.0)
    await client.wait(first, 30.0)
    responses = [c.response for c in (first, second) if c.response is not None]
    unknown = [json.dumps(m) for m in client.unknown]
    code = await client.close()
    return responses, code, unknown


def test_every_request_is_answered_null_and_nothing_else_is_sent() -> None:
    responses, code, unknown = asyncio.run(_session())
    assert responses == [
        {"jsonrpc": "2.0", "id": 1, "result": None},
        {"jsonrpc": "2.0", "id": 2, "result": None},
    ]
    assert unknown == []  # nothing for the notification or the bad body: no message for an unknown id
    assert code == 0  # `shutdown` answered, `exit` ends it


def test_round_trips_are_counted_and_the_server_exits() -> None:
    plan = Plan(sizes=("1k",), keystrokes=1, interval_s=0.01, round_trips=4)
    floor = asyncio.run(null_round_trips(plan))
    assert floor["n"] == 4
    assert 0 < floor["p50"] <= floor["p90"]


def test_the_report_line_sets_our_path_against_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    floor = {"p50": 0.4, "p90": 0.9, "n": 20}
    ours = [{"p50": 1.25, "p90": 2.0, "n": 21}, {"p50": None, "p90": None, "n": 0}]
    print_null(floor, 0.1, ours)
    print_null({"p50": None, "p90": None, "n": 0}, 0.1, ours)  # --round-trips 0: nothing to set it against
    assert capsys.readouterr().out == (
        "null JSON-RPC server (no work), a request every 100 ms: round trip 0.40 / 0.90 (n=20); "
        "ours above it (p50s): 0.85, n/a ms\n"
    )


def test_stdin_that_is_a_file_or_dev_null_is_read_plainly(tmp_path: Path) -> None:
    """The event loop refuses regular files and devices (uvloop aborts the process): read them plainly."""
    body = b'{"jsonrpc":"2.0","id":5,"method":"x"}'
    requests = tmp_path / "requests"
    requests.write_bytes(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    for stdin in (requests, Path(os.devnull)):
        with stdin.open("rb") as f:
            done = subprocess.run(NULL_SERVER, stdin=f, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        reply = b'{"jsonrpc": "2.0", "id": 5, "result": null}'
        expected = b"Content-Length: %d\r\n\r\n%b" % (len(reply), reply) if stdin == requests else b""
        assert done.stdout == expected
