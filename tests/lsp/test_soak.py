"""Soak: 12,000 keystrokes over five documents against a real server (stdio, tiny checkpoint), typed in
bursts without waiting, each a didChange and an inlineCompletion. Memory stays flat and no answer is
stale. The client is raw JSON-RPC (no pygls), so the test measures the server, not a client library."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lsp.client import server_command

pytestmark = pytest.mark.slow

SNIPPET = "def step(self, x):\n    y = self.scale * x + 1\n    return y\n"
DOCUMENTS = 5
BURST = 24  # keystrokes typed into one document before waiting for its last answer
WARMUP = 1_000
KEYSTROKES = 10_000
RSS_GROWTH_LIMIT_KB = 8_000  # the leak this guards against: ~2 KB per keystroke (pygls kept a Future each)


class RawClient:
    """Content-Length framing over the server's stdio; responses and notifications in arrival order."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.arrivals: list[tuple[str, Any]] = []  # ("response", id) | ("partial", params)
        self.results: dict[int, Any] = {}
        self.errors: list[dict[str, Any]] = []
        self.reader = asyncio.ensure_future(self._read())

    def _write(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def notify(self, method: str, params: Any) -> None:
        self._write({"method": method, "params": params})

    def request(self, method: str, params: Any) -> tuple[int, asyncio.Future[Any]]:
        msg_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[msg_id] = future
        self._write({"id": msg_id, "method": method, "params": params})
        return msg_id, future

    async def call(self, method: str, params: Any) -> Any:
        return await asyncio.wait_for(self.request(method, params)[1], 60)

    async def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            header = await stream.readuntil(b"\r\n\r\n")
            length = int(header.split(b":")[1].split(b"\r\n")[0])
            message = json.loads(await stream.readexactly(length))
            if "id" in message and "method" not in message:
                self.arrivals.append(("response", message["id"]))
                self.results[message["id"]] = message.get("result")
                future = self.pending.pop(message["id"])
                if "error" in message:
                    self.errors.append(message["error"])
                future.set_result(message.get("result"))
            elif message.get("method") == "dscoder/partialCompletion":
                self.arrivals.append(("partial", message["params"]))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def type_keystrokes(
    client: RawClient, docs: list[dict[str, Any]], count: int, requests: dict[int, tuple[str, int]]
) -> None:
    for burst in range(count // BURST):
        doc = docs[burst % len(docs)]
        last = None
        for _ in range(BURST):
            line, character = doc["cursor"]
            at = {"line": line, "character": character}
            if doc["typed"] == len(SNIPPET):  # delete the snippet: documents (and prompts) stay small
                change = {"range": {"start": {"line": 1, "character": 0}, "end": at}, "text": ""}
                doc["typed"], doc["cursor"] = 0, (1, 0)
            else:
                ch = SNIPPET[doc["typed"]]
                change = {"range": {"start": at, "end": at}, "text": ch}
                doc["typed"] += 1
                doc["cursor"] = (line + 1, 0) if ch == "\n" else (line, character + 1)
            doc["version"] += 1
            ident = {"uri": doc["uri"], "version": doc["version"]}
            client.notify("textDocument/didChange", {"textDocument": ident, "contentChanges": [change]})
            position = {"line": doc["cursor"][0], "character": doc["cursor"][1]}
            params = {
                "textDocument": {"uri": doc["uri"]},
                "position": position,
                "context": {"triggerKind": 2},
            }
            msg_id, last = client.request("textDocument/inlineCompletion", params)
            requests[msg_id] = (doc["uri"], doc["version"])
        await asyncio.wait_for(last, 60)


def stale_answers(client: RawClient, requests: dict[int, tuple[str, int]]) -> list[Any]:
    """Answers (non-null responses, partials) for a request of a document after the server had already
    answered a later request of that document: it served the old text once it knew the new one."""
    newest: dict[str, int] = {}
    stale: list[Any] = []
    for kind, value in client.arrivals:
        msg_id = value if kind == "response" else value["requestId"]
        if msg_id not in requests:
            continue
        uri, _ = requests[msg_id]
        shown = client.results.get(msg_id) is not None if kind == "response" else True
        if shown and msg_id < newest.get(uri, 0):
            stale.append((kind, msg_id, value))
        if kind == "response":
            newest[uri] = max(newest.get(uri, 0), msg_id)
    return stale


async def test_soak_memory_is_flat_and_no_answer_is_stale(tiny_model):
    command = server_command(tiny_model, "--log-level", "warning")
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 20
    )
    client = RawClient(process)
    try:
        init = {
            "processId": None,
            "rootUri": None,
            "capabilities": {},
            "initializationOptions": {"maxTokens": 8},
        }
        await client.call("initialize", init)
        client.notify("initialized", {})
        while (await client.call("dscoder/stats", {}))["engineState"] != "ready":
            await asyncio.sleep(0.05)
        docs = [
            {"uri": f"file:///soak/m{i}.py", "version": 1, "typed": 0, "cursor": (1, 0)}
            for i in range(DOCUMENTS)
        ]
        for doc in docs:
            item = {
                "uri": doc["uri"],
                "languageId": "python",
                "version": 1,
                "text": f"# module {doc['uri']}\n",
            }
            client.notify("textDocument/didOpen", {"textDocument": item})
        requests: dict[int, tuple[str, int]] = {}
        await type_keystrokes(client, docs, WARMUP, requests)
        before = rss_kb(process.pid)
        await type_keystrokes(client, docs, KEYSTROKES, requests)
        growth = rss_kb(process.pid) - before
        stats = await client.call("dscoder/stats", {})
        assert stats["requests"]["counts"]["requests"] == len(requests)
        assert stats["requests"]["counts"].get("outcome_error", 0) == 0
        assert client.errors == []  # e.g. a position checked against text typed after the request
        assert stale_answers(client, requests) == []
        assert growth < RSS_GROWTH_LIMIT_KB, f"RSS grew {growth} KB over {KEYSTROKES} keystrokes"
        await client.call("shutdown", None)
        client.notify("exit", None)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        client.reader.cancel()
        if process.returncode is None:
            process.kill()
            await process.wait()
    print(f"soak: {len(requests)} keystrokes, RSS growth {growth} KB", file=sys.stderr)
