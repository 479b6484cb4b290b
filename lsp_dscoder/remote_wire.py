"""What the remote backend sends: a completion request as the bytes of one HTTP POST, built so that a
keystroke costs work proportional to its edit (token ids are encoded past the document's previous prompt
only), and the time each stage of a request took, for the trace `lsp-dscoder bench --backend remote`
replays (`LSP_DSCODER_REMOTE_TRACE`: each request's body and stage times, appended as a JSON line after
its stream ends).
"""

from __future__ import annotations

import itertools
import json
import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lsp_dscoder.engine.api import CompletionRequest, SamplingParams
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.prefix import common_prefix, out_of_vocabulary, outside, token_ids
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.remote_config import RemoteConfig
from lsp_dscoder.remote_http import Endpoint, encode_json, request_head
from lsp_dscoder.remote_pool import Connection

TRACE_ENV = "LSP_DSCODER_REMOTE_TRACE"


class Stages:
    """Where a request's time went up to its first text (ms per stage, in the order they came)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + 1e3 * (now - self._last)
        self._last = now


@dataclass
class Wire:
    """A request as sent: its prompt with the healed tokens, its bytes, and where its time went."""

    ids: array[int]
    heal_ids: list[int]
    data: bytes  # the HTTP request
    head: int  # bytes of it before the body
    clock: Stages = field(default_factory=Stages)
    first_timings: Mapping[str, Any] | None = None  # the endpoint's own timings in its first text chunk
    shown: bool = False  # the stages reached the chunk whose text went out first
    shown_tokens: int | None = None  # the endpoint's tokens up to that text's (None: not known)
    shown_end: bool = False  # the text went out with the answer, at the stream's end

    def shown_at(self, index: int | None, end: bool = False) -> None:
        """The first partial went out with the event at `index` of the completion's tokens (the healed
        ones first; None: it was not sent from the stream's reader, or is not known), or, `end`, with the
        answer once the stream had ended (what came before showed nothing)."""
        self.shown, self.shown_end = True, end
        self.shown_tokens = None if index is None else index + 1 - len(self.heal_ids)

    def send(self, conn: Connection) -> None:
        """Writes the request on `conn`. The send is its own stage, timed apart from ours before it ("write"):
        on loopback the kernel delivers the bytes inside it, so the endpoint's start may run there."""
        self.clock.mark("write")
        conn.write(self.data)
        self.clock.mark("send")

    def trace_line(self, seq: int, submitted: float, cut: float | None) -> bytes:
        """The trace's JSON line: `submitted` and `cut` (when its stream was cut, None if it was not) on
        `time.perf_counter()`'s clock, which the bench's process shares; the stages when they reached the
        shown text, and how many of the endpoint's tokens it took (the replay times the same one)."""
        head = {"seq": seq, "submitted": submitted, "stagesMs": self.clock.ms if self.shown else None}
        head["cut"], head["shownTokens"], head["shownAtEnd"] = cut, self.shown_tokens, self.shown_end
        head["firstTimings"] = None if self.first_timings is None else dict(self.first_timings)
        return json.dumps(head).encode()[:-1] + b',"body":%s}\n' % self.data[self.head :]


