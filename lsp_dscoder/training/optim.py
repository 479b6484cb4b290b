"""The optimiser side of training: its settings, the learning-rate schedule and AdamW's parameter groups."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lsp_dscoder.training.batches import DataConfig
from lsp_dscoder.training.checkpoint import RopeSettings


@dataclass(frozen=True)
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    budget_s: float = 470.0  # from process start to the end of training
    max_steps: int | None = None
    compile: bool = True
    rope: RopeSettings = field(default_factory=RopeSettings)
    log_every: int = 50
    junction_weight: float = 1.0  # loss weight of the first middle token and the middle's <eos>
    probe_every: int = 500  # steps between infilling probes on held-out files (see probe.py)
    probe_examples: int = 48  # per kind of hole

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "log_every", "probe_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.data.seq_len > self.rope.max_position_embeddings:
            raise ValueError(f"seq_len {self.data.seq_len} exceeds max_position_embeddings")
        if self.junction_weight <= 0:
            raise ValueError(f"junction_weight must be positive, got {self.junction_weight}")


def lr_at(step: int, total_steps: int | None, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if total_steps is None:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # RMSNorm weights
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=device.type == "cuda")
