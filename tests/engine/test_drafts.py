"""Draft tokens from the request's own tokens (engine/lookup.py): what the lookup proposes, the runners'
every-row step that checks them, and greedy decoding that keeps the tokens the model agrees with and
nothing else (the bundled model: a trained one, whose completions repeat their context)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine import Engine, EngineConfig, StopReason
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.lookup import Lookup
from tests.engine.fim import fim_prompt, req
from tests.engine.test_fast_path import ATOL, build
from tests.tiny import cached_checkpoint

# The second call repeats the first one's arguments: what the lookup finds, and the model agrees with.
BEFORE = """def run(model_path, device_name, max_tokens):
    result = load_and_run(model_path, device_name, max_tokens)
    return result


def run_twice(model_path, device_name, max_tokens):
    first = load_and_run("""


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_last_tokens() -> None:
    assert Lookup([5, 6, 7, 8, 9, 5, 6], room=4).propose(3) == (7, 8, 9)
    # The latest of two occurrences, and only as many tokens as follow it.
    assert Lookup([1, 2, 3, 1, 2, 4, 1, 2], room=4).propose(2) == (4, 1)
    assert Lookup([1, 2, 3, 1, 2, 4, 1, 2], room=4).propose(7) == (4, 1, 2)
    # The longest recurring tail wins: (3, 1, 2) recurs, so what followed it, not (1, 2)'s latest.
    assert Lookup([3, 1, 2, 9, 4, 1, 2, 5, 3, 1, 2], room=4).propose(1) == (9,)
    assert Lookup([1, 2, 3, 4], room=4).propose(3) == ()  # nothing recurs
    assert Lookup([7, 8, 7], room=4, min_ngram=1).propose(3) == (8, 7)  # one token, when allowed
    assert Lookup([7, 8, 7], room=4).propose(3) == ()
    grown = Lookup([1, 2, 3], room=1)
    grown.push(1)
    grown.push(2)  # past `room`: not kept
    assert grown.n == 4 and grown.propose(3) == ()
    grown = Lookup([1, 2, 3, 9], room=2)
    grown.push(1)
    grown.push(2)
    assert grown.propose(3) == (3, 9, 1)
    with pytest.raises(ValueError, match="min_ngram"):
        Lookup([1], room=1, min_ngram=3, max_ngram=2)


def test_every_row_step_matches_the_reference(tmp_path_factory) -> None:
    folder = cached_checkpoint(
        tmp_path_factory.mktemp("drafts"), "gqa-hd16", hidden_size=64, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, rope_scaling={"type": "linear", "factor": 4.0},
    )  # fmt: skip
    model, cache = build(folder)
    fast, ref = FastRunner(model, cache, graphs=False), ReferenceRunner(model, cache)
    ids = torch.randint(0, model.cfg.vocab_size, (13,), generator=torch.Generator().manual_seed(2))
    fast.prefill(ids[:9], 0, 0)
    ref.prefill(ids[:9], 0, 1)
    rows = fast.verify(ids[9:13], 9, 0)
    assert rows is not None and rows.shape == (4, model.cfg.vocab_size)
    want = ref.verify(ids[9:13], 9, 1)
    torch.testing.assert_close(rows, want, atol=ATOL, rtol=0)
    # Its last row is what a prefill of the same tokens returns.
    torch.testing.assert_close(rows[-1:], ref.prefill(ids[9:13], 9, 1), atol=ATOL, rtol=0)


def expected_drafts(
    prompt: tuple[int, ...], out: tuple[int, ...], k: int, max_tokens: int
) -> tuple[int, int]:
    """(drafted, accepted) of a drafting run whose greedy output is `out`, worked out from the output
    alone: after each token with a step to come, either the next draft is the token (kept), or the lookup
    proposes up to k tokens, of which those equal to the output's next ones are kept."""
    lookup, pending, drafted, accepted = Lookup(prompt, max_tokens), [], 0, 0
    for i, token in enumerate(out):
        lookup.push(token)
        if i + 1 >= max_tokens:
            break
        if pending and pending[0] == token:
            pending.pop(0)
            accepted += 1
            continue
        guess = lookup.propose(min(k, max_tokens - i - 2))
        drafted += len(guess)
        pending = list(guess)
    return drafted, accepted


def bundled(draft_tokens: int) -> Engine:
    """The bundled model on the CPU in float32, one slot, drafting as told."""
    where = {"model": default_model_path(), "device": "cpu", "dtype": "float32", "max_context": 512}
    return Engine(EngineConfig(**where, num_slots=1, draft_tokens=draft_tokens))


@pytest.fixture(scope="module")
def engines():
    with bundled(0) as plain, bundled(3) as drafting:
        yield plain, drafting


def test_drafting_keeps_greedy_decodings_tokens_and_saves_steps(engines: tuple[Engine, Engine]) -> None:
    plain, drafting = engines
    assert plain.draft_tokens == 0 and drafting.draft_tokens == 3  # given; the default is the path's
    prompt = fim_prompt(plain, BEFORE, "\n")
    want = plain.complete(req(prompt, max_tokens=40))
    got = drafting.complete(req(prompt, max_tokens=40))
    assert got.token_ids == want.token_ids and got.text == want.text
    assert (want.stats.drafted_tokens, want.stats.accepted_tokens) == (0, 0)
    drafted, accepted = expected_drafts(prompt, want.token_ids, 3, 40)
    assert (got.stats.drafted_tokens, got.stats.accepted_tokens) == (drafted, accepted)
    assert got.text == "model_path, device_name, max_tokens" and accepted >= 4
    assert got.stats.stop_reason == want.stats.stop_reason
    # The fast path's default, 7: the 8-token step.
    with bundled(7) as seven:
        longer = seven.complete(req(prompt, max_tokens=40))
    assert longer.token_ids == want.token_ids
    assert (longer.stats.drafted_tokens, longer.stats.accepted_tokens) == expected_drafts(
        prompt, want.token_ids, 7, 40
    )


def test_typing_through_a_drafted_suggestion_needs_no_prefill(engines: tuple[Engine, Engine]) -> None:
    _, drafting = engines
    prompt = fim_prompt(drafting, BEFORE, "\n\n# run it twice\n")  # not the other tests' prompt: no replay
    first = drafting.complete(req(prompt, max_tokens=40))
    assert first.stats.replayed_tokens == 0
    assert first.stats.accepted_tokens > 0
    # Every generated position kept its logits (accepted drafts too), so a prompt ending anywhere inside
    # the suggestion runs nothing before its first token, and continues it.
    assert len(first.token_ids) >= 5
    for typed in (1, 3, len(first.token_ids) - 1):
        again = drafting.complete(req((*prompt, *first.token_ids[:typed]), max_tokens=6))
        assert again.stats.prefilled_tokens == 0
        assert again.token_ids == first.token_ids[typed : typed + len(again.token_ids)]


def test_drafts_stop_at_max_tokens_and_are_greedy_only(engines: tuple[Engine, Engine]) -> None:
    plain, drafting = engines
    prompt = fim_prompt(plain, BEFORE, "\n\n# max\n")  # its own suffix: nothing to replay from another test
    want = plain.complete(req(prompt, max_tokens=4))
    got = drafting.complete(req(prompt, max_tokens=4))
    assert got.token_ids == want.token_ids and got.stats.stop_reason is StopReason.MAX_TOKENS
    assert got.stats.replayed_tokens == 0 and got.stats.drafted_tokens > 0
    assert (got.stats.drafted_tokens, got.stats.accepted_tokens) == expected_drafts(
        prompt, want.token_ids, 3, 4
    )
    sampled = drafting.complete(req(prompt, max_tokens=12, temperature=0.8, seed=1))
    assert (sampled.stats.drafted_tokens, sampled.stats.accepted_tokens) == (0, 0)


def test_draft_tokens_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="draft_tokens must be in"):
        EngineConfig(model=tmp_path, draft_tokens=8)
