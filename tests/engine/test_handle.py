"""The completion handle's hand-over of the first visible text, and the slot's prefix match: the two
pieces of a keystroke's path that run once per request on every keystroke."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from lsp_dscoder.engine.api import CompletionRequest, TokenEvent
from lsp_dscoder.engine.handle import CompletionHandle
from lsp_dscoder.engine.kv_cache import common_prefix


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
    assert common_prefix(list(range(5000)), tuple(range(5000))) == 5000
    assert common_prefix(list(range(5000)), (*range(4999), -1)) == 4999
    assert common_prefix([], (1, 2)) == 0
