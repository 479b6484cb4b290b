"""Generation on the real engine and tiny checkpoints: greedy parity with transformers' generate,
prefix reuse, typing through, cancellation, stop conditions, streaming."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from lsp_dscoder.engine import (
    Completion,
    CompletionRequest,
    Engine,
    EngineConfig,
    SamplingParams,
    StopReason,
    TokenEvent,
)
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.generate import HEALING, Healing, generate
from lsp_dscoder.engine.stops import StopStringFilter


def fim_prompt(engine: Engine, before: str, after: str) -> tuple[int, ...]:
    t = engine.tokenizer
    return (t.bos_id, t.fim_begin_id, *t.encode(before), t.fim_hole_id, *t.encode(after), t.fim_end_id)


def req(ids, max_tokens=12, **kw) -> CompletionRequest:
    return CompletionRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=max_tokens, **kw))


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
    assert slot.tokens == list(prompt) + list(done.token_ids[:2])  # the 3rd is sampled, not yet fed
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

        decode = runner.decode

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


def test_healing_candidates_are_the_tokens_that_can_spell_the_text(engine: Engine) -> None:
    tok = engine.tokenizer
    texts = {i: tok.decode([i]) for i in range(tok.vocab_size)}
    for heal in (" ar", "re", "    ", "("):
        want = {
            i
            for i, t in texts.items()
            if t and "\ufffd" not in t and (t.startswith(heal) or (heal.startswith(t) and t != heal))
        }
        got = tok.healing_candidates(heal)
        assert set(got) == want and len(got) == len(want)
        covering, partial = tok.healing_split(heal)
        assert set(covering) == {i for i in want if texts[i].startswith(heal)}
        assert set(partial) == want - set(covering) and got == covering + partial
    assert tok.eos_id not in tok.healing_candidates(" ")


def test_token_healing_is_greedy_over_the_tokens_that_spell_the_text(tiny_model: Path) -> None:
    hf = LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with Engine(EngineConfig(model=tiny_model, max_context=256, num_slots=1)) as eng:
        tok = eng.tokenizer
        prompt = fim_prompt(eng, "def main(args):\n    return", "\n")
        events = []
        request = CompletionRequest(prompt, SamplingParams(max_tokens=8), heal_text=" ar")
        handle = eng.submit(request)
        events = list(handle)
        done = handle.result()
        # The oracle: transformers' logits, greedy over the healing candidates until " ar" is spelled: the
        # token that is exactly what is left handicapped by the engine's exact odds against the longer
        # ones, a token that spells only part of it by the partial odds more.
        ids, heal, expected = list(prompt), " ar", []
        with torch.no_grad():
            while len(expected) < 8:
                logits = hf(torch.tensor([ids])).logits[0, -1]
                if heal:
                    covering, partial = tok.healing_split(heal)
                    exact = [t for t in covering if tok.decode([t]) == heal]
                    longer = [t for t in covering if t not in exact]
                    tiered = longer and exact and not heal.isspace()
                    on_exact = math.log(HEALING.exact_odds) if tiered else 0.0
                    on_partial = on_exact + (math.log(HEALING.partial_odds) if covering else 0.0)
                    allowed = torch.tensor(longer + exact + list(partial))
                    handicaps = [0.0] * len(longer) + [on_exact] * len(exact) + [on_partial] * len(partial)
                    score = logits[allowed] - torch.tensor(handicaps)
                    token = int(allowed[score.argmax()])
                    heal = heal[len(tok.decode([token])) :]
                else:
                    token = int(logits.argmax())
                if token == tok.eos_id:
                    break
                expected.append(token)
                ids.append(token)
        assert done.token_ids == tuple(expected)
        spelled = tok.decode(list(done.token_ids))
        assert spelled.startswith(" ar") and done.text == spelled[3:]
        assert "".join(e.text for e in events) == done.text
        # pieces are whole characters; the flush at the end may add an unfinished one as U+FFFD
        assert "".join(e.piece for e in events if e.piece is not None) == spelled.rstrip("\ufffd")
        with pytest.raises(EngineError, match="cannot be spelled"):
            eng.submit(CompletionRequest(prompt, heal_text="\u2603"))


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

        done = generate(req(prompt, max_tokens=8), Counting(), eng.cache, eng.tokenizer, cancel, id, 64, 0)
        # The prefill ran all its layers; the first decode stopped after its first layer.
        assert checks == ["prefill"] * (layers - 1) + ["decode"]
        assert done.stats.stop_reason is StopReason.CANCELLED and len(done.token_ids) == 1
        assert done.text and done.stats.steps_to_text == 0  # the first token was already visible
        slot = eng.cache.slots[done.stats.slot]
        assert slot.tokens == list(prompt)  # the interrupted forward's rows are not counted as cached
        # The next request reuses the prompt and decodes the same tokens as a fresh engine would.
        again = eng.complete(req(prompt, max_tokens=6))
        assert again.stats.prefilled_tokens == 0 and again.token_ids[0] == done.token_ids[0]
    with Engine(EngineConfig(model=tiny_model, max_context=256, num_slots=1)) as cold:
        assert cold.complete(req(prompt, max_tokens=6)).token_ids == again.token_ids


def test_steps_to_text_counts_the_forwards_before_visible_text(engine: Engine) -> None:
    tok = engine.tokenizer
    prompt = fim_prompt(engine, "def main(args):\n    return", "\n")
    plain = engine.complete(req(prompt, max_tokens=4))
    assert plain.text and plain.stats.steps_to_text == 0
    # Healing a text that a single token spells exactly, under the rule that lets that token compete
    # evenly with longer ones: it shows nothing, the next does.
    first = tok.decode([plain.token_ids[0]])
    runner = ReferenceRunner(engine.model, engine.cache)

    def healing(heal: str) -> Completion:
        request = CompletionRequest(prompt, SamplingParams(max_tokens=4), heal_text=heal)
        even = Healing(exact_odds=1.0)
        return generate(request, runner, engine.cache, tok, threading.Event(), lambda e: None, 8, 0.0, even)

    healed = healing(first)
    assert healed.token_ids == plain.token_ids
    # Here the slot still holds the plain request's forwards of these tokens: none runs again.
    n = len(plain.token_ids)
    assert (healed.stats.steps_to_text, healed.stats.replayed_tokens) == ((0, n - 1) if n > 1 else (None, 0))
    # After a request that left other tokens there, the token's forward runs: one step.
    other = tok.encode("x = 1")
    assert other[0] != plain.token_ids[0]
    engine.complete(req((*prompt, *other), max_tokens=2))
    again = healing(first)
    assert again.token_ids == plain.token_ids and again.stats.replayed_tokens == 0
    assert again.stats.steps_to_text == (1 if n > 1 else None)


def test_the_submitter_is_released_once_when_a_forward_is_queued_or_text_is_emitted(engine: Engine) -> None:
    prompt = fim_prompt(engine, "def add(a, b):\n    return", "\n")
    inner = ReferenceRunner(engine.model, engine.cache)
    log: list[str] = []

    class Logging:  # the reference runner asks `interrupted` between layers, as the parts of a graph do
        def prefill(self, ids, start, slot, interrupted=None):
            log.append("prefill")
            return inner.prefill(ids, start, slot, interrupted)

        def decode(self, token, pos, slot, interrupted=None):
            log.append("decode")
            return inner.decode(token, pos, slot, interrupted)

    def run(ids: tuple[int, ...]) -> list[str]:
        log.clear()

        def emit(e: TokenEvent) -> None:
            log.append("text" if e.text else "silent")

        def launched() -> None:
            log.append("launched")

        tok, cancel, request = engine.tokenizer, threading.Event(), req(ids, max_tokens=6)
        generate(request, Logging(), engine.cache, tok, cancel, emit, 64, 0.0, launched=launched)
        return list(log)

    cold = run(prompt)
    assert cold[:2] == ["prefill", "launched"]  # inside the prefill, once its first layer is queued
    assert cold.count("launched") == 1
    # Cached with its logits: the first token is sampled without a forward; the release comes with the
    # first forward it waits for, or just before the first visible text, whichever is first.
    warm = run(prompt)
    assert "prefill" not in warm and warm.count("launched") == 1
    at = warm.index("launched")
    assert at > 0 and (warm[at - 1] == "decode" or warm[at + 1] == "text")
    assert "text" not in warm[:at]


def test_a_request_that_stops_before_any_forward_still_releases_its_submitter(engine: Engine) -> None:
    prompt = fim_prompt(engine, "x = ", "\n")
    handle = engine.submit(req(prompt, max_tokens=0))
    handle.result(timeout=30)
    assert handle.wait_launched(0) and handle.result().stats.generated_tokens == 0
