"""`lsp-dscoder bench --backend remote`: the protocol bench's keystroke session typed into
`lsp-dscoder --stdio --backend remote`, and the very same requests sent straight to the endpoint.

The server writes each request body it sends to a trace file (`LSP_DSCODER_REMOTE_TRACE`, after the
stream ends, off the measured path), with when it was submitted and when its stream was cut. Once the
session is over, those bodies are replayed in order, with the same pauses and cuts, by a bare
`http.client` client on an already-open connection: request written -> the streamed chunk whose text
the session showed first (the endpoint's first token may show nothing yet: a line break, indentation
held back until more comes; the trace says how many tokens the shown text took). Same token ids, same
cache state in the endpoint (greedy, same order), so per keystroke the difference between the client's
first partial and the direct time is what our server adds.

Without --endpoint, llama.cpp's server (built by `tests/remote/install_llama_server.sh`) is started on
the checkpoint converted to GGUF (remote_llama.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lsp_dscoder.bench_protocol import Plan, bench_server, null_round_trips
from lsp_dscoder.bench_report import distribution, print_head, print_null, print_row, sources
from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.remote_http import RemoteError
from lsp_dscoder.remote_llama import LlamaServer, convert
from lsp_dscoder.remote_pool import cut_socket
from lsp_dscoder.remote_stream import parse_chunk
from lsp_dscoder.remote_wire import TRACE_ENV

IDLE_S = 1.0  # a connection idle this long before its request is opened again


@dataclass(frozen=True)
class Direct:
    """One request sent straight to the endpoint."""

    head_ms: float  # request written -> response head read
    ttft_ms: float | None  # request written -> the chunk with the shown text (None: it did not come)
    cached: int | None  # prompt tokens from the endpoint's cache (llama.cpp `timings.cache_n`)
    processed: int | None  # prompt tokens it computed (`timings.prompt_n`)


def _connect(host: str, port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def send_direct(
    conn: http.client.HTTPConnection,
    path: str,
    body: bytes,
    at: float,
    cut_s: float | None,
    shown: int | None = None,
    at_end: bool = False,
) -> tuple[Direct, float, http.client.HTTPConnection | None]:
    """`body` sent on `conn` at `at` (time.perf_counter), as the session sent it after the one before;
    the stream is read until it ends, or cut `cut_s` after the request was written, as the session cut it.
    Timed to the chunk that brings the endpoint's `shown`-th token (None: the first chunk with text), or,
    `at_end`, to the stream's end (the session's answer showed the first text).
    Like the server, it opens the next request's connection once the first text has come (None: no text
    came). Returns the times, when the request was written, and that connection."""
    while (wait := at - time.perf_counter()) > 0:
        time.sleep(wait)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    started = time.perf_counter()
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    head = (time.perf_counter() - started) * 1000.0
    ttft: float | None = None
    tokens = 0  # the endpoint's tokens so far (chunks with text, where it sends no ids)
    spare: http.client.HTTPConnection | None = None
    timings: dict[str, Any] = {}
    assert conn.sock is not None
    with contextlib.suppress(TimeoutError):
        while True:
            if cut_s is not None:
                conn.sock.settimeout(max(1e-4, started + cut_s - time.perf_counter()))
            line = response.readline()
            if ttft is None and at_end and (not line or line.startswith(b"data: [DONE]")):
                ttft = (time.perf_counter() - started) * 1000.0
            if not line:
                break
            if not line.startswith(b"data: {"):
                continue
            try:
                chunk = parse_chunk(line[6:].decode())
            except RemoteError:  # the endpoint's error event: the stream ends there
                break
            tokens += len(chunk.token_ids) if chunk.token_ids is not None else bool(chunk.text)
            if ttft is None and not at_end and (tokens >= shown if shown is not None else bool(chunk.text)):
                ttft = (time.perf_counter() - started) * 1000.0
            if spare is None and chunk.text:
                spare = _connect(*conn.sock.getpeername()[:2])
            timings = dict(chunk.timings) if chunk.timings else timings
    cut_socket(conn.sock)  # as the server cuts a superseded stream (`Connection.abort`)
    conn.close()
    return Direct(head, ttft, timings.get("cache_n"), timings.get("prompt_n")), started, spare


def replay(endpoint: str, trace: Path) -> list[tuple[dict[str, Any], Direct]]:
    """Every traced request sent again to the endpoint, in the order the server submitted them, with the
    same time from one to the next, and cut when the session cut it (a superseded request's stream is cut
    at the keystroke's didChange, before the next request is sent): an endpoint still generating for the
    cut request finishes its step before it starts the next one, and one that idles between keystrokes
    answers more slowly than one asked back to back (its threads sleep, its caches go cold)."""
    entries = sorted(
        (json.loads(line) for line in trace.read_text().splitlines() if line), key=lambda e: e["seq"]
    )
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/").removesuffix("/v1") + "/v1/completions"
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    out = []
    at = time.perf_counter()
    conn: http.client.HTTPConnection | None = None
    for entry, after in zip(entries, [*entries[1:], None], strict=True):
        # servers close idle connections (llama.cpp after 5 s): one that waited long is opened again
        if conn is None or at - time.perf_counter() > IDLE_S:
            if conn is not None:
                conn.close()
            while (wait := at - 0.05 - time.perf_counter()) > 0:
                time.sleep(wait)
            conn = _connect(host, port)
        nxt = None if after is None else after["submitted"] - entry["submitted"]
        cut = entry.get("cut")
        cut_s = nxt if cut is None else cut - entry["submitted"]
        data = json.dumps(entry["body"], separators=(",", ":")).encode()
        shown, at_end = entry.get("shownTokens"), bool(entry.get("shownAtEnd"))
        direct, written, conn = send_direct(conn, path, data, at, cut_s, shown, at_end)
        out.append((entry, direct))
        at = written + (nxt or 0.0)
    if conn is not None:
        conn.close()
    return out


def pair(documents: list[dict[str, Any]], direct: list[tuple[dict[str, Any], Direct]]) -> None:
    """Adds to each document the direct times of its engine keystrokes and the rows built from them.
    The server submitted, per document, its cold request and then each engine keystroke, in order."""
    queue = iter(direct)
    for doc in documents:
        next(queue, None)  # the cold request
        rows: dict[str, list[Any]] = {name: [] for name, _ in ROWS}
        stages: dict[str, list[float]] = {}
        same = 0
        for key in doc["keys"]:
            record = key["record"]
            if record.get("source") != "engine":
                continue
            entry, d = next(queue, ({}, Direct(0.0, None, None, None)))
            same += len(entry.get("body", {}).get("prompt", ())) == record.get("promptTokens")
            through, server = key.get("client_ms"), record.get("firstPartialMs")
            rows["direct_ttft_ms"].append(d.ttft_ms)
            rows["direct_head_ms"].append(d.head_ms)
            rows["through_ms"].append(through)
            rows["direct_processed_tokens"].append(d.processed)
            rows["cached_tokens"].append(record.get("reusedTokens"))
            rows["processed_tokens"].append(record.get("prefilledTokens"))
            rows["shown_tokens"].append(entry.get("shownTokens"))
            if through is not None and d.ttft_ms is not None:
                rows["overhead_ms"].append(through - d.ttft_ms)
            if through is None or server is None or not entry.get("stagesMs"):
                continue
            ours = {_PIPES: through - server, "prompt": record.get("promptMs")}
            ours.update(entry["stagesMs"])
            ours["published -> partial sent"] = server - sum(v or 0.0 for k, v in ours.items() if k != _PIPES)
            endpoint = sum(entry["stagesMs"].get(k, 0.0) for k in _ENDPOINT)
            rows["own_ms"].append(through - endpoint)  # as the direct time: written -> first chunk read
            for name, value in ours.items():
                stages.setdefault(name, []).append(value)
        doc["remote"] = {name: distribution(values) for name, values in rows.items()}
        doc["remote"]["same_prompt_length"] = same
        doc["remote"]["stages_ms"] = {name: distribution(values)["p50"] for name, values in stages.items()}


_PIPES = "pipes and JSON-RPC (client - server)"
# the request's send -> the chunk with the first text read, as our server saw it. The send is the
# endpoint's, as on the direct client's clock: on loopback the kernel delivers the bytes inside it, and on a
# machine with few cores the endpoint's woken threads may run there before it returns.
_ENDPOINT = ("send", "response", "firstChunk")


ROWS = (
    ("direct_head_ms", "direct: request written -> response head"),
    ("direct_ttft_ms", "direct: request written -> the chunk with the text shown first"),
    ("through_ms", "through lsp-dscoder: keystroke -> first partial"),
    ("overhead_ms", "difference per keystroke (our overhead)"),
    ("own_ms", "through, less the endpoint's share seen by our server"),
    ("cached_tokens", "endpoint's cached prompt tokens, per keystroke"),
    ("processed_tokens", "endpoint's computed prompt tokens, per keystroke"),
    ("shown_tokens", "endpoint's tokens up to the text shown first, per keystroke"),
    ("direct_processed_tokens", "direct: computed prompt tokens, per keystroke"),
)


def print_remote(report: dict[str, Any]) -> None:
    docs = report["documents"]
    print(f"\n## {report['endpoint']} (tokenizer {report['model']})")
    print_head(docs)
    for key, name in ROWS:
        print_row(name, (d["remote"][key] for d in docs))
    for key, name in (("round_trip_ms", "bare round trip (dscoder/stats)"),
                      ("client_memory_ms", "typed through (from memory)")):  # fmt: skip
        print_row(name, (d[key] for d in docs))
    ours = [d["remote"]["own_ms"] for d in docs]
    print_null(report["null_round_trip_ms"], report["plan"]["interval_s"], ours)
    for d in docs:
        print(
            f"{d['size']}: {d['keystrokes']} keystrokes ({sources(d)}), {d['answered']} answered, "
            f"{d['errors']} errors, {d['stale']} stale; direct prompts of the same length: "
            f"{d['remote']['same_prompt_length']}"
        )
    for d in docs:
        stages = ", ".join(f"{k} {v:.3f}" for k, v in d["remote"]["stages_ms"].items() if v is not None)
        print(f"{d['size']}: p50 ms per stage (send, response, firstChunk: the endpoint's share): {stages}")


def run_remote(args: argparse.Namespace) -> int:
    plan = Plan.of(args)
    if plan is None:
        return 2
    folder = Path(args.model) if args.model else default_model_path()
    with tempfile.TemporaryDirectory() as tmp, _endpoint(args.endpoint, folder, Path(tmp)) as endpoint:
        trace = Path(tmp) / "trace.jsonl"
        argv = ["env", f"{TRACE_ENV}={trace}", sys.executable, "-m", "lsp_dscoder", "--stdio", "--log-level"]
        argv += ["info", "--backend", "remote", "--endpoint", endpoint, "--model", str(folder)]
        argv += ["--remote-model", args.remote_model] if args.remote_model else []
        settings = json.loads(args.settings)
        # llama.cpp reports its cache counts in every chunk: a keystroke cut by the next one has them too
        settings.setdefault("remoteRequest", {}).setdefault("timings_per_token", True)
        result = asyncio.run(bench_server(argv, folder, plan, settings))
        pair(result["documents"], replay(endpoint, trace))
        result["null_round_trip_ms"] = asyncio.run(null_round_trips(plan))
    report = {"endpoint": endpoint, "model": str(folder), "plan": plan.__dict__, **result}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_remote(report)
    return 0


@contextlib.contextmanager
def _endpoint(url: str | None, folder: Path, tmp: Path) -> Iterator[str]:
    if url is not None:
        yield url
        return
    server = LlamaServer(convert(folder, tmp / "model.gguf"), tmp / "llama-server.log", slots=1).start()
    try:
        yield server.url
    finally:
        server.kill()
