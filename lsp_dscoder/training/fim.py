"""DeepSeek-Coder's document format: special token names, document-level FIM in PSM order, packing.

A document becomes `<bos>text<eos>`, or, with probability `fim_rate`, is cut at two character positions
and becomes `<bos><｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>middle<eos>`, the three parts
tokenised separately. The cut points (`fim_split`) are drawn in one of two ways, half the time each:

- character cuts: two uniform character positions, as in the FIM paper's Megatron implementation;
- line cuts: the middle starts at a line start (the server's edit anchor) and spans a few lines, ending
  at a line start, at a line end or inside its last line (the cursor). Uniform cuts alone make most
  middles start inside an identifier, so a small model learns that prior and neither continues a prefix
  that ends at a line start nor learns to stop where such a suffix begins.

Where the transformation happens is a `FimPlacement`:

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
from typing import TYPE_CHECKING

import numpy as np

# The names are the engine's: what the model is trained on is what the engine looks up.
from lsp_dscoder.engine.tokenizer import BOS as BOS
from lsp_dscoder.engine.tokenizer import EOS as EOS
from lsp_dscoder.engine.tokenizer import FIM_BEGIN as FIM_BEGIN
from lsp_dscoder.engine.tokenizer import FIM_END as FIM_END
from lsp_dscoder.engine.tokenizer import FIM_HOLE as FIM_HOLE

SPECIAL_TOKENS = (BOS, EOS, FIM_BEGIN, FIM_HOLE, FIM_END)

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer


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
    def from_tokenizer(cls, tok: HFTokenizer) -> SpecialIds:
        found = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
        ids = [i for i in found.values() if i is not None]
        if len(ids) < len(found):
            missing = [name for name, i in found.items() if i is None]
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        return cls(*ids)


LINE_CUT_RATE = 0.5  # share of FIM examples cut at line boundaries (the rest: uniform character cuts)
MAX_MIDDLE_LINES = 8


def char_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Cut text at two uniform character positions: (prefix, middle, suffix)."""
    a, b = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    return text[:a], text[a:b], text[b:]


