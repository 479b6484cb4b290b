"""The completion handle's hand-over of the first visible text, and the slot's prefix match and kept
logits: the pieces of a keystroke's path that run once per request on every keystroke."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import torch

from lsp_dscoder.engine.api import CompletionRequest, TokenEvent
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.handle import CompletionHandle
from lsp_dscoder.engine.kv_cache import MAX_CACHED_LOGITS, KVCache, Slot
from lsp_dscoder.engine.prefix import VocabularyCheck, as_ids, common_prefix, outside


def _event(index: int, text: str) -> TokenEvent:
    return TokenEvent(index=index, token_id=index, text=text, piece=text)


class _SlowHandle(CompletionHandle):
    HANDOVER_S = 5.0  # far longer than any scheduling delay: a wait that times out fails the test


async def test_the_producer_waits_until_the_consumer_took_the_first_visible_text() -> None:
    handle = _SlowHandle(CompletionRequest(prompt_ids=(1,)))
    taken: list[tuple[str, float]] = []
    returned: list[tuple[int, float]] = []

    def produce() -> None:
        for i, text in enumerate(("", "x", "y")):  # "" re-spells typed text: nothing visible yet
            handle._publish(_event(i, text))
            returned.append((i, time.monotonic()))

    async def consume() -> None:
        async for event in handle.stream():
            taken.append((event.text, time.monotonic()))
            if len(taken) == 3:
                return

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0)  # the consumer is listening before the first event
    started = time.monotonic()
    thread = threading.Thread(target=produce)
    thread.start()
    await asyncio.wait_for(consumer, 10)
    thread.join(10)
    assert [t for t, _ in taken] == ["", "x", "y"]
    took_x = taken[1][1]
    assert returned[1][1] >= took_x  # "x" was taken before its _publish returned
    assert returned[1][1] - started < 4.0  # ... and the wait ended on it, not on the time limit


async def test_a_consumer_on_the_producing_thread_is_never_waited_for() -> None:
    handle = _SlowHandle(CompletionRequest(prompt_ids=(1,)))
    stream = handle.stream()
    pending = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)  # subscribed on this thread
    started = time.monotonic()
    handle._publish(_event(0, "x"))  # the remote backend publishes on the loop that reads its stream
    assert time.monotonic() - started < 1.0
    assert (await pending).text == "x"
    await stream.aclose()


def test_common_prefix_matches_a_token_by_token_walk() -> None:
    def walk(a: list[int], b: tuple[int, ...]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(7)
    for _ in range(500):
        cached = [rng.randrange(4) for _ in range(rng.randrange(0, 1400))]
        keep = rng.randrange(0, len(cached) + 1)
        prompt = tuple(cached[:keep]) + tuple(rng.randrange(4) for _ in range(rng.randrange(0, 700)))
        assert common_prefix(cached, prompt) == walk(cached, prompt)
        # as the engine holds them: arrays of int64, compared as raw slices
        assert common_prefix(as_ids(cached), as_ids(prompt)) == walk(cached, prompt)
        assert common_prefix(as_ids(cached), prompt) == walk(cached, prompt)
    assert common_prefix(list(range(5000)), tuple(range(5000))) == 5000
    assert common_prefix(list(range(5000)), (*range(4999), -1)) == 4999
    assert common_prefix([], (1, 2)) == 0


def test_ids_are_int64_arrays_checked_in_c() -> None:
    ids = as_ids((5, 0, 7))
    assert ids.typecode == "q" and as_ids(ids) is ids and list(ids) == [5, 0, 7]
    long = as_ids([3] * 100 + [9])
    assert outside(long, 9) == 9 and outside(long, 10) is None and outside(as_ids([2] * 100 + [-1]), 9) == -1
    # what was checked is remembered as it was, whatever its caller does with the array afterwards
    check, checked = VocabularyCheck(10), as_ids([1, 2, 3])
    assert check.outside("doc", checked) is None
    checked[2] = 99
    assert check.outside("doc", as_ids([1, 2, 99, 4])) == 99
    with pytest.raises(TypeError):
        as_ids((1, 2.5))
    with pytest.raises(OverflowError):
        as_ids((2**63,))


def test_a_document_whose_slot_holds_half_its_prompt_compares_no_other_slot() -> None:
    cfg = ModelConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
        head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling_factor=1.0, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    cache = KVCache(cfg, 3, 64, torch.device("cpu"), torch.float32)
    for slot, key in zip(cache.slots, ("a", "b", "c"), strict=True):
        slot.key = key
    cache.slots[0].extend(range(10))
    cache.slots[1].extend(range(20))
    compared = []
    for slot in cache.slots:
        slot.match = lambda prompt, s=slot: compared.append(s.index) or common_prefix(s.tokens, prompt)
    m = cache.match(as_ids(range(20)), "a")
    assert (m.slot.index, m.reused, compared) == (0, 10, [0])  # 2 x 10 >= 20: slot "b" cannot win
    compared.clear()
    m = cache.match(as_ids(range(25)), "c")  # its own slot is empty: the longest prefix is looked for
    assert (m.slot.index, m.reused, sorted(compared)) == (1, 20, [0, 1, 2])


def _logits(value: float) -> torch.Tensor:
    return torch.full((1, 5), value)


def test_a_slot_keeps_the_logits_of_its_newest_positions_in_one_buffer() -> None:
    slot = Slot(0)
    slot.extend(range(10), _logits(9.0))  # a prompt: logits at its last position only
    for pos in range(10, 10 + MAX_CACHED_LOGITS):  # a suggestion as long as the ring
        kept = slot.extend((pos,), _logits(float(pos)))
        assert kept is not None and kept.data_ptr() == slot.logits_at(pos).data_ptr()
    assert slot.logits_at(8) is None  # not kept
    assert slot.logits_at(9) is None  # its row was taken by position 9 + MAX_CACHED_LOGITS
    assert torch.equal(slot.logits_at(10), _logits(10.0))
    last = 9 + MAX_CACHED_LOGITS
    assert torch.equal(slot.logits_at(last), _logits(float(last)))
    ring = slot.logits_at(10).untyped_storage().data_ptr()
    slot.truncate(12)  # a keystroke: the positions after it are gone, their rows kept
    assert slot.logits_at(11) is not None and slot.logits_at(12) is None
    assert slot.kept_positions() == {10, 11}
    # a draft said position 12 was kept: its row still holds it, and keeping it again copies nothing
    assert torch.equal(slot.draft_logits(12), _logits(12.0))
    again = slot.extend((12,), slot.draft_logits(12))
    assert again is not None and torch.equal(again, _logits(12.0)) and slot.kept_positions() == {10, 11, 12}
    assert again.untyped_storage().data_ptr() == ring  # no tensor was allocated for the kept logits


def test_a_prompt_is_checked_against_the_vocabulary_only_past_its_document_s_last_one() -> None:
    check = VocabularyCheck(100)
    prompt = tuple(range(100)) * 10
    assert check.outside("a", prompt) is None
    seen: list[int] = []

    class Counted(tuple):  # counts the ids min/max read: only the new tail's
        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            part = tuple.__getitem__(self, index)
            if isinstance(index, slice) and index.start:
                seen.append(len(part))
            return part

    assert check.outside("a", Counted((*prompt, 5, 7))) is None
    assert seen == [2]
    assert check.outside("a", (*prompt, 5, 100)) == 100  # the bad id is found past the shared prefix
    assert check.outside("b", (-1, *prompt)) == -1  # another document: checked whole
    assert check.outside("a", (*prompt[:50], 200, *prompt[51:])) == 200  # an edit far back
