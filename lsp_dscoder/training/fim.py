"""DeepSeek-Coder's document format: special token names, document-level FIM in PSM order, packing.

A document becomes `<bos>text<eos>`, or, with probability `fim_rate`, is cut at two character positions
drawn uniformly (as in the FIM paper and Megatron's implementation that DeepSeek-Coder follows) and
becomes `<bos><｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>middle<eos>`, the three parts tokenised
separately. Training and evaluation share these functions so that prompts match what was trained.
"""

from __future__ import annotations

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


def encode_documents(
    tok, texts: list[str], ids: SpecialIds, rng: random.Random, fim_rate: float
) -> list[np.ndarray]:
    """Each text as one training document (uint16 token ids), FIM-transformed with probability fim_rate."""
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


def pack(docs: Iterable[np.ndarray], seq_len: int) -> Iterator[np.ndarray]:
    """Concatenate documents and cut the stream into windows of seq_len tokens (the tail is dropped)."""
    buffer = np.empty(0, dtype=np.uint16)
    for doc in docs:
        buffer = np.concatenate([buffer, doc])
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            buffer = buffer[seq_len:]
