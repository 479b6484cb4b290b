"""What the remote backend writes: token-id prompts encoded only past the document's previous prompt (and
exactly as json would), the HTTP request bytes, and `bench --backend remote` end to end against llama.cpp:
every keystroke through our server paired with the very same request sent directly."""

from __future__ import annotations

import argparse
import json
from array import array
from pathlib import Path

import pytest

from lsp_dscoder.bench_remote import run_remote
from lsp_dscoder.engine.prefix import common_prefix
from lsp_dscoder.remote_http import Endpoint
from lsp_dscoder.remote_wire import PromptIds, Wire, post_bytes
from tests.remote.llama_server import LlamaServer


def test_common_prefix() -> None:
    long = list(range(100))
    assert common_prefix(long, [*long[:97], 5]) == 97  # typing: within the last few ids
    assert common_prefix(long, [*long[:40], 7, *long[41:]]) == 40  # an edit far above the cursor
    assert common_prefix(long, long[:60]) == 60
    assert common_prefix([], long) == 0
    assert common_prefix([3, 1], [2, 1]) == 0


def test_prompt_ids_reencode_only_the_tail_and_check_its_range() -> None:
    prompts = PromptIds(vocab_size=1000)
    first = [1, 20, 300, 999]
    assert prompts.encode("a.py", first) == b"[1,20,300,999]"
    assert prompts.encode("a.py", [1, 20, 301]) == b"[1,20,301]"  # the healed tail re-tokenised
    assert prompts.encode("b.py", [7]) == b"[7]"
    assert prompts.encode("a.py", [1, 20, 301, 4, 5]) == b"[1,20,301,4,5]"
    assert prompts.encode("a.py", []) == b"[]"
    with pytest.raises(ValueError, match="token id 1000 is outside the vocabulary"):
        prompts.encode("a.py", [1, 1000])
    for n in (0, 1, 17, 250):  # whatever the history, the text is json's
        ids = list(range(n, 2 * n))
        assert json.loads(prompts.encode("c.py", ids)) == ids


def test_post_bytes_is_one_http_request() -> None:
    data = post_bytes(
        Endpoint.parse("http://h:8000/v1"), "/v1/completions", {"Authorization": "Bearer k"}, b"{}"
    )
    assert data == (
        b"POST /v1/completions HTTP/1.1\r\nHost: h:8000\r\nAccept: text/event-stream\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}"
    )


def test_trace_line_says_which_endpoint_token_the_first_partial_showed() -> None:
    """The bench's replay times each request to the endpoint token whose text the session showed first:
    the healed tokens lead the completion's events and are not the endpoint's."""
    body = b'{"prompt":[1,2,3],"stream":true}'
    wire = Wire(array("i", [1, 2, 3]), heal_ids=[3], data=b"POST /\r\n\r\n" + body, head=10)
    assert json.loads(wire.trace_line(7, 1.5, None)) == {
        "seq": 7, "submitted": 1.5, "stagesMs": None, "cut": None, "shownTokens": None,
        "shownAtEnd": False, "firstTimings": None, "body": {"prompt": [1, 2, 3], "stream": True},
    }  # fmt: skip
    wire.clock.mark("firstChunk")
    wire.shown_at(2)  # events 0 (healed), 1 (nothing to show yet), 2 (shown)
    line = json.loads(wire.trace_line(8, 2.0, 2.25))
    assert (line["shownTokens"], line["shownAtEnd"], line["cut"]) == (2, False, 2.25)
    assert set(line["stagesMs"]) == {"firstChunk"}
    wire.shown_at(4, end=True)  # nothing showed until the answer, after the fourth endpoint token
    assert json.loads(wire.trace_line(9, 3.0, None))["shownTokens"] == 4
    wire.shown_at(None)  # not sent by the stream's reader: the replay falls back to the first text
    assert json.loads(wire.trace_line(10, 3.0, None))["shownTokens"] is None


@pytest.mark.slow
def test_bench_pairs_each_keystroke_with_the_same_request_sent_directly(
    llama: LlamaServer, bundled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        endpoint=llama.url, remote_model=None, model=str(bundled), sizes="1k", keystrokes=6,
        interval_ms=50.0, round_trips=2, settings="{}", json=True, request_delay_ms=0.0,
    )  # fmt: skip
    assert run_remote(args) == 0
    report = json.loads(capsys.readouterr().out)
    (doc,) = report["documents"]
    engine = [k for k in doc["keys"] if k["record"].get("source") == "engine"]
    remote = doc["remote"]
    assert doc["answered"] == 6 and doc["errors"] == 0 and doc["stale"] == 0
    assert remote["same_prompt_length"] == len(engine) > 0  # the replayed bodies are the ones sent
    assert remote["through_ms"]["n"] == len(engine)
    assert remote["processed_tokens"]["p50"] <= 3  # a keystroke computes its new tokens only
    assert set(remote["stages_ms"]) >= {"encode", "write", "send", "response", "firstChunk", "parse"}
    # over stdio the first partial goes out from the stream's reader: the trace names its token
    assert remote["shown_tokens"]["n"] > 0 and remote["shown_tokens"]["p50"] >= 1
    assert report["null_round_trip_ms"]["n"] == 2  # the floor: one per --round-trips
