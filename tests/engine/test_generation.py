"""Generation on the real engine and tiny checkpoints: greedy parity with transformers' generate,
prefix reuse, typing through, cancellation, stop conditions, streaming."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from lsp_dscoder.engine import (
    CompletionRequest,
    Engine,
    EngineConfig,
    SamplingParams,
    StopReason,
    TokenEvent,
)
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.generate import generate
from lsp_dscoder.engine.step_graphs import next_chunk
from lsp_dscoder.engine.stops import StopStringFilter
from tests.engine.fim import fim_prompt, req


def test_greedy_is_token_identical_to_transformers_generate(shaped_model: Path) -> None:
    hf = LlamaForCausalLM.from_pretrained(shaped_model, dtype=torch.float32).eval()
    with Engine(EngineConfig(model=shaped_model, max_context=256, num_slots=1)) as eng:
        prompt = fim_prompt(eng, "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
        ours = eng.complete(req(prompt, max_tokens=20))
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=eng.tokenizer.eos_id,
        )[0, len(prompt) :].tolist()
    # ours stops at EOS (never emitted); transformers was told to ignore it
    assert list(ours.token_ids) == out[: len(ours.token_ids)]
    assert ours.stats.stop_reason in (StopReason.MAX_TOKENS, StopReason.EOS)
    if ours.stats.stop_reason is StopReason.EOS:
        assert out[len(ours.token_ids)] == eng.tokenizer.eos_id


def test_prefix_reuse_gives_same_tokens_and_logits_and_prefills_only_new(tiny_model: Path) -> None:
    cfg = EngineConfig(model=tiny_model, max_context=256, num_slots=2)
    with Engine(cfg) as warm, Engine(cfg) as cold:
        first = fim_prompt(warm, "import os\n\ndef main", "\n")
        second = fim_prompt(warm, "import os\n\ndef main", "\n") + tuple(warm.tokenizer.encode("():\n    x"))
        a = warm.complete(req(first, max_tokens=3))
        assert (a.stats.reused_tokens, a.stats.prefilled_tokens) == (0, len(first))
        b = warm.complete(req(second))
        c = cold.complete(req(second))
        assert b.token_ids == c.token_ids and b.text == c.text
        assert b.stats.reused_tokens == len(first)
        assert b.stats.prefilled_tokens == len(second) - len(first)
        assert c.stats.prefilled_tokens == len(second)
        # logits after reuse equal logits from scratch
        ids = torch.tensor(second[len(first) :])
        reused = warm.model.forward_reference(ids, len(first), warm.cache, b.stats.slot, all_logits=True)
        fresh = cold.model.forward_reference(torch.tensor(second), 0, cold.cache, 1, all_logits=True)
        torch.testing.assert_close(reused, fresh[len(first) :], atol=1e-5, rtol=0)


def test_typing_through_prefills_zero_tokens(engine: Engine) -> None:
    prompt = fim_prompt(engine, "class Point:\n    def __init__(self", "\n")
    a = engine.complete(req(prompt, max_tokens=10))
    assert len(a.token_ids) >= 4, a
    for k in (1, 3, len(a.token_ids) - 1):
        b = engine.complete(req(prompt + a.token_ids[:k], max_tokens=len(a.token_ids) - k))
        assert b.stats.prefilled_tokens == 0
        assert b.stats.reused_tokens == len(prompt) + k
        assert b.token_ids == a.token_ids[k:]  # greedy: the rest of the same suggestion


def test_prompt_ending_inside_cached_tokens_without_logits_runs_its_last_token(tiny_model: Path) -> None:
    cfg = EngineConfig(model=tiny_model, max_context=256, num_slots=1)
    with Engine(cfg) as warm, Engine(cfg) as cold:
        prompt = fim_prompt(warm, "import os\n\ndef main", "\n")
        warm.complete(req(prompt, max_tokens=3))
        shorter = prompt[:-3]  # its last token is cached, the logits after it are not
        a, b = warm.complete(req(shorter, max_tokens=4)), cold.complete(req(shorter, max_tokens=4))
        assert (a.stats.reused_tokens, a.stats.prefilled_tokens) == (len(shorter) - 1, 1)
        assert a.token_ids == b.token_ids


def test_cancel_stops_within_one_step_and_cache_is_kept(engine: Engine) -> None:
    prompt = fim_prompt(engine, "for i in range(10):\n    ", "\n")
    cancel = threading.Event()
    seen: list[int] = []

    def emit(ev) -> None:
        seen.append(ev.token_id)
        if len(seen) == 3:
            cancel.set()

    runner = ReferenceRunner(engine.model, engine.cache)
    done = generate(req(prompt, max_tokens=50), runner, engine.cache, engine.tokenizer, cancel, emit, 8, 0.0)
    assert done.stats.stop_reason is StopReason.CANCELLED
    assert len(done.token_ids) == 3 == len(seen)
    slot = engine.cache.slots[done.stats.slot]
    assert list(slot.tokens) == list(prompt) + list(done.token_ids[:2])  # the 3rd is sampled, not yet fed
    # The 3rd token is not cached, but the logits before it are: it is healed, not prefilled.
    handle = engine.submit(req(prompt + done.token_ids, max_tokens=2))
    events, again = list(handle), handle.result()
    assert again.stats.prefilled_tokens == 0 and again.stats.reused_tokens == len(prompt) + 2
    assert events[0].rewound == 1 and again.token_ids[0] == done.token_ids[2]


def test_cancel_between_prefill_chunks_keeps_prefilled_chunks(engine: Engine) -> None:
    text = "def long_function(argument_one, argument_two, argument_three):\n    return argument_one"
    prompt = fim_prompt(engine, text, "\n")
    assert len(prompt) > 24
    cancel = threading.Event()
    runner = ReferenceRunner(engine.model, engine.cache)

    class CancelAfterTwoChunks:
        calls = 0

        def prefill(self, ids, start, slot, interrupted=None):
            self.calls += 1
            if self.calls == 2:
                cancel.set()
            return runner.prefill(ids, start, slot)  # finishes the chunk: the check comes after it

        decode, chunk = runner.decode, runner.chunk

    done = generate(
        req(prompt), CancelAfterTwoChunks(), engine.cache, engine.tokenizer, cancel, lambda e: None, 8, 0.0
    )
    assert done.stats.stop_reason is StopReason.CANCELLED
    assert (done.stats.prefilled_tokens, done.stats.generated_tokens) == (16, 0)
    after = engine.complete(req(prompt, max_tokens=1))
    assert after.stats.reused_tokens == done.stats.reused_tokens + 16
    assert after.stats.prefilled_tokens == len(prompt) - after.stats.reused_tokens


def test_cancel_through_engine_and_engine_keeps_serving(engine: Engine) -> None:
    prompt = fim_prompt(engine, "while True:\n", "")
    handle = engine.submit(req(prompt, max_tokens=400))
    handle.cancel()
    done = handle.result(timeout=60)
    assert done.stats.stop_reason is StopReason.CANCELLED
    assert engine.complete(req(prompt, max_tokens=2)).stats.generated_tokens in (1, 2)


def test_a_stopped_request_is_published_once_the_next_one_shows_text(engine: Engine) -> None:
    """The keystroke that stops a running suggestion sends the next request: the stopped one's result
    waits until that request's first text is out (its consumer would otherwise take the interpreter first),
    and the wait for the stop is counted apart in the next request's queue time."""
    shows = fim_prompt(engine, "s = '你好😀", "'\n")
    assert engine.complete(req(shows, max_tokens=15)).text  # this prompt's suggestion shows text
    idle = engine.complete(req(shows, max_tokens=15))
    assert idle.stats.stopping_s is None  # submitted to an idle engine
    running = engine.submit(req(fim_prompt(engine, "while True:\n", ""), max_tokens=400))
    next(iter(running))  # it is generating
    stopped_when_text: list[bool] = []

    def observer(event: TokenEvent) -> bool:
        if event.text and not stopped_when_text:
            stopped_when_text.append(running.done)
        return False

    queued = engine.submit(dataclasses.replace(req(shows, max_tokens=15), observer=observer))
    running.cancel()
    done = queued.result(timeout=60)
    assert running.result(timeout=60).stats.stop_reason is StopReason.CANCELLED
    assert stopped_when_text == [False]
    assert done.text == idle.text
    assert done.stats.stopping_s is not None and 0 < done.stats.stopping_s < done.stats.queue_s


