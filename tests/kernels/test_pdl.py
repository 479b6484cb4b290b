"""Programmatic dependent launch is asked for per launch; where it cannot run (the interpreter, a CPU
tensor, a GPU before sm_90) every launcher refuses it with one clear error instead of a launch failure."""

from __future__ import annotations

import pytest
import torch

from lsp_dscoder.kernels.decode_attention import decode_attention
from lsp_dscoder.kernels.extend_attention import extend_attention
from lsp_dscoder.kernels.pdl import launch_options, pdl_supported
from lsp_dscoder.kernels.rms_norm import rms_norm
from lsp_dscoder.kernels.rope_store import rope_cos_sin, rope_store
from lsp_dscoder.kernels.silu_mul import silu_mul
from lsp_dscoder.kernels.skinny_gemm import skinny_gemm


def launches() -> dict[str, object]:
    kv = torch.randn(1, 32, 16), torch.randn(1, 32, 16)
    pos = torch.tensor([3])
    return {
        "rms_norm": lambda pdl: rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, pdl=pdl),
        "silu_mul": lambda pdl: silu_mul(torch.randn(2, 8), pdl=pdl),
        "rope_store": lambda pdl: rope_store(
            torch.randn(2, 3 * 16), rope_cos_sin(32, 16, 1e4, 1.0, "cpu"), pos, *kv, 1, 1, pdl=pdl
        ),
        "decode_attention": lambda pdl: decode_attention(torch.randn(1, 16), *kv, pos, 0.25, pdl=pdl),
        "extend_attention": lambda pdl: extend_attention(torch.randn(2, 1, 16), *kv, pos, 0.25, pdl=pdl),
        "skinny_gemm": lambda pdl: skinny_gemm(torch.randn(2, 8), torch.randn(4, 8), pdl=pdl),
    }


@pytest.mark.parametrize("name", list(launches()))
def test_refused_where_unsupported(name: str) -> None:
    launch = launches()[name]
    assert isinstance(launch(False), torch.Tensor)  # the same call without it runs
    with pytest.raises(ValueError, match="pdl needs a compiled launch on an sm_90 or later CUDA device"):
        launch(True)


def test_support_and_launch_options() -> None:
    assert not pdl_supported(torch.device("cpu"))
    assert launch_options(False) == {}
    assert launch_options(True) == {"launch_pdl": True}
