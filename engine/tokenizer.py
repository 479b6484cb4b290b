"""Tokenizer of a checkpoint folder: FIM token ids looked up by name, and incremental decoding that
never splits a multi-byte UTF-8 character."""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer as HFTokenizer

from lsp_dscoder.engine.errors import CheckpointError

FIM_BEGIN = "<｜fim▁begin｜>"
FIM_HOLE = "<｜fim▁hole｜>"
FIM_END = "<｜fim▁end｜>"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"


def _token_name(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        path = folder / "tokenizer.json"
        if not path.exists():
            raise CheckpointError(f"missing tokenizer.json in checkpoint folder {folder}")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"{path} is not a valid tokenizer file: {e}") from None
        # Text in documents that happens to spell a special token is text, not a control token.
        self._tok.encode_special_tokens = True
        cfg: dict[str, object] = {}
        if (folder / "tokenizer_config.json").exists():
            try:
                cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{folder / 'tokenizer_config.json'} is not valid JSON: {e}") from None
        self.bos_id = self._lookup(_token_name(cfg.get("bos_token")) or BOS, folder)
        self.eos_id = self._lookup(_token_name(cfg.get("eos_token")) or EOS, folder)
        self.fim_begin_id = self._lookup(FIM_BEGIN, folder)
        self.fim_hole_id = self._lookup(FIM_HOLE, folder)
        self.fim_end_id = self._lookup(FIM_END, folder)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._heal_index: tuple[list[str], list[int], dict[str, list[int]]] | None = None
        self._sorted_ids: npt.NDArray[np.int64] | None = None  # the index's ids, in text order
        self._healable: dict[str, bool] = {}  # can_heal's answers (a dict's get/set: safe across threads)
        self._heal_lock = threading.RLock()  # used from the engine thread and from submitting threads

    def _lookup(self, name: str, folder: Path) -> int:
        token_id = self._tok.token_to_id(name)
        if token_id is None or self._tok.id_to_token(token_id) != name:
            raise CheckpointError(
                f"the tokenizer in {folder} has no {name} token: "
                "not a DeepSeek-Coder tokenizer with FIM support"
            )
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def prepare_healing(self) -> None:
        """Build token healing's vocabulary index now (the engine does it while loading)."""
        self._vocabulary_index()

    def healing_candidates(self, text: str) -> tuple[int, ...]:
        """Tokens that may come first when the output must begin with `text`: those whose text starts
        with it, and those whose text is a shorter non-empty prefix of it. Tokens that decode to part
        of a UTF-8 character, or to nothing (special tokens, `<eos>` included), are never candidates."""
        covering, partial = self.healing_split(text)
        return covering + partial

    def healing_split(self, text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`healing_candidates(text)` in two: the tokens that spell all of `text` (and maybe more), and
        those that spell only a shorter prefix of it (a decode step that shows nothing)."""
        keys, ids, _ = self._vocabulary_index()
        lo, hi = self._covering_range(keys, text)
        return tuple(ids[lo:hi]), tuple(i for a, b in self._partial_ranges(keys, text) for i in ids[a:b])

    @staticmethod
    def _covering_range(keys: list[str], text: str) -> tuple[int, int]:
        """Where the token texts that start with `text` lie in the sorted index."""
        return bisect.bisect_left(keys, text), bisect.bisect_left(keys, text + "\U0010ffff")

    @staticmethod
    def _partial_ranges(keys: list[str], text: str) -> list[tuple[int, int]]:
        """Where the tokens whose whole text is a shorter prefix of `text` lie in the sorted index: a
        range per such prefix, shortest first."""
        ranges = []
        for k in range(1, len(text)):
            start = bisect.bisect_left(keys, text[:k])
            end = bisect.bisect_right(keys, text[:k], start)
            if end > start:
                ranges.append((start, end))
        return ranges

    def can_heal(self, text: str) -> bool:
        """Whether whole tokens can spell `text`: every suffix the healing may be left with has a
        candidate (a character with no token of its own, only byte tokens, has none). Asked on every
        keystroke, mostly of a few recurring texts: the answers are kept."""
        known = self._healable.get(text)
        if known is None:
            known = self._healable[text] = self._spellable(text)
            if len(self._healable) > 1024:
                self._healable.clear()
        return known

    def _spellable(self, text: str) -> bool:
        keys, _, by_text = self._vocabulary_index()
        if all(ch in by_text for ch in text):
            return True  # each suffix starts with a character that is a token: a candidate either way
        for at in range(len(text)):
            rest = text[at:]
            i = bisect.bisect_left(keys, rest)
            extends = i < len(keys) and keys[i].startswith(rest)
            if not extends and not any(rest[:k] in by_text for k in range(1, len(rest))):
                return False
        return True

    def healing_index(
        self, text: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """`healing_split(text)` as id arrays, the covering tokens in two: those that spell more than
        `text` and those that are exactly `text` (which show nothing yet either). Cut from the
        vocabulary's ids in text order (one host array, built once): the covering tokens are one slice of
        it, the exact ones its start, the partial ones a slice per prefix of `text` that is a token's whole
        text. Host arrays: the healed sample is chosen on the host (engine/generate.py), where a handful of
        numpy calls replace a chain of device launches."""
        keys, _, _ = self._vocabulary_index()
        ordered = self._sorted_ids
        assert ordered is not None  # built with the index
        lo, hi = self._covering_range(keys, text)
        exact = bisect.bisect_right(keys, text, lo, hi)  # the exact ones sort first among the covering
        spans = [ordered[a:b] for a, b in self._partial_ranges(keys, text)]
        partial = ordered[:0] if not spans else spans[0] if len(spans) == 1 else np.concatenate(spans)
        return ordered[exact:hi], ordered[lo:exact], partial  # (longer,), (exact,), (partial,)

    def _vocabulary_index(self) -> tuple[list[str], list[int], dict[str, list[int]]]:
        """Each whole-character token text, sorted (with its id), and the ids of each text."""
        with self._heal_lock:
            if self._heal_index is None:
                singles = [[i] for i in range(self.vocab_size)]
                texts = self._tok.decode_batch(singles, skip_special_tokens=True)
                entries = sorted((t, i) for i, t in enumerate(texts) if t and "\ufffd" not in t)
                by_text: dict[str, list[int]] = {}
                for t, i in entries:
                    by_text.setdefault(t, []).append(i)
                self._heal_index = ([t for t, _ in entries], [i for _, i in entries], by_text)
                self._sorted_ids = np.asarray(self._heal_index[1], dtype=np.int64)
            return self._heal_index

    def stream(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas; holds back bytes of an unfinished UTF-8 character.

    Decodes a short window (from the last emitted boundary) so each step costs O(window), not O(n).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # end of what has been emitted

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        done = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(done) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end decodes as U+FFFD)."""
        done = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(done) :]
