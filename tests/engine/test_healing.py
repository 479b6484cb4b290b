"""Token healing's choice on fixed inputs, with the bundled model's tokenizer (its real 8K vocabulary):
which tokens can spell a healed text, and which one wins for given logits."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.generate import HEALING, Healing
from lsp_dscoder.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(default_model_path())


def texts(tok: Tokenizer, ids: tuple[int, ...]) -> list[str]:
    return [tok.decode([i]) for i in ids]


def test_candidates_split_into_those_that_spell_all_of_the_text_and_those_that_spell_part(tok) -> None:
    covering, partial = tok.healing_split(" chunk")
    assert texts(tok, covering) == [" chunk", " chunks"]
    assert partial == (225, 288, 708) and texts(tok, partial) == [" ", " c", " ch"]
    assert tok.healing_candidates(" chunk") == covering + partial
    # A word no token spells: only partial tokens, each a step that shows nothing.
    assert tok.healing_split(" split_words") == ((), (225, 298, 2019, 4865, 6180))
    assert texts(tok, (4865, 6180)) == [" split", " split_"]
    # A run of spaces: the pre-tokenizer puts the last one before the word, so "   " is partial too.
    covering, partial = tok.healing_split("    ")
    assert len(covering) == 41 and texts(tok, partial) == [" ", "  ", "   "]


def test_the_covering_tokens_come_in_two_the_longer_and_the_exact(tok) -> None:
    longer, exact, partial = tok.healing_index(" chunk")
    assert texts(tok, tuple(longer.tolist())) == [" chunks"]
    assert texts(tok, tuple(exact.tolist())) == [" chunk"]
    assert tuple(exact.tolist()) + tuple(longer.tolist()) == tok.healing_split(" chunk")[0]
    assert tuple(partial.tolist()) == tok.healing_split(" chunk")[1] == (225, 288, 708)
    longer, exact, partial = tok.healing_index(" split_words")  # no token is the whole text
    assert len(longer) == len(exact) == 0 and tuple(partial.tolist()) == (225, 298, 2019, 4865, 6180)


def test_each_tier_further_from_showing_text_wins_only_when_the_model_is_that_much_surer(tok) -> None:
    index = tok.healing_index(" chunk")
    chunks, chunk, ch = index[0].item(), index[1].item(), 708
    logits = torch.zeros(1, tok.vocab_size)
    logits[0, tok.encode(" the")[0]] = 10.0  # not a candidate: never chosen
    # " chunk" three times as likely as " chunks": taken at exact odds up to 3, not beyond.
    logits[0, chunks], logits[0, chunk], logits[0, ch] = 1.0, 1.0 + math.log(3.0), 0.0

    def pick(partial_odds: float, exact_odds: float) -> int:
        return int(Healing(partial_odds, exact_odds).logits(logits, *index, " chunk").argmax())

    assert [pick(16.0, odds) for odds in (1.0, 2.0, 4.0, math.inf)] == [chunk, chunk, chunks, chunks]
    assert pick(HEALING.partial_odds, HEALING.exact_odds) == chunks
    # A partial token is handicapped against the exact one by partial_odds, and by both against the longer.
    logits[0, ch] = 1.0 + math.log(3.0) + math.log(8.0)  # 8x the exact token, 24x the longer one
    assert [pick(odds, 1.0) for odds in (4.0, 16.0)] == [ch, chunk]
    assert [pick(4.0, 4.0), pick(8.0, 4.0)] == [ch, chunks]  # 24x against 4 * 4, then against 8 * 4
    # Indentation keeps its exact token even: the tokenizer's own spelling of spaces before a word.
    spaces = tok.healing_index("   ")
    assert len(spaces[0]) and len(spaces[1])
    logits[0, spaces[1][0]], logits[0, spaces[0][0]] = 2.0, 1.0
    assert Healing(16.0, math.inf).logits(logits, *spaces, "   ").argmax() == spaces[1][0]
    # Every tier is even for indentation: 4 typed spaces before `return` are the partial "   " and
    # " return", and a longer run of spaces would indent deeper than the user did.
    longer, exact, partial = tok.healing_index("    ")
    three, seven = tok.encode("   ")[0], tok.encode("       ")[0]
    assert (
        three in partial.tolist()
        and seven in longer.tolist()
        and texts(tok, (three, seven)) == ["   ", " " * 7]
    )
    logits[0, three], logits[0, seven] = 3.0, 3.0 - math.log(2.0)  # the model: twice as sure of "   "
    masked = HEALING.logits(logits, longer, exact, partial, "    ")
    assert (
        masked.argmax() == three and masked[three] == 3.0 and masked[seven] == np.float32(3.0 - math.log(2.0))
    )
    # With no covering token the handicap is common to all: the likeliest partial token wins.
    index = tok.healing_index(" split_words")
    logits[0, 4865], logits[0, 6180] = 2.0, 1.0
    assert Healing(math.inf, math.inf).logits(logits, *index, " split_words").argmax() == 4865
    with pytest.raises(ValueError, match="partial_odds must be >= 1, got 0.5"):
        Healing(0.5)
    with pytest.raises(ValueError, match="exact_odds must be >= 1, got 0.5"):
        Healing(16.0, 0.5)


def test_the_healed_sample_is_taken_on_the_host_ties_to_the_lowest_id(tok) -> None:
    from lsp_dscoder.engine.api import SamplingParams

    longer, exact, partial = tok.healing_index("   ")  # 40 longer runs of spaces
    logits = torch.zeros(1, tok.vocab_size)
    logits[0, tok.encode(" the")[0]] = 10.0  # not a candidate
    top = sorted(int(i) for i in longer[:5])
    for i in top[1:]:  # equal logits: the first in vocabulary order wins, as argmax over the vocabulary
        logits[0, i] = 3.0
    assert HEALING.sample(logits, tok, "   ", SamplingParams(), None) == top[1]
    logits[0, top[0]] = 3.0
    assert HEALING.sample(logits, tok, "   ", SamplingParams(), None) == top[0]
    # Sampled (temperature > 0): only candidates can come out, whatever the seed.
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    picks = {HEALING.sample(logits, tok, "   ", params, gen) for _ in range(50)}
    candidates = {int(i) for i in (*longer, *exact, *partial)}
    assert picks <= candidates and len(picks) > 1


def test_a_text_can_be_healed_exactly_when_every_suffix_has_a_candidate(tok) -> None:
    rng = random.Random(3)
    alphabet = "ab _()=:\n\t.é日本🙂\u2603"  # the last ones have no token of their own in this vocabulary
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
        expected = all(tok.healing_candidates(text[i:]) for i in range(len(text)))
        assert tok.can_heal(text) == expected, text
        assert tok.can_heal(text) == expected, text  # the kept answer
    assert tok.can_heal(" count") and not tok.can_heal("x🙂")
