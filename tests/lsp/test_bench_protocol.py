"""`lsp-dscoder bench --protocol`: its report's structure and counts on the tiny checkpoint (never its
timings), the server log lines its client reads, and the documents it types into."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lsp_dscoder.bench_client import parse_record
from lsp_dscoder.bench_docs import SCRIPT, generate
from lsp_dscoder.stats import Outcome, Source, Stats
from tests.tiny import make_checkpoint

KEYSTROKES = 8
ROUND_TRIPS = 3


@pytest.mark.slow
@pytest.mark.parametrize("delay_ms", [0, 30])
def test_protocol_bench_answers_every_keystroke(tiny_model: Path, delay_ms: int) -> None:
    """With `--request-delay-ms` each request goes after its didChange, as VS Code's do: the server has
    started every engine keystroke's suggestion from the didChange (`earlyMs` in its record); in one write
    it has started none."""
    argv = [sys.executable, "-m", "lsp_dscoder", "bench", "--protocol", "--model", str(tiny_model)]
    argv += ["--sizes", "1k", "--keystrokes", str(KEYSTROKES), "--interval-ms", "0"]
    argv += ["--round-trips", str(ROUND_TRIPS), "--request-delay-ms", str(delay_ms), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["plan"]["sizes"] == ["1k"] and report["plan"]["keystrokes"] == KEYSTROKES
    (result,) = report["results"]
    assert result["device"] == "cpu"
    (doc,) = result["documents"]
    assert doc["size"] == "1k" and doc["tokens"] >= 1024
    assert doc["keystrokes"] == doc["answered"] == KEYSTROKES
    assert doc["stale"] == 0 and doc["errors"] == 0
    sources = doc["sources"]
    assert sources["missing"] == 0 and sum(sources.values()) == KEYSTROKES
    assert doc["cold_record"]["source"] == "engine" and doc["cold_record"]["v"] == 1
    assert doc["round_trip_ms"]["n"] == ROUND_TRIPS
    assert result["null_round_trip_ms"]["n"] == ROUND_TRIPS  # the pipes' floor, once per server
    assert doc["client_engine_ms"]["n"] == sources["engine"]
    assert doc["client_memory_ms"]["n"] == sources["memory"]
    assert doc["engine_ttft_ms"]["n"] <= sources["engine"]
    assert 0 <= doc["cancels_sent"] < KEYSTROKES  # the first keystroke's previous request was answered
    keys = doc["keys"]
    assert len(keys) == KEYSTROKES and sum(k["through"] for k in keys) == doc["typed_through"]
    assert [k["record"]["v"] for k in keys] == list(range(2, KEYSTROKES + 2))  # one version per keystroke
    engine = [k["record"] for k in keys if k["record"]["source"] == "engine"]
    # a keystroke that stopped a running suggestion waited for it inside its queue time
    stopping = [(r["stoppingMs"], r["queueMs"]) for r in engine if r.get("stoppingMs") is not None]
    assert doc["stopping_ms"]["n"] == len(stopping) and all(0 < s < q for s, q in stopping), stopping
    early = [r.get("earlyMs") for r in engine]
    assert len(early) == sources["engine"] > 0
    if delay_ms:
        assert all(e is not None and e > 0 for e in early), early
        assert doc["early_ms"]["n"] == sources["engine"]
    else:
        assert early == [None] * len(early) and doc["early_ms"]["n"] == 0


def test_client_reads_the_servers_request_log_line() -> None:
    clock = iter([10.0, 10.002, 10.004, 11.0, 11.001]).__next__
    stats = Stats(clock=clock)
    record = stats.begin(42, "file:///a.py", 7)
    record.source = Source.MEMORY
    record.partial_sent()
    record.responded(Outcome.OK)
    parsed = parse_record("2026-11-30 12:00:00,000 INFO lsp_dscoder.requests: " + record.log_line())
    assert parsed is not None
    assert parsed["id"] == 42 and parsed["uri"] == "file:///a.py" and parsed["v"] == 7
    assert parsed["source"] == "memory" and parsed["outcome"] == "ok"
    assert parsed["firstPartialMs"] == pytest.approx(2.0) and parsed["responseMs"] == pytest.approx(4.0)
    assert parsed["firstPartialEarly"] is False  # JSON's false in the line, read back as a bool
    early = stats.begin(43, "file:///a.py", 8)
    early.partial_sent(early=True)
    assert parse_record(early.log_line())["firstPartialEarly"] is True
    assert parse_record("INFO lsp_dscoder.protocol: load: ready 1/1") is None


def test_generated_document_size_and_cursor(tiny_model: Path) -> None:
    doc = generate(tiny_model / "tokenizer.json", 1024)
    assert 1024 <= doc.tokens < 1024 + 400  # whole blocks: the last one overshoots by less than a block
    assert doc.text[: doc.cursor].endswith("\n    total = 0") and doc.text[doc.cursor] == "\n"
    assert 0.6 * len(doc.text) <= doc.cursor
    assert generate(tiny_model / "tokenizer.json", 1024) == doc  # seeded: the same text every run
    assert SCRIPT.startswith("\n")


def test_awq_twin_is_the_checkpoint_quantized_to_int4(tmp_path: Path) -> None:
    from lsp_dscoder.bench_protocol import awq_twin
    from lsp_dscoder.engine.config import ModelConfig

    # Widths that group size 32 divides (the default tiny model's 176 does not).
    tiny_model = make_checkpoint(tmp_path / "dense", hidden_size=64, intermediate_size=192)
    label, folder, device = awq_twin(("tiny", tiny_model, "cpu"), tmp_path, 32)
    assert (label, device) == ("tiny, INT4 AWQ (RTN, group 32)", "cpu")
    quant = json.loads((folder / "config.json").read_text())["quantization_config"]
    fields = (quant["quant_method"], quant["bits"], quant["group_size"], quant["version"])
    assert fields == ("awq", 4, 32, "gemm")
    assert ModelConfig.from_file(folder / "config.json").quantization is not None  # the engine reads it back
    assert (folder / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
