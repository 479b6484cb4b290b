"""Request lifecycle against a scripted engine handle (controlled timing for the races; the end-to-end
tests run the real engine): first-line responses, typing through, latest-wins, cancellation, staleness."""

from __future__ import annotations

import asyncio

from lsp_dscoder.documents import Document, Edit, Splice
from lsp_dscoder.engine.api import TokenEvent
from lsp_dscoder.positions import Encoding
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.session import DocumentSession, Generation, Subscriber
from lsp_dscoder.settings import ResponseMode
from lsp_dscoder.stats import Stats

DOC = "def f(x):\n    \n"
CURSOR = DOC.index("\n    \n") + 5


class ScriptedHandle:
    """Tokens arrive when the test pushes them; `cancel` ends the stream like the engine's flag."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        self.cancelled = False

    def push(self, *texts: str) -> None:
        for i, text in enumerate(texts):
            self.queue.put_nowait(TokenEvent(index=i, token_id=i, text=text, piece=text))

    def cancel(self) -> None:
        self.cancelled = True
        self.queue.put_nowait(None)

    async def stream(self):
        while (event := await self.queue.get()) is not None:
            yield event

    async def wait(self) -> None:
        return None


def start(
    mode: ResponseMode = ResponseMode.FIRST_LINE, text: str = DOC
) -> tuple[Generation, ScriptedHandle, list]:
    handle, done = ScriptedHandle(), []
    gen = Generation(
        handle,
        Shaper(CursorContext.at(text, CURSOR)),
        text=text,
        cursor=CURSOR,
        mode=mode,
        on_done=lambda g, completion: done.append(g.shaper.rule),
    )
    gen.start()
    return gen, handle, done


def subscriber(stats: Stats, request_id: int, version: int, partials: list, skip: int = 0) -> Subscriber:
    record = stats.begin(request_id, "file:///a.py", version)
    return Subscriber(request_id, version, skip, lambda text, done: partials.append((text, done)), record)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_first_line_answers_early_and_partials_continue_to_the_end():
    gen, handle, done = start()
    partials: list = []
    sub = subscriber(Stats(), 1, 1, partials)
    gen.subscribe(sub)
    handle.push("return", " x")
    await settle()
    assert not sub.future.done() and partials[-1] == ("return x", False)
    handle.push("\n", "    y = 1", "\n")
    await settle()
    assert sub.future.result() == "return x"  # while decoding continues
    assert not gen.finished
    handle.push("\n")  # blank line after a finished block: the suggestion is complete
    await settle()
    assert handle.cancelled and gen.finished and done
    assert partials[-1] == ("return x\n    y = 1", True)
    assert [p[0] for p in partials] == ["return", "return x", "return x\n    y = 1", "return x\n    y = 1"]


async def test_full_mode_answers_at_the_end():
    gen, handle, _ = start(ResponseMode.FULL)
    sub = subscriber(Stats(), 1, 1, [])
    gen.subscribe(sub)
    handle.push("a = 1", "\n")
    await settle()
    assert not sub.future.done()
    handle.push("    b = 2")
    handle.queue.put_nowait(None)
    await settle()
    assert sub.future.result() == "a = 1\n    b = 2"


async def test_typing_through_is_answered_from_memory():
    gen, handle, _ = start()
    first: list = []
    gen.subscribe(subscriber(Stats(), 1, 1, first))
    handle.push("return x + 1", "\n", "    ")
    await settle()
    typed = DOC[:CURSOR] + "return x" + DOC[CURSOR:]
    assert gen.typed_through(typed) == 8
    assert gen.typed_through(typed, CURSOR + 8) == 8
    assert gen.typed_through(typed, CURSOR + 7) is None  # the cursor is not after the typed text
    assert gen.typed_through(DOC[:CURSOR] + "return y" + DOC[CURSOR:]) is None
    later: list = []
    sub = subscriber(Stats(), 2, 2, later, skip=8)
    gen.subscribe(sub)
    assert sub.future.result() == " + 1" and later == [(" + 1", False)]


async def test_latest_request_wins_and_detach_cancels_the_engine():
    gen, handle, _ = start()
    old, new = subscriber(Stats(), 1, 1, []), subscriber(Stats(), 2, 1, [])
    gen.subscribe(old)
    gen.subscribe(new)
    assert old.future.result() is None and old.record.outcome.value == "superseded"
    gen.detach(new)
    assert handle.cancelled and gen.cancelled
    await settle()
    assert gen.finished


async def test_a_diverging_edit_cancels_and_stale_requests_get_nothing():
    session = DocumentSession("file:///a.py")
    gen, handle, _ = start()
    session.generation = gen
    partials: list = []
    sub = subscriber(Stats(), 1, 1, partials)
    gen.subscribe(sub)
    handle.push("return x")
    await settle()
    session.changed(DOC[:CURSOR] + "ret" + DOC[CURSOR:], 2)  # continues the suggestion
    assert sub.future.result() is None and not handle.cancelled
    count = len(partials)
    handle.push(" + 1")
    await settle()
    assert len(partials) == count  # no partials for a stale version
    session.changed(DOC[:CURSOR] + "rex" + DOC[CURSOR:], 3)  # does not
    assert handle.cancelled and gen.typed_through(DOC[:CURSOR] + "ret" + DOC[CURSOR:]) is None


async def test_cancelling_an_already_superseded_request_keeps_the_generation():
    session = DocumentSession("file:///a.py")
    gen, handle, _ = start()
    session.generation = gen
    sub = subscriber(Stats(), 1, 1, [])
    gen.subscribe(sub)
    handle.push("return x")
    await settle()
    session.changed(DOC[:CURSOR] + "ret" + DOC[CURSOR:], 2)  # continues the suggestion: sub answered None
    gen.detach(sub)  # a late $/cancelRequest for it
    assert not handle.cancelled and not gen.cancelled
    assert gen.typed_through(DOC[:CURSOR] + "ret" + DOC[CURSOR:]) == 3


class CountingText(str):
    """A document text that counts the whole-text comparisons made on it."""

    passes = 0

    def startswith(self, prefix, *args):  # type: ignore[no-untyped-def, override]
        if not args:
            CountingText.passes += 1
        return super().startswith(prefix, *args)

    def endswith(self, suffix, *args):  # type: ignore[no-untyped-def, override]
        CountingText.passes += 1
        return super().endswith(suffix, *args)


async def suggesting_with_counted_comparisons() -> Generation:
    """A generation showing "return x + 1" to one request, with CountingText's count at zero."""
    CountingText.passes = 0
    gen, handle, _ = start()
    gen.subscribe(subscriber(Stats(), 1, 1, []))
    handle.push("return x + 1", "\n")
    await settle()
    return gen


