"""Held-out loss of a model in training: its files packed as for training, under the same autocast."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lsp_dscoder.training.batches import DataConfig, packed
from lsp_dscoder.training.fim import SpecialIds

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def heldout_loss(
    model: Any,
    tok: Tokenizer,
    texts: list[str],
    ids: SpecialIds,
    cfg: DataConfig,
    device: torch.device,
    fim_rate: float,
) -> dict[str, float]:
    """Mean next-token loss over the held-out files packed into seq_len windows (seeded FIM draw)."""
    groups = list(packed(tok, texts, ids, cfg, random.Random(cfg.seed + 7), fim_rate))
    total, count = 0.0, 0
    for rows in groups:
        x = torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)  # (B, T)
        with autocast(device):
            loss = model(input_ids=x, labels=x).loss
        n = x.numel() - x.shape[0]  # predicted positions
        total, count = total + loss.item() * n, count + n
    chars = sum(map(len, texts))
    tokens = sum(len(rows) * cfg.seq_len for rows in groups)  # the packing drops under a window's tail
    mean = total / count
    return {
        "loss": mean,
        "ppl": math.exp(mean),
        "tokens": count,
        "bits_per_char": mean * tokens / chars / math.log(2),
    }
