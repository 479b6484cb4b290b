"""A suggestion's first visible text leaves from the engine's thread (first_text.py), with a real
`CompletionHandle` fed by a producer thread as the engine feeds it: sent once, in order with the partials
the event loop sends after it, never after the request's answer, and only where the writer allows it."""

from __future__ import annotations

import asyncio
import threading

from lsp_dscoder.engine.api import Completion, CompletionRequest, CompletionStats, StopReason, TokenEvent
from lsp_dscoder.engine.handle import CompletionHandle
from lsp_dscoder.first_text import FirstText
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.session import Generation, Subscriber
from lsp_dscoder.settings import ResponseMode
from lsp_dscoder.stats import Stats

DOC = "def f(x):\n    \n"
CURSOR = DOC.index("\n    \n") + 5
Partials = list[tuple[str, bool, str]]  # (text, done, the sending thread's name)


def subscriber(stats: Stats, partials: Partials, any_thread: bool = True) -> Subscriber:
    def send(text: str, done: bool) -> None:
        partials.append((text, done, threading.current_thread().name))

    return Subscriber(1, 1, 0, send, stats.begin(1, "file:///a.py", 1), any_thread)


def begin(sub: Subscriber, text: str = DOC, cursor: int = CURSOR) -> tuple[Generation, CompletionHandle]:
    """What Completer._start does: the observer goes with the request, then the generation subscribes."""
    ctx = CursorContext.at(text, cursor)
    handle = CompletionHandle(CompletionRequest(prompt_ids=[1], observer=FirstText.of(ctx, sub)))
    gen = Generation(
        handle, Shaper(ctx), text=text, cursor=cursor, mode=ResponseMode.FULL, on_done=lambda *_: None
    )
    gen.start()
    gen.subscribe(sub)
    return gen, handle


def produce(handle: CompletionHandle, texts: list[str]) -> None:
    """The engine's side, on a thread named "engine": one event per text, then the end of the stream."""

    def run() -> None:
        for i, text in enumerate(texts):
            handle._publish(TokenEvent(index=i, token_id=i, text=text, piece=text))
        handle._publish(result=_completion())

    thread = threading.Thread(target=run, name="engine")
    thread.start()
    thread.join()


def _completion() -> Completion:
    stats = CompletionStats(1, 0, 1, 3, 0.0, 0.001, None, 0.002, StopReason.EOS, 0)
    return Completion(text="", token_ids=(), stats=stats)


async def settle(gen: Generation) -> None:
    for _ in range(100):
        if gen.finished:
            return
        await asyncio.sleep(0.001)


async def test_the_first_text_leaves_from_the_engine_thread_and_the_rest_from_the_loop():
    stats, partials = Stats(), []
    sub = subscriber(stats, partials)
    gen, handle = begin(sub)
    produce(handle, ["", "return", " x", "\n"])
    await settle(gen)
    loop_thread = threading.current_thread().name
    assert partials == [
        ("return", False, "engine"),
        ("return x", False, loop_thread),
        ("return x", True, loop_thread),
    ]
    assert sub.future.result() == "return x"
    assert sub.record.first_partial_early is True
    assert handle._handover is not None and handle._handover.is_set()  # nothing left to hand over
    assert handle.shown_index == 1  # the event whose text went out first ("" before it showed nothing)


async def test_a_writer_for_the_loop_only_gets_every_partial_on_the_loop():
    stats, partials = Stats(), []
    sub = subscriber(stats, partials, any_thread=False)
    gen, handle = begin(sub)
    produce(handle, ["return", " x"])
    await settle(gen)
    loop_thread = threading.current_thread().name
    assert partials == [
        ("return", False, loop_thread),
        ("return x", False, loop_thread),
        ("return x", True, loop_thread),
    ]
    assert sub.record.first_partial_early is False
    assert handle.shown_index is None  # the observer sent nothing


async def test_an_answered_request_gets_nothing_from_the_engine_thread():
    stats, partials = Stats(), []
    sub = subscriber(stats, partials)
    gen, handle = begin(sub)
    gen.drop_stale(2)  # the document changed before the first text: the request is answered, empty
    produce(handle, ["return", " x"])
    await settle(gen)
    assert partials == [] and sub.future.result() is None
    assert sub.record.first_partial_s is None


async def test_a_suggestion_complete_at_its_first_text_is_sent_once_with_done():
    text = "print(x)\n"
    cursor = text.index("x")  # text right of the cursor: one line, ended by its newline
    stats, partials = Stats(), []
    sub = subscriber(stats, partials)
    gen, handle = begin(sub, text, cursor)
    produce(handle, ["y, \n"])
    await settle(gen)
    assert partials == [("y, ", True, threading.current_thread().name)]
    assert handle.cancelled and sub.record.first_partial_early is False  # the loop freed the engine


def test_the_observer_sees_each_event_before_a_consumer_can():
    seen: list[tuple[str, int]] = []
    handle: CompletionHandle

    def observer(event: TokenEvent) -> bool:
        seen.append((event.text, len(list(handle._events))))  # the events a consumer could see by now
        return False

    handle = CompletionHandle(CompletionRequest(prompt_ids=[1], observer=observer))
    for i, text in enumerate(["a", "b", "c"]):
        handle._publish(TokenEvent(index=i, token_id=i, text=text, piece=text))
    assert seen == [("a", 0), ("b", 1), ("c", 2)]
