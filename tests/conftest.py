"""Session fixtures shared by all test folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiny import default_tiny

# Without a GPU, Triton kernels run in its interpreter on CPU tensors. Triton reads this when a kernel
# module is imported, so it is set before any test module imports one.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random GQA checkpoint with a real BPE tokenizer (built once per session)."""
    return default_tiny(tmp_path_factory.mktemp("ckpt"))
