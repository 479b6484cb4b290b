"""`lsp-dscoder bench --protocol`: a typing session through a real `lsp-dscoder --stdio` process.

Per document size (generated Python of ~1K/8K/64K tokens): open it, ask once (the cold prompt, not
counted), time bare round trips (`dscoder/stats` asking for no request records), then type keystrokes.
A keystroke is one write of `didChange` + `$/cancelRequest` of the previous request (if still
unanswered) + `inlineCompletion` (with `--request-delay-ms`, the request goes that long after the
rest, as from a client that debounces its requests); the next one starts once this one is answered
(first partial or response) and `--interval-ms` has passed since it was written. Two keystrokes in every
four type the first character of the suggestion shown, when one is shown: the server answers those from
memory. Client times are request written → first `dscoder/partialCompletion` or response read; the
server's own times come from its request log line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsp_dscoder.bench_client import Call, RpcClient
from lsp_dscoder.bench_docs import SCRIPT, Document, generate, write_random_checkpoint
from lsp_dscoder.bench_report import distribution, print_report, summarize

INLINE = "textDocument/inlineCompletion"
NULL_SERVER = [sys.executable, "-m", "lsp_dscoder.bench_null"]
SIZES = {"1k": 1024, "8k": 8192, "64k": 65536}
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Plan:
    sizes: tuple[str, ...]
    keystrokes: int
    interval_s: float
    round_trips: int
    timeout_s: float = TIMEOUT_S
    request_delay_s: float = 0.0  # from a keystroke's didChange to its request (a client's debounce)

    @staticmethod
    def of(args: argparse.Namespace) -> Plan | None:
        """The plan the command line asks for; None (and the reason on stderr) for bad sizes or counts."""
        sizes = tuple(s.strip().lower() for s in args.sizes.split(","))
        if any(s not in SIZES for s in sizes) or args.keystrokes < 1:
            print(f"lsp-dscoder: error: --sizes takes {', '.join(SIZES)}; --keystrokes >= 1", file=sys.stderr)
            return None
        interval_s, delay_s = args.interval_ms / 1000.0, args.request_delay_ms / 1000.0
        return Plan(sizes, args.keystrokes, interval_s, args.round_trips, request_delay_s=delay_s)


@dataclass
class Key:
    call: Call
    typed: str
    through: bool  # typed the first character of the suggestion shown
    cancel: bool  # a $/cancelRequest of the previous request went with it


def add_protocol_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--sizes", default="1k,8k,64k", help="document sizes in tokens: comma list of 1k, 8k, 64k")
    g.add_argument("--keystrokes", type=int, default=40, help="keystrokes per document")
    g.add_argument(
        "--interval-ms", type=float, default=100.0, help="least time from one keystroke to the next"
    )
    g.add_argument(
        "--round-trips",
        type=int,
        default=20,
        help="bare round trips per document, and to a server that does no work (the pipes' floor) per run",
    )
    g.add_argument(
        "--request-delay-ms",
        type=float,
        default=0.0,
        help="send each keystroke's request this long after its didChange, as a client that debounces "
        "its requests does (VS Code: 50); 0: in the same write",
    )
    g.add_argument("--device", help="server --device (default: cpu; with --shapes: auto)")
    g.add_argument("--dtype", help="server --dtype (default: the server's)")
    g.add_argument("--settings", default="{}", help="initializationOptions as JSON")


def _position(text: str, offset: int) -> dict[str, int]:
    """LSP position of `offset` in an ASCII document (UTF-16 columns are characters there)."""
    line = text.count("\n", 0, offset)
    return {"line": line, "character": offset - (text.rfind("\n", 0, offset) + 1)}


def _inline(uri: str, text: str, cursor: int) -> dict[str, Any]:
    # triggerKind 2: automatic, as editors ask while the user types
    return {"textDocument": {"uri": uri}, "position": _position(text, cursor), "context": {"triggerKind": 2}}


async def wait_ready(client: RpcClient, timeout: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        stats = await client.call("dscoder/stats", None)
        if stats["engineState"] == "ready":
            return dict(stats)
        if stats["engineState"] == "failed" or loop.time() > deadline:
            raise RuntimeError(f"engine not ready ({stats['engineState']}): {stats.get('engineError')}")
        await asyncio.sleep(0.2)


async def type_document(client: RpcClient, uri: str, doc: Document, plan: Plan) -> dict[str, Any]:
    text, cursor, version = doc.text, doc.cursor, 1
    item = {"uri": uri, "languageId": "python", "version": version, "text": text}
    await client.notify("textDocument/didOpen", {"textDocument": item})
    cold = await client.request(INLINE, _inline(uri, text, cursor), version=version)
    await client.wait(cold, plan.timeout_s)
    trips = []
    for _ in range(plan.round_trips):
        c = await client.request("dscoder/stats", {"recent": 0})
        await client.wait(c, plan.timeout_s)
        trips.append(c)
    keys: list[Key] = []
    previous, script = cold, 0
    warm_before, typing_from = await _keep_warm(client, plan), time.monotonic()
    for k in range(plan.keystrokes):
        shown = previous.shown
        through = bool(shown) and shown[0] not in "\r\n" and k % 4 in (2, 3)
        ch = shown[0] if through else SCRIPT[script % len(SCRIPT)]
        script += not through
        at = _position(text, cursor)
        text, cursor, version = text[:cursor] + ch + text[cursor:], cursor + 1, version + 1
        change = {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": at, "end": at}, "text": ch}],
        }
        before = [{"method": "textDocument/didChange", "params": change}]
        if not previous.done.is_set():
            before.append({"method": "$/cancelRequest", "params": {"id": previous.id}})
        cancel = len(before) == 2
        if plan.request_delay_s:
            await client.send(*before)
            await asyncio.sleep(plan.request_delay_s)
            before = []
        c = await client.request(INLINE, _inline(uri, text, cursor), *before, version=version)
        keys.append(Key(c, ch, through, cancel))
        await client.wait(c, plan.timeout_s, first=True)
        await asyncio.sleep(max(0.0, c.written + plan.interval_s - time.monotonic()))
        previous = c
    for key in keys:
        await client.wait(key.call, plan.timeout_s)
    typing_s = time.monotonic() - typing_from
    warm_after = await _keep_warm(client, plan)
    await _records(client, [cold, *(key.call for key in keys)], plan.timeout_s)
    await client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    warm = {
        "interval_ms": warm_after["intervalMs"],
        "replays": warm_after["replays"] - warm_before["replays"],
        "busy_ms": warm_after["busyMs"] - warm_before["busyMs"],
        "engine_replays": warm_after["engineReplays"] - warm_before["engineReplays"],
        "engine_busy_ms": warm_after["engineBusyMs"] - warm_before["engineBusyMs"],
        "typing_s": typing_s,
    }
    return {**summarize(doc, cold, trips, keys, client), "keep_warm": warm}


async def null_round_trips(plan: Plan) -> dict[str, Any]:
    """Round trips to a server that does no work (bench_null.py), one every `--interval-ms` as the
    keystrokes go, through the same client: the pipes and the two processes' wake-ups, the floor under the
    server's path on this machine. `plan.round_trips` of them, after one that starts the process."""
    client = await RpcClient.start(NULL_SERVER)
    times = []
    try:
        for n in range(plan.round_trips + 1):
            c = await client.request("dscoder/stats", None)
            await client.wait(c, plan.timeout_s)
            if n and c.response_read is not None:
                times.append(1e3 * (c.response_read - c.written))
            await asyncio.sleep(max(0.0, c.written + plan.interval_s - time.monotonic()))
    finally:
        code = await client.close()
    if code:
        raise RuntimeError(f"the null server exited with {code}: " + "\n".join(client.stderr_tail))
    return distribution(times)


