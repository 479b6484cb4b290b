"""Fixtures for engine tests: tiny checkpoints of several shapes, and an engine on the default one."""

from __future__ import annotations

from pathlib import Path

import pytest

from lsp_dscoder.engine import Engine, EngineConfig
from tests.tiny import cached_checkpoint

SHAPES = {
    # name: make_checkpoint kwargs. Odd sizes on purpose (hidden 72, intermediate 100, 6 heads).
    "mha-nope": dict(hidden_size=64, num_attention_heads=4, intermediate_size=96),
    "gqa-linear4": dict(
        hidden_size=72,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=100,
        rope_scaling={"type": "linear", "factor": 4.0},
    ),
    "mqa-hd32-3layers": dict(
        hidden_size=96,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=130,
        num_hidden_layers=3,
        rope_theta=10000.0,
    ),
}


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-ckpts")


@pytest.fixture(scope="session", params=sorted(SHAPES))
def shaped_model(request: pytest.FixtureRequest, ckpt_root: Path) -> Path:
    return cached_checkpoint(ckpt_root, request.param, **SHAPES[request.param])


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    with Engine(EngineConfig(model=tiny_model, max_context=512, num_slots=3, prefill_chunk=8)) as eng:
        yield eng
