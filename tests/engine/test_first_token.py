"""What comes before a suggestion's first visible text, on the real engine and tiny checkpoints: token
healing's choice against transformers' logits, the forwards counted before visible text, and when the
engine thread lets its submitter go on."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from lsp_dscoder.engine import Completion, CompletionRequest, Engine, EngineConfig, SamplingParams, TokenEvent
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.generate import HEALING, Healing, generate
from tests.engine.fim import fim_prompt, req


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

        chunk = inner.chunk

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
