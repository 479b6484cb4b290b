"""Session fixtures shared by all test folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny import default_tiny


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random GQA checkpoint with a real BPE tokenizer (built once per session)."""
    return default_tiny(tmp_path_factory.mktemp("ckpt"))
