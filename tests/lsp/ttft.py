"""Time to first token through the protocol against the engine's own, on the same requests.

    python -m tests.lsp.ttft [--model DIR] [--requests N] [--server-arg=--device --server-arg=cuda]

Protocol TTFT is measured at the client: inlineCompletion sent -> first `dscoder/partialCompletion`
received. The server's record of the same request gives the engine's TTFT (generation start -> first
token), the queue wait and the time spent building the prompt. Two workloads: a fresh position per
request (the suffix and part of the prefix are prefilled), and typing (a keystroke per request, the
previous one cancelled: one or two tokens prefilled). Prints a table; asserts nothing.

This drives the server through pytest-lsp (a pygls client) and is what the editor-session test reuses;
the benchmark the project reports is `lsp-dscoder bench --protocol`, whose raw JSON-RPC client adds no
client library's time (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from lsp_dscoder.positions import Encoding, position_at
from tests.lsp.client import Editor, start

COLUMNS = ("protocol", "server", "prompt", "queue", "engine", "overhead")


async def measure(editor: Editor, request: Any) -> dict[str, Any]:
    await editor.first_partial(request)
    record = await editor.record(request)
    protocol_ms = (request.first_partial_at - request.sent_at) * 1000.0
    return {
        "protocol": protocol_ms,
        "server": record["firstPartialMs"],
        "prompt": record["promptMs"],
        "queue": record["queueMs"],
        "engine": record["engineTtftMs"],
        # None when the answer came from memory (the keystroke typed through the last suggestion)
        "overhead": None if record["engineTtftMs"] is None else protocol_ms - record["engineTtftMs"],
        "prefilled": record["prefilledTokens"],
        "reused": record["reusedTokens"],
    }


async def fresh_positions(editor: Editor, n: int) -> list[dict[str, Any]]:
    """A request at the end of a different line each time (the previous one has finished)."""
    text = inspect.getsource(json.decoder)
    doc = editor.open("file:///bench/decoder.py", text)
    lines = text.split("\n")
    rows = []
    for i in range(n):
        line = 40 + (i * 7) % (len(lines) - 80)
        request = editor.inline(doc, line, len(lines[line]))
        rows.append(await measure(editor, request))
        await request.result()
    return rows


async def typing(editor: Editor, n: int) -> list[dict[str, Any]]:
    """A keystroke per request, the previous request cancelled after its first partial."""
    text = inspect.getsource(json.decoder)
    doc = editor.open("file:///bench/typing.py", text)
    offset = text.index("\n", text.index("def py_scanstring")) + 1
    word = ("value = scan_once(string, idx) " * (n // 30 + 1))[:n]
    rows, previous = [], None
    for ch in word:
        line, character = position_at(doc.text, offset, Encoding.UTF16)
        if previous is not None:
            editor.cancel(previous)
        editor.insert(doc, offset, ch, line=line, character=character)
        offset += 1
        previous = editor.inline(doc, line, character + 1)
        rows.append(await measure(editor, previous))
    return rows


def summarize(name: str, rows: list[dict[str, Any]]) -> str:
    cells = []
    for key in COLUMNS:
        values = sorted(r[key] for r in rows if r[key] is not None)
        cells.append(f"{statistics.median(values):8.2f} {values[int(0.9 * (len(values) - 1))]:8.2f}")
    prefilled = statistics.median(r["prefilled"] for r in rows if r["prefilled"] is not None)
    return f"{name:<16}{len(rows):>4} " + " ".join(cells) + f" {prefilled:9.0f}"


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="checkpoint folder (default: a new tiny checkpoint)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--server-arg", action="append", default=[], help="extra server argument")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from tests.tiny import default_tiny

            args.model = default_tiny(Path(tmp))
        editor = await start(args.model, *args.server_arg, init={"maxTokens": 32, "responseMode": "full"})
        try:
            fresh = await fresh_positions(editor, args.requests)
            typed = await typing(editor, args.requests)
        finally:
            await editor.client.shutdown_session()
            await editor.client.stop()
    header = " ".join(f"{c + ' p50':>8} {'p90':>8}" for c in COLUMNS)
    print(f"{'ms':<16}{'n':>4} {header} {'prefilled':>9}")
    print(summarize("fresh position", fresh))
    print(summarize("typing", typed))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
