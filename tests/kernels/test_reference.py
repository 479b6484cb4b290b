"""One definition each of the rotary table and RMSNorm, for the reference path and the kernels alike."""

from __future__ import annotations

import torch

from lsp_dscoder.engine import model
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.kernels import reference, rms_norm, rope_store


def test_one_home_each() -> None:
    assert model.rms_norm_ref is reference.rms_norm_ref is rms_norm.rms_norm_ref
    assert rope_store.rope_cos_sin is reference.rope_cos_sin


def test_reference_path_tables_are_the_fast_path_table() -> None:
    cfg = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 10,
            "hidden_size": 48,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_theta": 100000.0,
            "rope_scaling": {"type": "linear", "factor": 3.0},
        }
    )
    cos, sin = model.rope_tables(cfg, 50, torch.device("cpu"))
    half_cos, half_sin = reference.rope_cos_sin(50, 24, 100000.0, 3.0, "cpu").chunk(2, dim=-1)
    assert cos.shape == sin.shape == (50, 24)
    assert torch.equal(cos, torch.cat((half_cos, half_cos), -1))  # bit for bit: the same float steps
    assert torch.equal(sin, torch.cat((half_sin, half_sin), -1))


def test_rms_norm_ref_is_llama_rms_norm() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(32, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
    x = torch.randn(5, 32).to(torch.bfloat16)
    assert torch.equal(reference.rms_norm_ref(x, norm.weight.detach(), 1e-6), norm(x).detach())