def line_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Cut text so that the middle starts at a line start and covers k lines (k >= 1, geometric, mean
    about 2): it ends after the k-th line's newline (half the time), just before that newline (a quarter),
    or at a uniform position inside that line (a quarter)."""
    starts = [0, *(i + 1 for i, c in enumerate(text) if c == "\n")]
    first = rng.randrange(len(starts))
    k = 1
    while k < MAX_MIDDLE_LINES and rng.random() < 0.5:
        k += 1
    last = min(first + k - 1, len(starts) - 1)
    line_start = starts[last]
    line_end = starts[last + 1] - 1 if last + 1 < len(starts) else len(text)  # the newline's index
    mode = rng.random()
    if mode < 0.5:
        b = min(line_end + 1, len(text))
    elif mode < 0.75:
        b = line_end
    else:
        b = rng.randint(line_start, line_end)
    a = starts[first]
    return text[:a], text[a:b], text[b:]


def fim_split(text: str, rng: random.Random, line_rate: float = LINE_CUT_RATE) -> tuple[str, str, str]:
    """(prefix, middle, suffix): line cuts with probability line_rate, else character cuts."""
    if rng.random() < line_rate:
        return line_split(text, rng)
    return char_split(text, rng)


def psm_ids(ids: SpecialIds, prefix: list[int], suffix: list[int], middle: list[int]) -> list[int]:
    """The PSM prompt up to and including `<｜fim▁end｜>`, then the middle (an empty middle is allowed)."""
    return [ids.bos, ids.fim_begin, *prefix, ids.fim_hole, *suffix, ids.fim_end, *middle]


def encode_plain(
    tok: HFTokenizer, texts: list[str], ids: SpecialIds, cache: dict[str, np.ndarray] | None = None
) -> list[np.ndarray]:
    """Each text as `<bos>text<eos>` (uint16 token ids); with a cache, each distinct text is encoded once."""
    if cache is None:
        cache = {}
    missing = list(dict.fromkeys(t for t in texts if t not in cache))
    for text, e in zip(missing, tok.encode_batch(missing, add_special_tokens=False), strict=True):
        cache[text] = np.asarray([ids.bos, *e.ids, ids.eos], dtype=np.uint16)
    return [cache[t] for t in texts]


def encode_documents(
    tok: HFTokenizer,
    texts: list[str],
    ids: SpecialIds,
    rng: random.Random,
    fim_rate: float,
    line_rate: float = LINE_CUT_RATE,
) -> list[np.ndarray]:
    """Each text as one document (uint16 ids), FIM-transformed whole with probability fim_rate."""
    parts: list[str] = []
    layout: list[bool] = []  # per document: FIM or not
    for text in texts:
        fim = rng.random() < fim_rate
        layout.append(fim)
        parts.extend(fim_split(text, rng, line_rate) if fim else (text,))
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


MIN_PIECE_TOKENS = 64


def split_pieces(segment: np.ndarray, max_tokens: int | None, rng: random.Random) -> list[np.ndarray]:
    """A segment in pieces of uniform length in [MIN_PIECE_TOKENS, max_tokens] (the last one shorter)."""
    if max_tokens is None or len(segment) <= max_tokens:
        return [segment]
    pieces, start = [], 0
    while start < len(segment):
        n = rng.randint(min(MIN_PIECE_TOKENS, max_tokens), max_tokens)
        pieces.append(segment[start : start + n])
        start += n
    return pieces


def fim_windows(
    tok: HFTokenizer,
    windows: list[np.ndarray],
    ids: SpecialIds,
    rng: random.Random,
    fim_rate: float,
    line_rate: float = LINE_CUT_RATE,
    piece_tokens: int | None = None,
) -> list[np.ndarray]:
    """Apply FIM to each document segment (a run of ordinary tokens) of each packed window.

    Done inside the window, as in the Megatron implementation of the FIM paper, so that prefix, suffix
    and middle are always seen together even when a file is longer than the window. A segment is
    decoded to text, cut (`fim_split`) and its three parts re-tokenised; the window keeps its length (a
    few tokens are cut from its end, or it is padded with `<eos>`).

    With piece_tokens, a segment is first cut into pieces of at most that many tokens, each transformed
    with probability fim_rate on its own: more infilling examples per window, each as long as a prompt
    the server builds. A transformed piece is a document of its own: where it meets a neighbouring piece
    of the same segment, `<eos><bos>` separates them, so every middle ends in `<eos>` unless the window
    ends first.
    """
    plans: list[list[list[tuple[bool, np.ndarray]]]] = []  # window -> segment runs -> pieces
    chosen: list[np.ndarray] = []
    for window in windows:
        bounds = np.flatnonzero((window == ids.bos) | (window == ids.eos))
        plan, last = [], 0
        for b in [*bounds.tolist(), len(window)]:
            if b > last:
                run = []
                for piece in split_pieces(window[last:b], piece_tokens, rng):
                    fim = rng.random() < fim_rate
                    run.append((fim, piece))
                    if fim:
                        chosen.append(piece)
                plan.append(run)
            if b < len(window):
                plan.append([(False, window[b : b + 1])])
            last = b + 1
        plans.append(plan)
    parts: list[str] = []
    for text in tok.decode_batch([piece.tolist() for piece in chosen], skip_special_tokens=False):
        parts.extend(fim_split(text, rng, line_rate))
    encoded = iter(e.ids for e in tok.encode_batch(parts, add_special_tokens=False))
    out = []
    for window, plan in zip(windows, plans, strict=True):
        tokens: list[int] = []
        for run in plan:
            for i, (fim, piece) in enumerate(run):
                if i > 0 and (fim or run[i - 1][0]):
                    tokens += (ids.eos, ids.bos)
                if fim:
                    prefix, middle, suffix = next(encoded), next(encoded), next(encoded)
                    tokens += (ids.fim_begin, *prefix, ids.fim_hole, *suffix, ids.fim_end, *middle)
                else:
                    tokens += piece.tolist()
        joined = np.asarray(tokens[: len(window)], dtype=np.uint16)
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
