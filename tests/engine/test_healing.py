"""Token healing's choice on fixed inputs, with the bundled model's tokenizer (its real 8K vocabulary):
which tokens can spell a healed text, and which one wins for given logits."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.generate import HEALING, Healing
from lsp_dscoder.engine.tokenizer import Tokenizer

CPU = torch.device("cpu")


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


def test_the_token_that_spells_exactly_the_text_can_count_as_showing_nothing(tok) -> None:
    covering, partial = tok.healing_split(" chunk", exact_silent=True)
    assert texts(tok, covering) == [" chunks"]
    assert texts(tok, partial) == [" ", " c", " ch", " chunk"]
    on_device = tok.healing_index(" chunk", CPU, exact_silent=True)
    assert tuple(on_device[0].tolist()) == covering and tuple(on_device[1].tolist()) == partial
    # No token is the text: nothing moves.
    assert tok.healing_split(" split_words", exact_silent=True) == tok.healing_split(" split_words")
    # " chunks" a third as likely as " chunk": the exact token wins only without the handicap.
    covering, partial = tok.healing_index(" chunk", CPU, exact_silent=True)
    logits = torch.zeros(1, tok.vocab_size)
    chunk = tok.encode(" chunk")[0]
    logits[0, chunk] = 1.0 + math.log(3.0)
    logits[0, covering[0]] = 1.0
    assert Healing(16.0, exact_silent=True).logits(logits, covering, partial).argmax() == covering[0]
    plain = tok.healing_index(" chunk", CPU)
    assert Healing(16.0).logits(logits, *plain).argmax() == chunk


def test_a_partial_token_wins_only_when_the_model_is_that_much_surer_of_it(tok) -> None:
    covering, partial = tok.healing_index(" chunk", CPU)
    chunk, chunks, ch = [*covering.tolist(), 708]
    logits = torch.zeros(1, tok.vocab_size)
    logits[0, tok.encode(" the")[0]] = 10.0  # not a candidate: never chosen
    logits[0, ch] = 1.0 + math.log(3.0)  # " ch" is three times as likely as " chunks"
    logits[0, chunks], logits[0, chunk] = 1.0, 0.5

    def pick(odds: float) -> int:
        return int(Healing(odds).logits(logits, covering, partial).argmax())

    assert [pick(odds) for odds in (1.0, 2.0, 4.0, math.inf)] == [ch, ch, chunks, chunks]
    assert pick(HEALING.partial_odds) == chunks
    # With no covering token the handicap is common to all: the likeliest partial token wins.
    covering, partial = tok.healing_index(" split_words", CPU)
    logits[0, 4865], logits[0, 6180] = 2.0, 1.0
    assert Healing(math.inf).logits(logits, covering, partial).argmax() == 4865
    with pytest.raises(ValueError, match="partial_odds must be >= 1, got 0.5"):
        Healing(0.5)


def test_a_text_can_be_healed_exactly_when_every_suffix_has_a_candidate(tok) -> None:
    rng = random.Random(3)
    alphabet = "ab _()=:\n\t.é日本🙂\u2603"  # the last ones have no token of their own in this vocabulary
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
        expected = all(tok.healing_candidates(text[i:]) for i in range(len(text)))
        assert tok.can_heal(text) == expected, text
        assert tok.can_heal(text) == expected, text  # the kept answer
    assert tok.can_heal(" count") and not tok.can_heal("x🙂")
