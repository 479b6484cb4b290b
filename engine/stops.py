"""Stop strings over streamed text (no torch: the remote backend uses it too)."""

from __future__ import annotations


class StopStringFilter:
    """Holds back text that may be the start of a stop string; cuts the text at the first stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # all decoded text so far
        self.emitted = 0  # chars of self.text already released

    def push(self, delta: str) -> tuple[str, bool]:
        """Add decoded text; return (text now safe to release, whether a stop string was hit)."""
        before = len(self.text)
        self.text += delta
        hits = [i for s in self.stops if (i := self.text.find(s, max(0, before - len(s) + 1))) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            return self._release(len(self.text)), True
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._release(len(self.text) - hold), False

    def _release(self, upto: int) -> str:
        out = self.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return out

    def flush(self) -> str:
        return self._release(len(self.text))