def test_stop_conditions(engine: Engine) -> None:
    prompt = fim_prompt(engine, "x = 1\n", "")
    base = engine.complete(req(prompt, max_tokens=12))
    assert base.stats.stop_reason in (StopReason.MAX_TOKENS, StopReason.EOS)
    assert engine.complete(req(prompt, max_tokens=0)).token_ids == ()
    # a stop string taken from the middle of the greedy text cuts the text right before it
    if len(base.text) >= 4:
        stop = base.text[2:4]
        cut = engine.complete(req(prompt, max_tokens=12, stop=(stop,)))
        assert cut.stats.stop_reason is StopReason.STOP_STRING
        assert cut.text == base.text[: base.text.index(stop)]
    past = CompletionRequest(
        prompt_ids=prompt, params=SamplingParams(max_tokens=5), deadline=time.monotonic()
    )
    assert engine.complete(past).stats.stop_reason is StopReason.DEADLINE


def test_context_full_stops_cleanly(tiny_model: Path) -> None:
    with Engine(EngineConfig(model=tiny_model, max_context=20, num_slots=1)) as eng:
        prompt = (eng.tokenizer.bos_id, *eng.tokenizer.encode("import sys\nimport os\n")[:15])
        done = eng.complete(req(prompt, max_tokens=50))
        assert done.stats.stop_reason in (StopReason.CONTEXT_FULL, StopReason.EOS)
        assert len(prompt) + len(done.token_ids) <= 21


