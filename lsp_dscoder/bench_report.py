"""What `lsp-dscoder bench --protocol` reports: per document, the counts that prove the session ran as
intended (every keystroke answered, nothing stale) and p50/p90 of each latency, client and server side.
The p50/p90 table's pieces serve `--backend remote`'s report too (bench_remote.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lsp_dscoder.stats import percentiles

if TYPE_CHECKING:
    from lsp_dscoder.bench_client import Call, RpcClient
    from lsp_dscoder.bench_docs import Document
    from lsp_dscoder.bench_protocol import Key

REQUEST_CANCELLED = -32800
# The engine's count of decode steps after the first sampled token before the first visible text
# (`CompletionStats.steps_to_text`), under the names the server's log line may give it.
STEPS_KEYS = ("stepsToText", "steps_to_text", "stepsBeforePartial")
ROWS = (
    ("round_trip_ms", "bare round trip (dscoder/stats, no records)"),
    ("client_engine_ms", "client: first partial, engine keystrokes"),
    ("server_first_partial_ms", "server: firstPartialMs, engine keystrokes"),
    ("engine_ttft_ms", "engine TTFT (first sampled token)"),
    ("engine_text_ms", "engine first visible text"),
    ("queue_ms", "engine queue (submit to generation start)"),
    ("stopping_ms", "of it, waiting for a running generation to stop"),
    ("early_ms", "engine request sent from the didChange: ms before the request"),
    ("client_minus_text_ms", "client first partial - engine first text (our path)"),
    ("client_minus_server_ms", "client - server firstPartial (pipes, framing, edit)"),
    ("steps_before_partial", "decode steps before the first partial"),
    ("prefilled_tokens", "tokens prefilled per engine keystroke"),
    ("client_memory_ms", "client: typed through (from memory)"),
)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def distribution(values: Iterable[float | int | None]) -> dict[str, Any]:
    kept = [float(v) for v in values if v is not None]
    p = percentiles(deque(kept))
    return {"p50": p["p50"], "p90": p["p90"], "n": len(kept)}


def _stale(call: Call) -> int:
    """Partials of `call` for a document version other than the one it was sent for."""
    return sum(1 for _, params in call.partials if params.get("version") != call.version)


def summarize(
    doc: Document, cold: Call, trips: list[Call], keys: list[Key], client: RpcClient
) -> dict[str, Any]:
    records = [client.records.get(k.call.id, {}) for k in keys]
    source = [r.get("source", "missing") for r in records]
    engine = [(k, r) for k, r, s in zip(keys, records, source, strict=True) if s == "engine"]
    memory = [k for k, s in zip(keys, source, strict=True) if s == "memory"]
    responses = [k.call.response for k in keys if k.call.response is not None]
    steps_key = next((key for key in STEPS_KEYS if any(key in r for _, r in engine)), None)
    client_ms = {k.call.id: _ms(k.call.first_read - k.call.written) for k in keys if k.call.first_read}
    return {
        "tokens": doc.tokens,
        "chars": len(doc.text),
        "keystrokes": len(keys),
        "answered": len(responses),
        "cancels_sent": sum(k.cancel for k in keys),
        "cancelled": sum(1 for r in responses if r.get("error", {}).get("code") == REQUEST_CANCELLED),
        "errors": sum(1 for r in responses if "error" in r and r["error"].get("code") != REQUEST_CANCELLED),
        "suggestions": sum(1 for r in responses if (r.get("result") or {}).get("items")),
        "stale": sum(_stale(k.call) for k in keys) + len(client.unknown),
        "typed_through": sum(k.through for k in keys),
        # engine keystrokes whose first partial went out from the engine's thread (first_text.py)
        "early_partials": sum(1 for _, r in engine if r.get("firstPartialEarly") is True),
        "sources": {s: source.count(s) for s in ("engine", "memory", "none", "missing")},
        "cold_ms": _ms((cold.first_read or cold.written) - cold.written),
        "cold_record": client.records.get(cold.id),
        "steps_key": steps_key,
        "round_trip_ms": distribution(_ms(c.response_read - c.written) for c in trips if c.response_read),
        "client_engine_ms": distribution(client_ms.get(k.call.id) for k, _ in engine),
        "server_first_partial_ms": distribution(r.get("firstPartialMs") for _, r in engine),
        "engine_ttft_ms": distribution(r.get("engineTtftMs") for _, r in engine),
        "engine_text_ms": distribution(r.get("engineTextMs") for _, r in engine),
        "queue_ms": distribution(r.get("queueMs") for _, r in engine),
        "stopping_ms": distribution(r.get("stoppingMs") for _, r in engine),
        "early_ms": distribution(r.get("earlyMs") for _, r in engine),
        # The engine's own part is generation start -> first visible text; everything else the user
        # waited for is ours: pipes, framing, the edit, prompt, submit (queue included), the hop back, write.
        "client_minus_text_ms": distribution(
            client_ms[k.call.id] - r["engineTextMs"]
            for k, r in engine
            if k.call.id in client_ms and r.get("engineTextMs") is not None
        ),
        "client_minus_server_ms": distribution(
            client_ms[k.call.id] - r["firstPartialMs"]
            for k, r in engine
            if k.call.id in client_ms and r.get("firstPartialMs") is not None
        ),
        "steps_before_partial": distribution(r.get(steps_key) for _, r in engine)
        if steps_key
        else distribution(()),
        "prefilled_tokens": distribution(r.get("prefilledTokens") for _, r in engine),
        "client_memory_ms": distribution(client_ms.get(k.call.id) for k in memory),
        "keys": [  # each keystroke as sent and as the server recorded it
            {"typed": k.typed, "through": k.through, "client_ms": client_ms.get(k.call.id), "record": r}
            for k, r in zip(keys, records, strict=True)
        ],
    }


def _engine_replays(w: dict[str, Any]) -> str:
    if not w.get("engine_replays"):
        return ""
    share = 100 * w["engine_busy_ms"] / 1e3 / w["typing_s"]
    return f"; engine thread: {w['engine_replays']} replays, {w['engine_busy_ms']:.0f} ms ({share:.1f} %)"


def cell(d: dict[str, Any]) -> str:
    """A table cell of a `distribution`: p50 / p90 and the count, or "n/a" without values."""
    if not d["n"]:
        return "n/a"
    return f"{d['p50']:.2f} / {d['p90']:.2f} (n={d['n']})"


def print_head(docs: list[dict[str, Any]]) -> None:
    """The header of a p50 / p90 table with a column per document."""
    print("| p50 / p90 ms | " + " | ".join(f"{d['size']} ({d['tokens']} tokens)" for d in docs) + " |")
    print("|---|" + "---|" * len(docs))


def print_row(name: str, cells: Iterable[dict[str, Any]]) -> None:
    """A row of that table: one `distribution` per document."""
    print(f"| {name} | " + " | ".join(cell(d) for d in cells) + " |")


def sources(doc: dict[str, Any]) -> str:
    """What answered a document's keystrokes, with the count of each (those that answered any)."""
    return ", ".join(f"{k} {v}" for k, v in doc["sources"].items() if v)