async def _keep_warm(client: RpcClient, plan: Plan) -> dict[str, Any]:
    """The keep-warm counters of the server (keep_warm.py) and of the engine thread (engine/warm.py),
    read by a stats request (itself not a keystroke)."""
    c = await client.request("dscoder/stats", {"recent": 0})
    await client.wait(c, plan.timeout_s)
    assert c.response is not None
    result = c.response["result"]
    engine = result.get("engine") or {}  # the engine thread's own replays (a remote backend has none)
    none = {"intervalMs": 0, "replays": 0, "busyMs": 0.0}  # a server without replays (protocol_ab.py)
    return {
        **result.get("keepWarm", none),
        "engineReplays": engine.get("warm_replays", 0),
        "engineBusyMs": engine.get("warm_busy_ms", 0.0),
    }


async def _records(client: RpcClient, calls: list[Call], timeout: float) -> None:
    """Until the server has logged every request (an engine request logs when its generation ends)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while any(c.id not in client.records for c in calls) and loop.time() < deadline:
        await asyncio.sleep(0.05)


async def bench_server(argv: list[str], folder: Path, plan: Plan, settings: dict[str, Any]) -> dict[str, Any]:
    """One server process: every document size in `plan`, in order."""
    client = await RpcClient.start(argv)
    try:
        caps = {"general": {"positionEncodings": ["utf-16"]}, "textDocument": {"inlineCompletion": {}}}
        init = {"processId": None, "rootUri": None, "capabilities": caps, "initializationOptions": settings}
        await client.call("initialize", init, plan.timeout_s)
        await client.notify("initialized", {})
        stats = await wait_ready(client, plan.timeout_s)
        docs = []
        for size in plan.sizes:
            doc = generate(folder / "tokenizer.json", SIZES[size])
            uri = f"file:///bench/generated_{size}.py"
            docs.append({"size": size, **await type_document(client, uri, doc, plan)})
        return {"server": argv, "settings": stats.get("settings"), "documents": docs}
    finally:
        code = await client.close()
        if code:
            print("\n".join(client.stderr_tail), file=sys.stderr)


def awq_twin(model: tuple[str, Path, str], tmp: Path, group_size: int) -> tuple[str, Path, str]:
    """The model quantized to INT4 AWQ by `lsp-dscoder quantize --method rtn` (activation-aware scales
    would be searched on random weights for nothing): the same weights, the packed fast path."""
    from lsp_dscoder.engine.config import resolve
    from lsp_dscoder.quantize import QuantizeOptions, quantize_checkpoint

    label, folder, device = model
    dst = tmp / f"{folder.name}-awq"
    where, _ = resolve(device, None)  # the server's own reading of "auto"
    quantize_checkpoint(folder, dst, QuantizeOptions(group_size=group_size, method="rtn", device=where))
    return f"{label}, INT4 AWQ (RTN, group {group_size})", dst, device


def server_argv(folder: Path, device: str | None, dtype: str | None) -> list[str]:
    argv = [sys.executable, "-m", "lsp_dscoder", "--stdio", "--model", str(folder), "--log-level", "info"]
    argv += ["--device", device] if device else []
    return argv + (["--dtype", dtype] if dtype else [])


def run_protocol(args: argparse.Namespace) -> int:
    from lsp_dscoder.bench import hf_config
    from lsp_dscoder.bundled import default_model_path

    plan = Plan.of(args)
    if plan is None:
        return 2
    settings = json.loads(args.settings)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.shapes:
            models = []
            for shape in args.shapes.split(","):
                folder = write_random_checkpoint(Path(tmp) / shape, hf_config(shape), default_model_path())
                label = f"DeepSeek-Coder {shape} shape, random weights"
                models.append((label, folder, args.device or "auto"))
        else:
            folder = Path(args.model) if args.model else default_model_path()
            models = [(str(folder), folder, args.device or "cpu")]
        if args.quant == "awq":  # each model again as INT4 AWQ, right after it
            models = [m for model in models for m in (model, awq_twin(model, Path(tmp), args.group_size))]
        for label, folder, device in models:
            argv = server_argv(folder, device, args.dtype)
            result = asyncio.run(bench_server(argv, folder, plan, settings))
            result["null_round_trip_ms"] = asyncio.run(null_round_trips(plan))
            results.append({"model": label, "device": device, "dtype": args.dtype, **result})
    report = {"plan": plan.__dict__, "results": results}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0
