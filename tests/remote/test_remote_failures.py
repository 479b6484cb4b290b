"""The remote backend against an endpoint that fails: nothing listening, HTTP errors, streams dropped,
garbage, silence. Each request ends with what was streamed so far; the endpoint is marked unreachable,
announced once, refused without network until its backoff has passed, and found again by the probe."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.api import CompletionRequest, SamplingParams, StopReason
from lsp_dscoder.remote import RemoteBackend, RemoteConfig
from lsp_dscoder.remote_http import Endpoint, EndpointDownError
from tests.remote.bad_server import BadServer
from tests.remote.llama_server import free_port

PROMPT = (0, 5, 6, 7)  # token ids: the bad server does not read them


@pytest.fixture
def server() -> Iterator[BadServer]:
    s = BadServer()
    yield s
    s.close()


class Notes:
    def __init__(self) -> None:
        self.messages: list[tuple[int, str]] = []

    def __call__(self, level: int, message: str) -> None:
        self.messages.append((level, message))


def _backend(url: str, notes: Notes, **kw: object) -> RemoteBackend:
    config = RemoteConfig(
        endpoint=url,
        tokenizer=Path(default_model_path()),
        connect_timeout_s=1.0,
        first_token_timeout_s=1.0,
        read_timeout_s=0.5,
        **kw,  # type: ignore[arg-type]
    )
    return RemoteBackend(config, notes)


def _wait(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _request(max_tokens: int = 16) -> CompletionRequest:
    return CompletionRequest(prompt_ids=PROMPT, params=SamplingParams(max_tokens=max_tokens))


def test_endpoint_url_parsing() -> None:
    assert Endpoint.parse("http://127.0.0.1:8080/v1/") == Endpoint("http", "127.0.0.1", 8080, "")
    assert Endpoint.parse("https://gpu.example/serve/v1") == Endpoint("https", "gpu.example", 443, "/serve")
    assert Endpoint.parse("http://h:1/x").path("/v1/completions") == "/x/v1/completions"
    with pytest.raises(ValueError, match="ftp://h"):
        Endpoint.parse("ftp://h")
    with pytest.raises(ValueError, match="credentials"):
        Endpoint.parse("http://user:pw@h:1")
    # A bad port or IPv6 host is refused here, with the other settings, not at the first connection.
    with pytest.raises(ValueError, match=r"got 'http://127.0.0.1:99999': Port out of range 0-65535"):
        Endpoint.parse("http://127.0.0.1:99999")
    with pytest.raises(ValueError, match=r"got 'http://\[::1:80': Invalid IPv6 URL"):
        Endpoint.parse("http://[::1:80")
    assert Endpoint.parse("http://[::1]:8080").authority == "[::1]:8080"


def test_streamed_ids_decoded_locally_and_connection_kept_alive(server: BadServer) -> None:
    tok_text = [(2311, None), (2312, None), (2313, None)]
    notes = Notes()
    with _backend(server.url, notes) as backend:
        ids = [t for t, _ in tok_text]
        server.pieces = [(t, backend.tokenizer.decode([t])) for t in ids]
        _wait(lambda: backend.model == "bad-model")  # the load-time probe learned the model name
        first = backend.complete(_request())
        second = backend.complete(_request())
        assert first.token_ids == second.token_ids == tuple(ids)
        assert first.text == backend.tokenizer.decode(ids)
        assert first.stats.stop_reason is StopReason.MAX_TOKENS
        assert first.stats.backend == {"timings": {"cache_n": 0}}
        # The load-time probe connected; the requests found kept-alive connections (and a spare).
        assert server.record.connections == 2 and backend.stats()["connectsOnRequestPath"] == 1
        body = server.record.requests[0]
        assert body["prompt"] == list(PROMPT) and body["stream"] is True and body["model"] == "bad-model"
        assert body["logprobs"] == 1 and body["max_tokens"] == 16
        assert backend.stats()["reachable"] is True and notes.messages == []


def test_api_key_from_the_environment_is_sent_and_never_logged(
    server: BadServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DSCODER_TEST_KEY", "sk-secret-123")
    caplog.set_level(logging.DEBUG)
    server.mode = "http401"
    notes = Notes()
    with _backend(server.url, notes, api_key_env="DSCODER_TEST_KEY") as backend:
        result = backend.complete(_request())
        assert result.stats.stop_reason is StopReason.ERROR and result.text == ""
        assert server.record.headers[-1]["authorization"] == "Bearer sk-secret-123"
        # A refusal (4xx) is the request's or the configuration's fault: the endpoint stays reachable.
        assert backend.stats()["reachable"] is True
        backend.complete(_request())
        assert len(notes.messages) == 1 and "HTTP 401" in notes.messages[0][1]
        assert "sk-secret-123" not in caplog.text + repr(backend.stats()) + repr(notes.messages)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("drop", "ended before [DONE]"),
        ("garbage", "not JSON"),
        ("error_event", "out of memory"),
        ("stall", "did not answer in time"),
    ],
)
def test_stream_failing_midway_keeps_what_was_streamed(server: BadServer, mode: str, reason: str) -> None:
    notes = Notes()
    with _backend(server.url, notes) as backend:
        ids = [2311, 2312, 2313]
        server.pieces = [(t, backend.tokenizer.decode([t])) for t in ids]
        _wait(lambda: backend.model is not None)
        server.mode = mode
        handle = backend.submit(_request())
        events = list(handle)  # what the editor saw streamed
        result = handle.result()
        assert [e.token_id for e in events if e.token_id is not None] == ids[:2]
        assert result.text == backend.tokenizer.decode(ids[:2])
        assert result.stats.stop_reason is StopReason.ERROR and reason in (result.error or "")
        stats = backend.stats()
        assert stats["reachable"] is False and reason in stats["lastError"]
        # While the backoff runs, a keystroke gets nothing at once and sends nothing.
        sent = len(server.record.requests)
        with pytest.raises(EndpointDownError, match="retrying in"):
            backend.submit(_request())
        assert len(server.record.requests) == sent
        assert [level for level, _ in notes.messages] == [logging.WARNING]
        # The probe finds the endpoint serving again after the first backoff (0.5 s).
        server.mode = "ok"
        _wait(lambda: backend.stats()["reachable"])
        assert backend.complete(_request()).token_ids == tuple(ids)
        again = f"dscoder: the completion endpoint {server.url} is working again"
        assert notes.messages[-1] == (logging.INFO, again) and len(notes.messages) == 2


def test_http_500_and_silence_mark_the_endpoint_down(server: BadServer) -> None:
    notes = Notes()
    with _backend(server.url, notes) as backend:
        _wait(lambda: backend.model is not None)
        server.mode = "http500"
        result = backend.complete(_request())
        assert result.stats.stop_reason is StopReason.ERROR and "HTTP 500" in (result.error or "")
        assert backend.stats()["reachable"] is False
        time.sleep(0.6)  # past the first backoff: the next keystroke is the retry
        server.mode = "silent"
        started = time.monotonic()
        result = backend.complete(_request())
        assert "did not answer in time" in (result.error or "")
        assert 0.9 < time.monotonic() - started < 3.0  # first_token_timeout_s = 1
        assert len(notes.messages) == 1  # one outage, one message


def test_nothing_listening(caplog: pytest.LogCaptureFixture) -> None:
    notes = Notes()
    url = f"http://127.0.0.1:{free_port()}"
    with _backend(url, notes) as backend:
        _wait(lambda: notes.messages)
        stats = backend.stats()
        assert stats["reachable"] is False and stats["lastError"] == f"nothing is listening at {url}"
        assert notes.messages == [
            (logging.WARNING, f"dscoder: the completion endpoint failed: nothing is listening at {url}")
        ]
        with pytest.raises(EndpointDownError, match="nothing is listening"):
            backend.submit(_request())
        _wait(lambda: backend.stats()["failures"] >= 3)  # probes go on, on a doubling schedule
        assert len(notes.messages) == 1


def test_cancel_cuts_the_stream_and_warms_a_new_connection(server: BadServer) -> None:
    notes = Notes()
    with _backend(server.url, notes) as backend:
        _wait(lambda: backend.model is not None)
        server.mode = "stall"
        handle = backend.submit(_request())
        events = iter(handle)
        next(events)
        next(events)
        handle.cancel()
        result = handle.result(timeout=2)
        assert result.stats.stop_reason is StopReason.CANCELLED and result.error is None
        _wait(lambda: server.record.closed_by_client == 1)  # the engine saw the client go at once
        _wait(lambda: backend.stats()["connectionsOpened"] == 2)  # a spare for the next keystroke
        assert backend.stats()["reachable"] is True and notes.messages == []


def test_a_spare_connection_the_server_closed_while_idle_is_opened_again(server: BadServer) -> None:
    server.idle_close_s = 1.2  # llama.cpp and uvicorn close idle connections after 5 s
    with _backend(server.url, Notes()) as backend:
        _wait(lambda: backend.model is not None)  # the probe's connection, kept idle, and a spare
        _wait(lambda: server.record.closed_idle == 2 and backend.stats()["connectionsOpened"] == 3)
        result = backend.complete(_request())  # on the spare opened again: no handshake on the way
        assert result.token_ids == (100, 101, 102) and backend.stats()["connectsOnRequestPath"] == 1


def test_text_prompt_spells_the_fim_markers_and_leaves_bos_to_the_endpoint(server: BadServer) -> None:
    with _backend(server.url, Notes(), token_ids=False) as backend:
        tok = backend.tokenizer
        ids = [tok.bos_id, tok.fim_begin_id, *tok.encode("x = 1\n"), tok.fim_hole_id, tok.fim_end_id]
        server.pieces = [(0, "y"), (0, " = 2")]  # text only: no ids are asked for in text mode
        server.pieces_have_ids = False
        result = backend.complete(
            CompletionRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=8))
        )
        body = server.record.requests[-1]
        assert body["prompt"] == "<｜fim▁begin｜>x = 1\n<｜fim▁hole｜><｜fim▁end｜>"
        assert "logprobs" not in body
        assert (result.text, result.token_ids) == ("y = 2", ())


def test_a_named_api_key_that_is_not_set_is_shown_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSCODER_TEST_NO_KEY", raising=False)
    notes = Notes()
    url = f"http://127.0.0.1:{free_port()}"
    with _backend(url, notes, api_key_env="DSCODER_TEST_NO_KEY"):
        message = "dscoder: environment variable DSCODER_TEST_NO_KEY is empty: requests go without an API key"
        assert notes.messages[0] == (logging.WARNING, message)
        _wait(lambda: len(notes.messages) == 2)  # the first probe's outage: no probe left in flight
        assert [m for _, m in notes.messages].count(message) == 1


def test_the_server_exits_at_once_after_shutdown_and_exit() -> None:
    """The remote backend's connections are closed as the server stops, not by a drain left to a loop
    that no longer runs (which held every exit for its 5 s timeout)."""
    url = f"http://127.0.0.1:{free_port()}"
    args = ["-m", "lsp_dscoder", "--stdio", "--backend", "remote", "--endpoint", url]
    server = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout

    def send(message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        stdin.flush()

    def answer(msg_id: int) -> dict[str, Any]:
        while True:
            length = 0
            while line := stdout.readline().strip():
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            message: dict[str, Any] = json.loads(stdout.read(length))
            if message.get("id") == msg_id:
                return message

    try:
        init = {"processId": None, "rootUri": None, "capabilities": {}}
        send({"id": 1, "method": "initialize", "params": init})
        answer(1)
        send({"method": "initialized", "params": {}})  # the backend starts now
        for msg_id in itertools.count(100):  # until the backend is up
            send({"id": msg_id, "method": "dscoder/stats"})
            if answer(msg_id)["result"]["engineState"] == "ready":
                break
            time.sleep(0.05)
        send({"id": 2, "method": "shutdown"})
        answer(2)
        send({"method": "exit"})
        started = time.monotonic()
        assert server.wait(30) == 0
        assert time.monotonic() - started < 2.0
    finally:
        server.kill()
        server.wait()