def test_stream_text_concatenates_to_completion_and_async(engine: Engine) -> None:
    prompt = fim_prompt(engine, "s = '你好😀", "'\n")
    handle = engine.submit(req(prompt, max_tokens=15))
    events = list(handle)
    done = handle.result()
    assert "".join(e.text for e in events) == done.text
    assert [e.token_id for e in events if e.token_id is not None] == list(done.token_ids)
    assert "\ufffd" not in done.text or done.stats.stop_reason is StopReason.MAX_TOKENS

    async def consume():
        h = engine.submit(req(prompt, max_tokens=15))
        got = [e async for e in h.stream()]
        return got, await h.wait()

    got, again = asyncio.run(consume())
    assert (
        [e.token_id for e in got if e.token_id is not None] == list(again.token_ids) == list(done.token_ids)
    )


def test_incremental_decoder_never_splits_characters(engine: Engine) -> None:
    tok = engine.tokenizer
    text = "naïve → 你好世界 😀🎉 café"
    ids = tok.encode(text)
    dec = tok.stream()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_filter_holds_back_possible_starts() -> None:
    f = StopStringFilter(("\n\n", "END"))
    assert f.push("abc\n") == ("abc", False)
    assert f.push("E") == ("\n", False)  # "E" may start "END"
    assert f.push("x") == ("Ex", False)
    assert f.push("EN") == ("", False)
    assert f.push("D tail") == ("", True)
    assert f.text == "abc\nEx"


def test_slots_are_lru_per_document(tiny_model: Path) -> None:
    with Engine(EngineConfig(model=tiny_model, max_context=128, num_slots=2)) as eng:
        docs = {k: fim_prompt(eng, f"# file {k}\nimport {k}\n", "") for k in ("a", "b", "c")}
        slot_a = eng.complete(
            CompletionRequest(docs["a"], SamplingParams(max_tokens=1), slot_key="a")
        ).stats.slot
        slot_b = eng.complete(
            CompletionRequest(docs["b"], SamplingParams(max_tokens=1), slot_key="b")
        ).stats.slot
        assert slot_a != slot_b
        again_a = eng.complete(CompletionRequest(docs["a"], SamplingParams(max_tokens=1), slot_key="a"))
        assert again_a.stats.slot == slot_a and again_a.stats.prefilled_tokens == 0
        # c evicts the least recently used (b), so a stays warm
        assert (
            eng.complete(CompletionRequest(docs["c"], SamplingParams(max_tokens=1), slot_key="c")).stats.slot
            == slot_b
        )
        assert (
            eng.complete(
                CompletionRequest(docs["a"], SamplingParams(max_tokens=1), slot_key="a")
            ).stats.prefilled_tokens
            == 0
        )