async def test_the_text_a_did_change_checked_is_not_compared_again_by_its_request():
    gen = await suggesting_with_counted_comparisons()
    typed = CountingText(DOC[:CURSOR] + "ret" + DOC[CURSOR:])
    assert gen.typed_through(typed) == 3  # didChange: the text before and after the cursor compared
    assert CountingText.passes == 2
    assert gen.typed_through(typed, CURSOR + 3) == 3  # its request: the same text, not compared again
    assert CountingText.passes == 2
    other = CountingText(DOC[:CURSOR] + "retX" + DOC[CURSOR:])
    assert gen.typed_through(other) is None  # another text is compared
    assert CountingText.passes == 4


async def test_typing_through_reads_only_the_typed_characters_of_the_document():
    gen = await suggesting_with_counted_comparisons()
    text: str = DOC
    for n in range(1, 4):  # each didChange: one character inserted at the cursor
        typed = CountingText(DOC[:CURSOR] + "ret"[:n] + DOC[CURSOR:])
        edit = Splice(text, CURSOR + n - 1, CURSOR + n - 1, 1)
        assert gen.typed_through(typed, splice=edit) == n
        text = typed
    assert CountingText.passes == 0  # nothing compared but the typed characters
    edit = Splice(text, 0, 0, 1)  # an edit before the cursor: the text is compared, and does not continue
    assert gen.typed_through(CountingText("#" + text), splice=edit) is None
    assert CountingText.passes == 1


def test_a_document_reports_a_one_range_change_as_a_splice_of_its_old_text():
    doc = Document("file:///a.py", "python", 1, "ab\ncd\n")
    old = doc.text
    doc.apply(2, [Edit("XY", (1, 0, 1, 1))], Encoding.UTF16)
    assert doc.text == "ab\nXYd\n" and doc.splice == Splice(old, 3, 4, 2) and doc.splice.before is old
    doc.apply(3, [Edit("1", (0, 0, 0, 0)), Edit("2", (0, 0, 0, 0))], Encoding.UTF16)
    assert doc.splice is None  # several edits: compared as a whole