class RequestWriter:
    """The `/v1/completions` requests of one endpoint and tokenizer."""

    def __init__(self, config: RemoteConfig, endpoint: Endpoint, tokenizer: Tokenizer, api_key: str) -> None:
        self.config, self.endpoint, self.tokenizer = config, endpoint, tokenizer
        self._key = api_key
        self._prompts = PromptIds(tokenizer.vocab_size)
        self._head = request_head("POST", endpoint, endpoint.path("/v1/completions"), self.headers())
        # the body after the prompt, per sampling parameters and model: the same on every keystroke
        self._tails: dict[tuple[SamplingParams, str | None], bytes] = {}
        self._text_tokenizer: Any = None
        if not config.token_ids:  # decoding a prompt to text keeps its FIM tokens
            from tokenizers import Tokenizer as HFTokenizer

            self._text_tokenizer = HFTokenizer.from_file(str(config.tokenizer / "tokenizer.json"))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def get_bytes(self, path: str) -> bytes:
        """A GET request without a body (the model list)."""
        return request_head("GET", self.endpoint, path, self.headers()) + b"0\r\n\r\n"

    def wire(self, request: CompletionRequest, model: str | None) -> Wire:
        """The request as it goes out: the prompt with the healed tokens, as an HTTP POST. EngineError
        for a token id outside the vocabulary (checked, like the encoding, past the previous prompt)."""
        clock = Stages()
        heal_ids = self.tokenizer.encode(request.heal_text) if request.heal_text else []
        try:
            ids = token_ids(request.prompt_ids, self.tokenizer.vocab_size) + array("q", heal_ids)
            if self.config.token_ids:
                prompt = self._prompts.encode(request.slot_key, ids)
            else:
                prompt = encode_json(self._as_text(ids))
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        tail = self._tails.get((request.params, model))
        if tail is None:
            if len(self._tails) >= 16:
                self._tails.clear()
            tail = self._tails[request.params, model] = b"," + encode_json(self._body(request, model))[1:]
        body = b'{"prompt":' + prompt + tail
        head = self._head + b"%d\r\n\r\n" % len(body)
        clock.mark("encode")
        return Wire(ids, heal_ids, head + body, len(head), clock=clock)

    def _body(self, request: CompletionRequest, model: str | None) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            "cache_prompt": True,  # llama.cpp: reuse the slot's KV for the common prefix
        }
        if model:
            body["model"] = model
        if p.stop:
            body["stop"] = list(p.stop)  # the engine stops generating; the stop filter here is exact
        if p.seed is not None:
            body["seed"] = p.seed
        if self.config.token_ids:  # ask for the generated ids: llama.cpp logprobs ids, vLLM token ids
            body.update(logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True)
        extra = {k: v for k, v in self.config.extra.items() if k != "prompt"}
        return {**extra, **body}  # the extra fields cannot change what the backend relies on

    def _as_text(self, ids: array[int]) -> str:
        vocab = self.tokenizer.vocab_size
        if (bad := outside(ids, vocab)) is not None:
            raise ValueError(out_of_vocabulary(bad, vocab))
        if ids and ids[0] == self.tokenizer.bos_id:
            ids = ids[1:]  # the endpoint adds BOS itself when it tokenises a text prompt
        return str(self._text_tokenizer.decode(ids.tolist(), skip_special_tokens=False))


class PromptIds:
    """The JSON text of token-id prompts, encoding (and range-checking) per document only the ids after
    those it shares with that document's previous prompt: a keystroke adds a token or two to a prompt of
    thousands, whose encoding anew would cost ~0.1 ms per thousand ids."""

    def __init__(self, vocab_size: int, documents: int = 8) -> None:
        self._vocab = vocab_size
        # document -> (its last ids, their text with a comma after each id, where each id's comma ends)
        self._last: OrderedDict[object, tuple[array[int], str, list[int]]] = OrderedDict()
        self._documents = documents

    def encode(self, key: object, ids: array[int]) -> bytes:
        """`ids` as a JSON array; `key` names the document. ValueError for an id outside the vocabulary."""
        old_ids, text, ends = self._last.pop(key, (array("q"), "", []))
        same = common_prefix(old_ids, ids)
        del ends[same:]
        tail = ids[same:]
        if (bad := outside(tail, self._vocab)) is not None:
            raise ValueError(out_of_vocabulary(bad, self._vocab))
        pieces = [f"{t}," for t in tail]
        text = text[: ends[-1] if ends else 0] + "".join(pieces)
        ends.extend(itertools.accumulate(map(len, pieces), initial=ends[-1] if ends else 0))
        del ends[same]  # accumulate's initial value, already there (or the 0 before the first id)
        self._last[key] = (ids, text, ends)
        if len(self._last) > self._documents:
            self._last.popitem(last=False)
        return b"[" + text[:-1].encode() + b"]"


def post_bytes(endpoint: Endpoint, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """A whole HTTP/1.1 POST of a JSON body, ready for one write."""
    return request_head("POST", endpoint, path, headers) + b"%d\r\n\r\n" % len(body) + body
