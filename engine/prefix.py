"""What a keystroke's prompt shares with the one before it: the common prefix of two token-id sequences,
found by comparing whole slices in C rather than walking thousands of ids in Python, and the vocabulary
check of only the ids after it. Torch-free: the remote backend uses them too.

Token ids travel as `array('q')` (`as_ids`): the server builds its prompts that way and the cache slots
hold them so. A slice or a comparison of an array is a copy or a compare of raw int64s; the same on a
tuple of thousands of ints touches every int object (a reference count each), which is what a keystroke
paid, several times over, with its caches cold (docs/benchmarks.md, "Cold code").
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def as_ids(ids: Sequence[int]) -> array[int]:
    """`ids` as an array('q'): the object itself when it is one. TypeError for an id that is not an
    integer, OverflowError for one beyond int64."""
    if isinstance(ids, array) and ids.typecode == "q":
        return ids
    return array("q", ids)


def out_of_vocabulary(bad: int, vocab_size: int) -> str:
    """The message for a token id outside 0..vocab_size-1."""
    return f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"


def token_ids(ids: Sequence[int], vocab_size: int) -> array[int]:
    """`as_ids(ids)`, or ValueError naming the id that is not an integer or lies beyond int64."""
    try:
        return as_ids(ids)
    except TypeError:
        odd = next((t for t in ids if not isinstance(t, int)), None)
        raise ValueError(f"token ids must be integers, got {odd!r}") from None
    except OverflowError:
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(out_of_vocabulary(bad, vocab_size)) from None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix. Typing appends, so the answer is nearly always within the
    last few tokens of the shorter sequence: one comparison of whole slices settles the bulk, and a
    bisection over slices finds a difference further back."""
    if not (isinstance(a, array) and isinstance(b, array)) and type(a) is not type(b):
        a, b = tuple(a), tuple(b)  # a list slice never equals a tuple slice
    n = min(len(a), len(b))
    lo, hi = 0, n  # a[:lo] == b[:lo]; the first difference is before hi
    bulk = max(0, n - 16)
    if a[:bulk] == b[:bulk]:
        lo = bulk
    else:
        hi = bulk
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def outside(ids: Sequence[int], vocab_size: int) -> int | None:
    """The first id of `ids` outside 0..vocab_size-1, or None (two passes in C when all are inside)."""
    if isinstance(ids, array) and ids.typecode == "q" and len(ids) > 64:
        view = np.frombuffer(ids, dtype=np.int64)
        if int(view.min()) >= 0 and int(view.max()) < vocab_size:
            return None
    elif not ids or (min(ids) >= 0 and max(ids) < vocab_size):
        return None
    return next(t for t in ids if not 0 <= t < vocab_size)


class VocabularyCheck:
    """Finds token ids outside the vocabulary in a document's prompts, checking each prompt only past
    what it shares with that document's last checked one: a keystroke adds a token or two to thousands."""

    def __init__(self, vocab_size: int, documents: int = 8) -> None:
        self.vocab_size = vocab_size
        self._last: OrderedDict[object, Sequence[int]] = OrderedDict()
        self._documents = documents

    def outside(self, key: object, ids: Sequence[int]) -> int | None:
        """The first id of `ids` outside the vocabulary (None: all inside, and `ids` is remembered)."""
        last = self._last.pop(key, ())
        bad = outside(ids[common_prefix(last, ids) :], self.vocab_size)
        if bad is None:
            self._last[key] = ids[:]  # a copy: an array can change after it was checked (a tuple's is itself)
            if len(self._last) > self._documents:
                self._last.popitem(last=False)
        return bad
