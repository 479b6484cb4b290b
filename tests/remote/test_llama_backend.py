"""The remote backend against llama.cpp's server serving the bundled model: the same tokens and text as
llama.cpp gives when asked directly, events streamed in order, its prompt cache hit when typing appends to
the prompt, and a cancel that stops its generation at once (its own log says so)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lsp_dscoder.engine.api import CompletionRequest, SamplingParams, StopReason
from lsp_dscoder.engine.errors import ContextOverflowError, EngineError
from lsp_dscoder.remote import RemoteBackend, RemoteConfig
from tests.remote.llama_server import LlamaServer

pytestmark = pytest.mark.slow  # the first use converts the model and starts llama.cpp's server


@pytest.fixture(scope="module")
def backend(llama: LlamaServer, bundled: Path) -> Iterator[RemoteBackend]:
    with RemoteBackend(RemoteConfig(endpoint=llama.url, tokenizer=bundled)) as b:
        yield b


def fim(backend: RemoteBackend, before: str, after: str) -> list[int]:
    tok = backend.tokenizer
    return [
        tok.bos_id,
        tok.fim_begin_id,
        *tok.encode(before),
        tok.fim_hole_id,
        *tok.encode(after),
        tok.fim_end_id,
    ]


def _request(ids: list[int], max_tokens: int) -> CompletionRequest:
    return CompletionRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=max_tokens))


def test_same_tokens_and_text_as_llama_server_asked_directly(
    backend: RemoteBackend, llama: LlamaServer
) -> None:
    ids = fim(backend, "import sys\n\n\ndef main(argv):\n    ", "\n    return 0\n")
    direct = llama.complete(ids, 40)["choices"][0]
    direct_ids = [c["id"] for c in direct["logprobs"]["content"] if c["id"] != backend.tokenizer.eos_id]
    handle = backend.submit(_request(ids, 40))
    events = list(handle)
    result = handle.result()
    assert result.text == direct["text"] and list(result.token_ids) == direct_ids
    assert [e.index for e in events] == list(range(len(events)))
    assert "".join(e.text for e in events) == result.text
    assert [e.token_id for e in events if e.token_id is not None] == direct_ids
    stats = result.stats
    assert stats.prompt_tokens == len(ids) and stats.generated_tokens == len(direct_ids)
    # The direct request left the prompt in llama.cpp's slot: all of it is reused but the last token,
    # which llama.cpp always evaluates again to get logits.
    assert (stats.reused_tokens, stats.prefilled_tokens) == (len(ids) - 1, 1)
    assert stats.backend is not None and stats.backend["timings"]["cache_n"] == len(ids) - 1
    assert stats.backend["usage"]["prompt_tokens"] == len(ids)
    assert stats.ttft_s is not None and stats.ttft_s < stats.total_s


def test_typing_appends_to_the_prompt_and_hits_the_prompt_cache(backend: RemoteBackend) -> None:
    before = "def area(width, height):\n    "
    first = backend.complete(_request(fim(backend, before, "\n"), 8))
    assert first.stats.reused_tokens < first.stats.prompt_tokens - 1  # a new prompt: mostly computed
    # The user typed a character: the edit-anchor layout only appends it after <｜fim▁end｜>.
    ids = fim(backend, before, "\n") + backend.tokenizer.encode("r")
    slot = fim(backend, before, "\n") + list(first.token_ids[:-1])  # the last token was never evaluated
    same = next((i for i, (a, b) in enumerate(zip(slot, ids, strict=False)) if a != b), len(ids))
    common = min(same, len(ids) - 1)  # llama.cpp evaluates at least the last prompt token
    again = backend.complete(_request(ids, 8))
    assert (again.stats.reused_tokens, again.stats.prefilled_tokens) == (common, len(ids) - common)
    assert common >= len(ids) - 2


def test_cancel_cuts_the_stream_and_llama_server_stops_generating(
    backend: RemoteBackend, llama: LlamaServer
) -> None:
    ids = fim(backend, "VALUES = [\n    ", "\n")  # llama.cpp goes on for all 400 tokens when let
    cancels = llama.log().count("cancel task")
    handle = backend.submit(_request(ids, 400))
    events = iter(handle)
    next(events)
    next(events)
    assert handle.cut_at is None
    before = time.perf_counter()
    handle.cancel()
    result = handle.result(timeout=10)
    assert result.stats.stop_reason is StopReason.CANCELLED and result.error is None
    assert (
        handle.cut_at is not None and before <= handle.cut_at <= time.perf_counter()
    )  # the bench's replay cuts there
    deadline = time.monotonic() + 10
    while llama.log().count("cancel task") == cancels:
        assert time.monotonic() < deadline, "llama.cpp never saw the stream cut"
        time.sleep(0.01)
    assert len(ids) <= llama.released_at_last_cancel() < len(ids) + 100  # stopped long before its 400 tokens
    assert backend.stats()["cancelled"] >= 1 and backend.stats()["reachable"] is True


def test_validate_checks_the_request_and_sends_nothing(backend: RemoteBackend, llama: LlamaServer) -> None:
    """`validate` (the keep-warm replays' check) raises what `submit` would and sends nothing."""
    ids = fim(backend, "def area(width, height):\n    ", "\n")
    log, stats = llama.log(), backend.stats()
    assert backend.validate(_request(ids, 8)).prompt_ids == tuple(ids)
    with pytest.raises(EngineError, match="empty prompt"):
        backend.validate(_request([], 8))
    with pytest.raises(EngineError, match=f"token id {backend.tokenizer.vocab_size + 5} is outside"):
        backend.validate(_request([*ids, backend.tokenizer.vocab_size + 5], 8))
    with pytest.raises(ContextOverflowError):
        backend.validate(_request(ids * backend.max_context, 8))
    time.sleep(0.2)
    assert llama.log() == log  # llama.cpp saw no request
    after = backend.stats()
    assert (after["requests"], after["connectionsOpened"]) == (stats["requests"], stats["connectionsOpened"])
