"""The remote backend's bytes: the request it writes is exactly json's encoding of the request (on the
first keystroke and on the next, whose prompt ids are encoded past the previous prompt only), and the
response parser reads heads, chunked bodies and server-sent events however the bytes are split."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.api import CompletionRequest, SamplingParams
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_config import RemoteConfig
from lsp_dscoder.remote_http import Body, Endpoint, Events, RemoteError, read_head
from lsp_dscoder.remote_wire import RequestWriter


def _writer(**config: object) -> RequestWriter:
    folder = Path(default_model_path())
    cfg = RemoteConfig(endpoint="http://127.0.0.1:8080/v1", tokenizer=folder, **config)  # type: ignore[arg-type]
    return RequestWriter(cfg, Endpoint.parse(cfg.endpoint), Tokenizer(folder), "sk-1")


def _split_request(data: bytes) -> tuple[list[str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n"), body


def test_request_bytes_are_json_of_the_request_keystroke_after_keystroke() -> None:
    writer = _writer(extra={"top_k": 1, "prompt": "never sent", "stream": False})
    ids = list(range(1000, 1300))
    params = SamplingParams(max_tokens=24, stop=("\n",))
    for prompt, p in ((ids, params), ([*ids, 7], params), ([*ids, 7, 8], SamplingParams(max_tokens=5))):
        wire = writer.wire(CompletionRequest(prompt_ids=tuple(prompt), params=p, slot_key="a.py"), "m")
        lines, body = _split_request(wire.data)
        expected = {
            "prompt": prompt,
            "top_k": 1,
            "stream": True,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stream_options": {"include_usage": True},
            "cache_prompt": True,
            "model": "m",
            **({"stop": list(p.stop)} if p.stop else {}),
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        assert body == json.dumps(expected, separators=(",", ":")).encode()
        assert lines == [
            "POST /v1/completions HTTP/1.1",
            "Host: 127.0.0.1:8080",
            "Accept: text/event-stream",
            "Content-Type: application/json",
            "Authorization: Bearer sk-1",
            f"Content-Length: {len(body)}",
        ]
        assert wire.head == len(wire.data) - len(body) and list(wire.ids) == prompt


def test_request_bytes_with_healed_text_and_the_model_list() -> None:
    writer = _writer()
    tok = writer.tokenizer
    request = CompletionRequest(
        prompt_ids=(tok.bos_id, 500), params=SamplingParams(max_tokens=3), slot_key="b.py", heal_text="def"
    )
    wire = writer.wire(request, None)
    assert wire.heal_ids == tok.encode("def") and list(wire.ids) == [tok.bos_id, 500, *tok.encode("def")]
    assert json.loads(_split_request(wire.data)[1])["prompt"] == list(wire.ids)
    assert "model" not in json.loads(_split_request(wire.data)[1])
    refused = (((1, 2.0), "token ids must be integers, got 2.0"), ((1, 2**64), "outside the vocabulary"))
    for bad, message in refused:
        with pytest.raises(EngineError, match=message):
            writer.wire(CompletionRequest(prompt_ids=bad, slot_key="b.py"), None)  # type: ignore[arg-type]
    assert writer.get_bytes("/v1/models") == (
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: text/event-stream\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer sk-1\r\nContent-Length: 0\r\n\r\n"
    )


STREAM = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"X-Odd:  spaced value \r\n\r\n"
)
EVENTS = [
    b": ping\n\n",
    'data: {"choices":[{"text":"caf\\u00e9 \\"q\\" \\ud83d\\ude00 \u4e2d"}]}\r\n\r\n'.encode(),
    b"data: line one\ndata: line two\n\n",
    b'error: {"message":"x"}\n\n',
    b"data: [DONE]\n\n",
]


def _chunked(parts: Sequence[bytes]) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nTrailer: t\r\n\r\n"


async def _read(data: bytes, step: int) -> tuple[int, dict[str, str], list[str], bool]:
    reader = asyncio.StreamReader()
    for i in range(0, len(data), step):  # as the bytes arrive: split anywhere
        reader.feed_data(data[i : i + step])
    reader.feed_eof()
    head = await read_head(reader)
    body = Body(reader, head)
    stream, events = Events(body), []
    while (event := await stream.next()) is not None:
        events.append(event)
    return head.status, head.headers, events, body.done


@pytest.mark.parametrize("step", [1, 3, 7, 1 << 16])
def test_stream_parsed_the_same_however_its_bytes_are_split(step: int) -> None:
    # an event split over two HTTP chunks, and two events in one chunk
    parts = [EVENTS[0] + EVENTS[1][:20], EVENTS[1][20:], EVENTS[2] + EVENTS[3], EVENTS[4]]
    status, headers, events, done = asyncio.run(_read(STREAM + _chunked(parts), step))
    assert status == 200 and done
    assert headers == {
        "content-type": "text/event-stream",
        "transfer-encoding": "chunked",
        "x-odd": "spaced value",
    }
    assert events == [
        '{"choices":[{"text":"caf\\u00e9 \\"q\\" \\ud83d\\ude00 \u4e2d"}]}',
        "line one\nline two",
        '{"error": "{\\"message\\":\\"x\\"}"}',
    ]
    assert json.loads(events[0])["choices"][0]["text"] == 'café "q" \U0001f600 中'


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (_chunked([EVENTS[1]])[:30], "ended before [DONE]"),  # cut inside a chunk
        (b"5\r\ndata:", "ended before [DONE]"),  # cut before a chunk's closing CRLF
        (b"zz\r\n", "malformed chunk size"),
        (_chunked([EVENTS[1]]), "ended before [DONE]"),  # a whole body, but no [DONE]
    ],
)
def test_streams_cut_or_malformed(tail: bytes, reason: str) -> None:
    with pytest.raises(RemoteError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        asyncio.run(_read(STREAM + tail, 5))


def test_heads_of_errors_and_lengths() -> None:
    async def head_and_body(data: bytes) -> tuple[int, bool, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        head = await read_head(reader)
        return head.status, head.will_close, await Body(reader, head).read_all()

    answer = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 7\r\nConnection: close\r\n\r\nbad keyEXTRA"
    assert asyncio.run(head_and_body(answer)) == (401, True, b"bad key")
    assert asyncio.run(head_and_body(b"HTTP/1.0 500 Boom\r\n\r\nuntil the end")) == (
        500,
        False,
        b"until the end",
    )
    with pytest.raises(ConnectionResetError):  # closed without answering: the request may go again
        asyncio.run(head_and_body(b""))
    with pytest.raises(RemoteError, match="malformed HTTP response"):
        asyncio.run(head_and_body(b"SSH-2.0-OpenSSH\r\n\r\n"))
