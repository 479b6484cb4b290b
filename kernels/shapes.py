"""The DeepSeek-Coder model shapes that the kernels' GPU check and `lsp-dscoder bench` run at.

Plain data, so that the kernels (which know nothing of models) and the benchmarks (which build whole
checkpoints of these shapes) read the same table; the import direction server → engine → kernels holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """One model's layer shape. `layers` matters only to whole-model benchmarks."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    inter: int
    head_dim: int = 128
    layers: int = 1


# deepseek-coder-{1.3b,6.7b,33b}-base config.json: hidden_size, num_attention_heads, num_key_value_heads,
# intermediate_size, head_dim (hidden / heads), num_hidden_layers.
MODELS = (
    Model("1.3B", 2048, 16, 16, 5504, layers=24),
    Model("6.7B", 4096, 32, 32, 11008, layers=32),
    Model("33B", 7168, 56, 8, 19200, layers=62),
)
# The fields every DeepSeek-Coder config shares (vocabulary, rope, norms).
VOCAB_SIZE = 32256
ROPE_THETA = 100000.0
ROPE_LINEAR_FACTOR = 4.0
MAX_POSITIONS = 16384
RMS_NORM_EPS = 1e-6


def by_name(name: str) -> Model:
    """The shape called `name` (case-insensitive: "1.3b", "6.7B"); ValueError listing the known ones."""
    for model in MODELS:
        if model.name.lower() == name.lower():
            return model
    raise ValueError(f"unknown model shape {name!r}: one of {', '.join(m.name for m in MODELS)}")
