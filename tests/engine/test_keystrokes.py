"""Keystrokes on the bundled model, as the server runs them (its prompt builder, the pieces the slot
holds, the engine's healing): decode steps before the first visible text, tokens prefilled per key,
and the same suggestion whether a new line's indentation was typed before the request or not."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.prompt import Budgets, Head, PromptBuilder
from lsp_dscoder.tokens import Piece

pytestmark = pytest.mark.slow

DOC = '''import re


def split_words(text: str) -> list[str]:
    """Split text into words."""
    return re.split(r"\\s+", text)


def count_words(text: str) -> int:
    chunks = split_words(text)
    return len(chunks)
'''


@pytest.fixture(scope="module")
def engine():
    config = EngineConfig(model=default_model_path(), device="cpu", dtype="float32", max_context=1024)
    with Engine(config) as eng:
        yield eng


class Typist:
    """One document typed into as the server does it: a prompt per keystroke, the head and the slot's
    pieces carried from one to the next."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.builder = PromptBuilder(engine.tokenizer, Budgets().fit(engine.max_context, 16))
        self.head: Head | None = None
        self.pieces: list[Piece] = []

    def request(self, text: str, cursor: int, max_tokens: int = 16):
        prompt = self.builder.build(text, cursor, head=self.head, known=self.pieces)
        params = SamplingParams(max_tokens=max_tokens)
        request = CompletionRequest(prompt.ids, params, slot_key="doc", heal_text=prompt.heal_text)
        handle = self.engine.submit(request)
        events = list(handle)
        done = handle.result()
        rewound = events[0].rewound if events else 0
        known = list(prompt.middle_pieces)
        self.head, self.pieces = prompt.head, known[: len(known) - rewound]
        self.pieces += [Piece(e.token_id, e.piece or "") for e in events if e.token_id is not None]
        shaper = Shaper(CursorContext.at(text, cursor))
        for e in events:
            shaper.feed(e.text)
        return done, shaper.finish(), prompt.heal_text


def test_typing_a_line_shows_text_at_the_first_step_and_prefills_nothing(engine: Engine) -> None:
    at = DOC.index("    return len(chunks)")
    text = DOC[:at] + "\n" + DOC[at:]
    typist = Typist(engine)
    typist.request(text, at + 1)  # the new line, before its indentation
    heals, steps, prefilled = [], [], []
    for k, ch in enumerate("    chunks.sort("):
        text = text[: at + 1 + k] + ch + text[at + 1 + k :]
        done, _, heal = typist.request(text, at + 2 + k)
        heals.append(heal)
        steps.append(done.stats.steps_to_text)
        prefilled.append(done.stats.prefilled_tokens)
    word = [" c", " ch", " chu", " chun", " chunk", " chunks"]
    assert heals == [" ", "  ", "   ", "    ", *word, ".", "s", "so", "sor", "sort", "("]
    # The tokens that spell the healed text are those the key before generated, whose forwards the
    # slot still holds: no step before visible text, but where the suggestion had gone another way
    # (" = [" shown, "." typed: "." is the forward a prompt without healing would have prefilled).
    assert steps == [0] * 10 + [1] + [0] * 5
    # Every keystroke's prompt ends where the slot has logits, or one token before (healed again).
    assert prefilled == [0] * 16


def test_the_suggestion_does_not_depend_on_when_the_indentation_was_typed(engine: Engine) -> None:
    at = DOC.index("    chunks = split_words")
    before = (
        DOC[:at] + DOC[at + DOC[at:].index("\n") + 1 :]
    )  # the line removed: "...int:\n" then "    return"
    early, late = Typist(engine), Typist(engine)
    early_done, early_text, _ = early.request(before, at)
    indented = before[:at] + "    " + before[at:]
    late_done, late_text, heal = late.request(indented, at + 4)
    assert heal == "    "
    assert early_text.startswith('    """') and early_text[4:] == late_text
    # The same prompt both times: the second request reuses all of it from the first one's slot.
    assert late_done.stats.prompt_tokens == early_done.stats.prompt_tokens
    assert late_done.stats.prefilled_tokens == 0


def test_a_word_no_token_spells_is_spelled_again_from_the_slot_without_a_forward(engine: Engine) -> None:
    at = DOC.index("    return len(chunks)")
    text = DOC[:at] + "\n" + DOC[at:]
    typist = Typist(engine)
    typist.request(text, at + 1)
    steps, replayed, last = [], [], None
    for k, ch in enumerate("    words = split_words(text)"):
        text = text[: at + 1 + k] + ch + text[at + 1 + k :]
        last = typist.builder.build(text, at + 2 + k, head=typist.head, known=typist.pieces)
        done, _, heal = typist.request(text, at + 2 + k)
        steps.append(done.stats.steps_to_text)
        replayed.append(done.stats.replayed_tokens)
        assert done.stats.prefilled_tokens == 0
    # No token spells " split_words": healing spells it " split_" + "words" at every key of the
    # word, as the key before did, so those tokens (and the rest of an unchanged suggestion) are
    # fed back from the slot; a new suggestion (" sorted(" for " s", " split_" for " sp") runs its forwards.
    assert heal == ")" and steps == [0] * 29
    assert replayed == [8] * 4 + [0] + [4] * 4 + [3, 3, 2, 0, 0] + [6] * 9 + [4, 3, 3, 3, 3, 2]
    # The same tokens as an engine whose slot holds nothing of this document.
    assert last is not None
    params = SamplingParams(max_tokens=16)
    with Engine(replace(engine.config, num_slots=1)) as cold:
        fresh = cold.complete(CompletionRequest(last.ids, params, heal_text=last.heal_text))
    assert fresh.token_ids == done.token_ids and fresh.stats.replayed_tokens == 0


def test_keep_warm_replays_change_no_result() -> None:
    """The idle engine thread's replays (engine/warm.py) between keystrokes leave every result as it is:
    the same tokens, texts, reused and prefilled counts and steps to the first text."""
    config = EngineConfig(model=default_model_path(), device="cpu", dtype="float32", max_context=1024)
    runs = []
    for interval in (None, 0.002):
        with Engine(config) as eng:
            with pytest.raises(ValueError, match="keep-warm interval must be > 0 seconds or None, got 0"):
                eng.keep_warm(0)
            eng.keep_warm(interval)
            at = DOC.index("    return len(chunks)")
            text = DOC[:at] + "\n" + DOC[at:]
            typist = Typist(eng)
            typist.request(text, at + 1)
            results = []
            for k, ch in enumerate("    chunks.sort("):
                time.sleep(0.02)  # between keystrokes: replays while the engine is idle
                text = text[: at + 1 + k] + ch + text[at + 1 + k :]
                done, shown, _ = typist.request(text, at + 2 + k)
                s = done.stats
                results.append(
                    (done.token_ids, done.text, shown, s.reused_tokens, s.prefilled_tokens, s.steps_to_text)
                )
            runs.append((results, eng.stats()["warm_replays"]))
    (plain, none), (warm, replays) = runs
    assert warm == plain
    assert none == 0 and replays >= 16
