"""Kernel tests run the Triton kernels on CPU tensors through Triton's interpreter.

`triton.jit` picks compiled or interpreted when a kernel module is imported, so the switch must be on
before the first `lsp_dscoder.kernels` import; pytest imports this file before the test modules beside it.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _kernels_interpreted() -> None:
    """Fail with the cause, not with a CUDA error, if something imported the kernels before this file ran."""
    from triton.runtime.interpreter import InterpretedFunction

    from lsp_dscoder.kernels import rms_norm

    if not torch.cuda.is_available() and not isinstance(rms_norm._rms_norm_kernel, InterpretedFunction):
        pytest.fail(
            "lsp_dscoder.kernels was imported before TRITON_INTERPRET=1 was set: set it in "
            "tests/conftest.py so it precedes every import of the kernels"
        )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
