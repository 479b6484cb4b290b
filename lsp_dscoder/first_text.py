"""A suggestion's first visible text, sent from the thread that produced it.

The user waits for a suggestion's first characters. The engine's thread has them in hand; the event loop
gets them only after its thread is woken and the loop turns (~0.1 ms on a host that idles between
keystrokes). So a request carries an observer (`CompletionRequest.observer`) that shapes the engine's
events with a `Shaper` of its own and, the first time they show something, sends that text as the
request's first partial from the engine's thread. Everything after it goes out on the loop, which shapes
the same events with the generation's shaper and sends only what grew: `Subscriber.show_first` and
`Subscriber.show` share a lock, so nothing goes out twice, out of order, or after the request's answer.

Only for the request that started its generation (a typed-through one is answered from memory on the loop),
and only with a writer that may be called from any thread (stdio's; not TCP's asyncio transport).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsp_dscoder.postprocess import CursorContext, Shaper

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import TokenEvent
    from lsp_dscoder.session import Subscriber


class FirstText:
    """A request's observer: sends the first visible text of its suggestion (once), on the caller's thread."""

    def __init__(self, ctx: CursorContext, sub: Subscriber) -> None:
        self._shaper: Shaper | None = Shaper(ctx)  # the producer's own: the loop's is the generation's
        self._sub = sub

    @classmethod
    def of(cls, ctx: CursorContext, sub: Subscriber | None) -> FirstText | None:
        """The observer for `sub`'s request, or None where it could not send (no subscriber yet, or one
        whose partials must go out on the event loop): then the engine's thread shapes nothing."""
        return cls(ctx, sub) if sub is not None and sub.any_thread else None

    def __call__(self, event: TokenEvent) -> bool:
        shaper = self._shaper
        if shaper is None:
            return False
        shaper.feed(event.text)
        if not shaper.text and not shaper.stopped:
            return False  # nothing to show yet
        self._shaper = None  # one chance: after the first text the loop sends everything
        if shaper.stopped:  # complete at once: the loop sends it with `done`
            return False
        return self._sub.show_first(shaper.text)