def print_null(floor: dict[str, Any], interval_s: float, ours: list[dict[str, Any]]) -> None:
    """The null server's round trip (bench_null.py: the pipes and the processes' wake-ups, no work) and
    how far our path's p50 (or our share's, remote) is above it, per document."""
    if not floor["n"]:  # --round-trips 0
        return
    beyond = ", ".join(f"{d['p50'] - floor['p50']:.2f}" if d["n"] else "n/a" for d in ours)
    print(
        f"null JSON-RPC server (no work), a request every {1e3 * interval_s:.0f} ms: round trip "
        f"{cell(floor)}; ours above it (p50s): {beyond} ms"
    )


def print_report(report: dict[str, Any]) -> None:
    for r in report["results"]:
        docs = r["documents"]
        print(f"\n## {r['model']} ({r['device']}, {r['dtype'] or 'server default dtype'})")
        print_head(docs)
        for key, name in ROWS:
            print_row(name, (d.get(key) or {"n": 0} for d in docs))
        print("| cold prompt (first request), ms | " + " | ".join(f"{d['cold_ms']:.1f}" for d in docs) + " |")
        ours = [d["client_minus_text_ms"] for d in docs]
        print_null(r["null_round_trip_ms"], report["plan"]["interval_s"], ours)
        for d in docs:
            print(
                f"{d['size']}: {d['keystrokes']} keystrokes, {d['answered']} answered "
                f"({d['suggestions']} with a suggestion, {d['cancelled']} cancelled, {d['errors']} errors), "
                f"{d['stale']} stale; {d['typed_through']} typed through; sources: {sources(d)}; "
                f"first partial from the engine's thread: {d['early_partials']} of "
                f"{d['sources']['engine']} engine keystrokes"
            )
            if (w := d.get("keep_warm")) and w["replays"]:
                print(
                    f"{d['size']}: keep warm every {w['interval_ms']} ms while typing: "
                    f"{w['replays']} replays, "
                    f"{w['busy_ms']:.0f} ms busy over {w['typing_s']:.1f} s of typing "
                    f"({100 * w['busy_ms'] / 1e3 / w['typing_s']:.1f} % of one core, "
                    f"{1e3 * w['busy_ms'] / w['replays']:.0f} us a replay)" + _engine_replays(w)
                )
