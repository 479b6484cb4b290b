"""Training and held-out batches: shuffled files, FIM applied afresh each epoch, packed windows.

A background thread prepares epoch after epoch into a bounded queue so that the GPU never waits on
tokenisation (`tokenizers` releases the GIL while it encodes a batch).
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from lsp_dscoder.training.fim import (
    LINE_CUT_RATE,
    FimPlacement,
    SpecialIds,
    encode_documents,
    encode_plain,
    fim_windows,
    pack,
)


@dataclass(frozen=True)
class DataConfig:
    seq_len: int = 2048
    batch_size: int = 64  # sequences per step
    fim_rate: float = 0.5
    fim_line_rate: float = LINE_CUT_RATE  # FIM examples cut at line boundaries (see fim.fim_split)
    fim_piece_tokens: int | None = None  # FIM each piece of at most this many tokens (see fim.fim_windows)
    fim_placement: FimPlacement = FimPlacement.WINDOW
    seed: int = 0

    def __post_init__(self) -> None:
        if self.seq_len <= 1 or self.batch_size <= 0:
            raise ValueError(f"seq_len must be > 1 and batch_size > 0, got {self.seq_len}, {self.batch_size}")
        if self.fim_piece_tokens is not None and self.fim_piece_tokens < 8:
            raise ValueError(f"fim_piece_tokens must be at least 8, got {self.fim_piece_tokens}")
        for name in ("fim_rate", "fim_line_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def packed(
    tok,
    texts: list[str],
    ids: SpecialIds,
    cfg: DataConfig,
    rng: random.Random,
    fim_rate: float,
    cache: dict[str, np.ndarray] | None = None,
) -> Iterator[list[np.ndarray]]:
    """Groups of cfg.batch_size windows of cfg.seq_len tokens (the last group may be shorter).

    FIM is applied to whole texts before packing (FimPlacement.DOCUMENT) or to each group of windows
    (WINDOW). cache (text -> its plain token ids) saves encoding the same files again in every epoch.
    """

    def documents() -> Iterator[np.ndarray]:
        for start in range(0, len(texts), 256):
            chunk = texts[start : start + 256]
            if cfg.fim_placement is FimPlacement.DOCUMENT:
                yield from encode_documents(tok, chunk, ids, rng, fim_rate, cfg.fim_line_rate)
            else:
                yield from encode_plain(tok, chunk, ids, cache)

    def finish(rows: list[np.ndarray]) -> list[np.ndarray]:
        if cfg.fim_placement is FimPlacement.WINDOW:
            return fim_windows(tok, rows, ids, rng, fim_rate, cfg.fim_line_rate, cfg.fim_piece_tokens)
        return rows

    rows: list[np.ndarray] = []
    for window in pack(documents(), cfg.seq_len):
        rows.append(window)
        if len(rows) == cfg.batch_size:
            yield finish(rows)
            rows = []
    if rows:
        yield finish(rows)


class Batches:
    """Background producer of (epoch, (B, T) int64 tensor) training batches; full batches only."""

    def __init__(self, tok, texts: list[str], ids: SpecialIds, cfg: DataConfig, pin: bool) -> None:
        self.tok, self.texts, self.ids, self.cfg, self.pin = tok, texts, ids, cfg, pin
        self.queue: queue.Queue = queue.Queue(maxsize=16)
        self.stop = threading.Event()
        self.epochs_done = 0
        self.cache: dict[str, np.ndarray] = {}  # each file's plain token ids, encoded in the first epoch
        self.thread = threading.Thread(target=self._run, name="batches", daemon=True)
        self.thread.start()

    def _put(self, item: tuple[int, torch.Tensor]) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        epoch = 0
        while not self.stop.is_set():
            rng = random.Random(self.cfg.seed * 1_000_003 + epoch)
            order = list(self.texts)
            rng.shuffle(order)
            for rows in packed(self.tok, order, self.ids, self.cfg, rng, self.cfg.fim_rate, self.cache):
                if len(rows) < self.cfg.batch_size:
                    break
                batch = torch.from_numpy(np.stack(rows).astype(np.int64))  # (B, T)
                if not self._put((epoch, batch.pin_memory() if self.pin else batch)):
                    return
            epoch += 1
            self.epochs_done = epoch

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
