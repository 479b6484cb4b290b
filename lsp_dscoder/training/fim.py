"""DeepSeek-Coder's document format: special token names, document-level FIM in PSM order, packing.

A document becomes `<bos>text<eos>`, or, with probability `fim_rate`, is cut at two character positions
drawn uniformly (as in the FIM paper's Megatron implementation) and becomes
`<bos><｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>middle<eos>`, the three parts tokenised
separately. Where the transformation happens is a `FimPlacement`:

- DOCUMENT: whole files before packing. A file longer than the training window is then cut by the
  packing, so most FIM examples of long files lose the prefix or the suffix from view, and the model
  learns to infill only weakly.
- WINDOW: after packing, on the part of each document inside one window (Megatron's sample-level FIM),
  so that prefix, suffix and middle are always seen together. Use this one.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
FIM_BEGIN = "<｜fim▁begin｜>"
FIM_HOLE = "<｜fim▁hole｜>"
FIM_END = "<｜fim▁end｜>"
SPECIAL_TOKENS = (BOS, EOS, FIM_BEGIN, FIM_HOLE, FIM_END)


class FimPlacement(enum.Enum):
    DOCUMENT = "document"
    WINDOW = "window"


@dataclass(frozen=True)
class SpecialIds:
    bos: int
    eos: int
    fim_begin: int
    fim_hole: int
    fim_end: int

    @classmethod
    def from_tokenizer(cls, tok) -> SpecialIds:
        ids = [tok.token_to_id(name) for name in SPECIAL_TOKENS]
        if None in ids:
            missing = [name for name, i in zip(SPECIAL_TOKENS, ids, strict=True) if i is None]
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        return cls(*ids)


def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Cut text at two uniform character positions: (prefix, middle, suffix)."""
    a, b = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    return text[:a], text[a:b], text[b:]


def psm_ids(ids: SpecialIds, prefix: list[int], suffix: list[int], middle: list[int]) -> list[int]:
    """The PSM prompt up to and including `<｜fim▁end｜>`, then the middle (an empty middle is allowed)."""
    return [ids.bos, ids.fim_begin, *prefix, ids.fim_hole, *suffix, ids.fim_end, *middle]


def encode_plain(tok, texts: list[str], ids: SpecialIds) -> list[np.ndarray]:
    """Each text as `<bos>text<eos>` (uint16 token ids)."""
    encoded = tok.encode_batch(texts, add_special_tokens=False)
    return [np.asarray([ids.bos, *e.ids, ids.eos], dtype=np.uint16) for e in encoded]


def encode_documents(
    tok, texts: list[str], ids: SpecialIds, rng: random.Random, fim_rate: float
) -> list[np.ndarray]:
    """Each text as one document (uint16 ids), FIM-transformed whole with probability fim_rate."""
    parts: list[str] = []
    layout: list[bool] = []  # per document: FIM or not
    for text in texts:
        fim = rng.random() < fim_rate
        layout.append(fim)
        parts.extend(fim_split(text, rng) if fim else (text,))
    encoded = iter(e.ids for e in tok.encode_batch(parts, add_special_tokens=False))
    docs = []
    for fim in layout:
        if fim:
            prefix, middle, suffix = next(encoded), next(encoded), next(encoded)
            doc = [*psm_ids(ids, prefix, suffix, middle), ids.eos]
        else:
            doc = [ids.bos, *next(encoded), ids.eos]
        docs.append(np.asarray(doc, dtype=np.uint16))
    return docs


def fim_windows(
    tok, windows: list[np.ndarray], ids: SpecialIds, rng: random.Random, fim_rate: float
) -> list[np.ndarray]:
    """Apply FIM to each document segment (a run of ordinary tokens) of each packed window.

    Done inside the window, as in the Megatron implementation of the FIM paper, so that prefix, suffix
    and middle are always seen together even when a file is longer than the window. A segment is
    decoded to text, cut at two uniform character positions and its three parts re-tokenised; the
    window keeps its length (a few tokens are cut from its end, or it is padded with `<eos>`).
    """
    plans: list[list[tuple[bool, np.ndarray]]] = []
    parts: list[str] = []
    for window in windows:
        bounds = np.flatnonzero((window == ids.bos) | (window == ids.eos))
        plan, last = [], 0
        for b in [*bounds.tolist(), len(window)]:
            if b > last:
                segment = window[last:b]
                fim = rng.random() < fim_rate
                plan.append((fim, segment))
                if fim:
                    parts.extend(fim_split(tok.decode(segment.tolist()), rng))
            if b < len(window):
                plan.append((False, window[b : b + 1]))
            last = b + 1
        plans.append(plan)
    encoded = iter(e.ids for e in tok.encode_batch(parts, add_special_tokens=False))
    out = []
    for window, plan in zip(windows, plans, strict=True):
        pieces = []
        for fim, segment in plan:
            if fim:
                prefix, middle, suffix = next(encoded), next(encoded), next(encoded)
                segment = [ids.fim_begin, *prefix, ids.fim_hole, *suffix, ids.fim_end, *middle]
            pieces.append(np.asarray(segment, dtype=np.uint16))
        joined = np.concatenate(pieces)[: len(window)]
        if len(joined) < len(window):
            joined = np.concatenate([joined, np.full(len(window) - len(joined), ids.eos, dtype=np.uint16)])
        out.append(joined)
    return out


def pack(docs: Iterable[np.ndarray], seq_len: int) -> Iterator[np.ndarray]:
    """Concatenate documents and cut the stream into windows of seq_len tokens (the tail is dropped)."""
    buffer = np.empty(0, dtype=np.uint16)
    for doc in docs:
        buffer = np.concatenate([buffer, doc])
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            buffer = buffer[seq_len:]