def test_a_cancel_during_a_forward_stops_it_before_the_next_layer(tiny_model: Path) -> None:
    with Engine(EngineConfig(model=tiny_model, max_context=256, num_slots=1)) as eng:
        layers = len(eng.model.w.layers)
        assert layers >= 2
        prompt = fim_prompt(eng, "for i in range(10):\n    ", "\n")
        cancel = threading.Event()
        checks: list[str] = []  # one entry per check inside a forward: which forward asked
        inner = ReferenceRunner(eng.model, eng.cache)

        class Counting:
            def prefill(self, ids, start, slot, interrupted=None):
                return inner.prefill(ids, start, slot, lambda: checks.append("prefill") or interrupted())

            def decode(self, token, pos, slot, interrupted=None):
                def check() -> bool:
                    checks.append("decode")
                    cancel.set()  # a keystroke arrives while the first layer runs
                    return interrupted()

                return inner.decode(token, pos, slot, check)

            chunk = inner.chunk

        done = generate(req(prompt, max_tokens=8), Counting(), eng.cache, eng.tokenizer, cancel, id, 64, 0)
        # The prefill ran all its layers; the first decode stopped after its first layer.
        assert checks == ["prefill"] * (layers - 1) + ["decode"]
        assert done.stats.stop_reason is StopReason.CANCELLED and len(done.token_ids) == 1
        assert done.text and done.stats.steps_to_text == 0  # the first token was already visible
        slot = eng.cache.slots[done.stats.slot]
        assert list(slot.tokens) == list(prompt)  # the interrupted forward's rows are not counted as cached
        # The next request reuses the prompt and decodes the same tokens as a fresh engine would.
        again = eng.complete(req(prompt, max_tokens=6))
        assert again.stats.prefilled_tokens == 0 and again.token_ids[0] == done.token_ids[0]
    with Engine(EngineConfig(model=tiny_model, max_context=256, num_slots=1)) as cold:
        assert cold.complete(req(prompt, max_tokens=6)).token_ids == again.token_ids


class LongSteps:
    """The reference runner, planning its prefill steps with `long` buckets as the fast path plans its
    long prefill graphs, and recording each step's size."""

    def __init__(self, engine: Engine, long: tuple[int, ...]) -> None:
        self.inner, self.long = ReferenceRunner(engine.model, engine.cache), long
        self.capacity, self.sizes = engine.cache.capacity, list[int]()
        self.decode = self.inner.decode

    def prefill(self, ids, start, slot, interrupted=None):  # type: ignore[no-untyped-def]
        self.sizes.append(len(ids))
        return self.inner.prefill(ids, start, slot, interrupted)

    def chunk(self, remaining: int, start: int, limit: int) -> int:
        return next_chunk(remaining, start, self.long, self.capacity, limit)


def test_a_runner_with_long_prefill_steps_gives_the_same_completion_in_fewer_steps(engine: Engine) -> None:
    text = "def long_function(argument_one, argument_two, argument_three):\n    return argument_one +"
    prompt = fim_prompt(engine, text, "\n")
    assert 32 + 8 < len(prompt) < 48  # one step of 32, one of 8, then the rest
    runs = {}
    for long in ((), (16, 32)):
        for slot in engine.cache.slots:  # the same cold start for both
            slot.truncate(0)
        runner = LongSteps(engine, long)
        r = generate(req(prompt, max_tokens=6), runner, engine.cache, engine.tokenizer, threading.Event(),
                     lambda e: None, 8, 0.0)  # fmt: skip
        runs[long] = (r.token_ids, r.text, r.stats.prefilled_tokens, r.stats.reused_tokens), runner.sizes
    assert runs[(16, 32)][0] == runs[()][0] and runs[()][0][2] == len(prompt)
    assert runs[(16, 32)][1] == [32, 8, len(prompt) - 40]
    assert runs[()][1] == [8] * (len(prompt) // 8) + [len(prompt) % 8]
