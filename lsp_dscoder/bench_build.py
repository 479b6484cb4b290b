"""Models for `lsp-dscoder bench` at real sizes: random weights of a DeepSeek-Coder shape made on the GPU,
and a transformers twin that holds the very same tensors, with the GPU memory each allocation took.

The twin shares storage with our fused matrices (q/k/v are row blocks of the QKV matrix, gate/up of the
gate/up matrix, each a contiguous view), so a shape costs its weights once: the 33B shape (66 GB in bf16)
then runs next to transformers on one 141 GB GPU, where two copies would not fit. Weights are drawn on the
GPU: the 33B shape takes seconds there and minutes on the CPU.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from lsp_dscoder.bench import hf_config
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.weights import Weights, random_weights

GB = 1e9


def allocated() -> int:
    """Bytes held by live tensors on the current CUDA device (the caching allocator's count)."""
    return int(torch.cuda.memory_allocated())


@dataclass
class Built:
    """One shape ready to benchmark, and the bytes its pieces took (measured around their allocation)."""

    cfg: ModelConfig
    weights: Weights
    hf: Any  # transformers' LlamaForCausalLM sharing `weights`, or None
    weight_bytes: int
    twin_bytes: int  # what the transformers twin added on top of the shared weights


def build_shape(shape: str, with_hf: bool) -> Built:
    """Random bf16 weights of `shape` ("33b") on CUDA and, when asked, transformers on the same tensors."""
    raw = hf_config(shape)
    cfg = ModelConfig.from_dict(raw, source=f"{shape} shape")
    before = allocated()
    weights = random_weights(cfg, torch.device("cuda"), torch.bfloat16)
    weight_bytes = allocated() - before
    if not with_hf:
        return Built(cfg, weights, None, weight_bytes, 0)
    before = allocated()
    hf = transformers_twin(raw, cfg, weights)
    return Built(cfg, weights, hf, weight_bytes, allocated() - before)


def shared_state_dict(cfg: ModelConfig, w: Weights) -> dict[str, torch.Tensor]:
    """transformers' parameter names -> views of our fused tensors (no copies)."""
    sd = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm, "lm_head.weight": w.lm_head}
    for n, layer in enumerate(w.layers):
        p = f"model.layers.{n}."
        q, k, v = torch.split(layer.wqkv, [cfg.q_size, cfg.kv_size, cfg.kv_size])  # row blocks: contiguous
        gate, up = torch.split(layer.w_gate_up, cfg.intermediate_size)
        sd |= {
            p + "input_layernorm.weight": layer.input_norm,
            p + "post_attention_layernorm.weight": layer.post_norm,
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": layer.wo,
            p + "mlp.gate_proj.weight": gate,
            p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": layer.w_down,
        }
    return sd


def transformers_twin(raw: dict[str, Any], cfg: ModelConfig, w: Weights) -> Any:
    """LlamaForCausalLM (sdpa) built on the meta device, its parameters then assigned our tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    keys: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    keys |= {"attn_implementation": "sdpa", "dtype": torch.bfloat16}
    config = LlamaConfig(**keys)
    with torch.device("meta"):
        hf: Any = LlamaForCausalLM(config)
    share(hf, cfg, w)
    # The rotary frequencies are a non-persistent buffer (not in the state dict): computed afresh in
    # float32 on the CPU, as from_pretrained holds them.
    rot = hf.model.rotary_emb
    fresh = type(rot)(config=config)
    for name in ("inv_freq", "original_inv_freq"):
        if hasattr(fresh, name):
            setattr(rot, name, getattr(fresh, name).to(w.embed.device))
    left = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"transformers twin: tensors not assigned: {left[:5]}")
    return hf.eval()


def share(hf: Any, cfg: ModelConfig, w: Weights) -> None:
    """(Re)point every parameter of `hf` at our tensors: after a dtype round trip, the copies go."""
    hf.load_state_dict(shared_state_dict(cfg, w), strict=True, assign=True)
    for p in hf.parameters():
        p.requires_grad_(False)


def release() -> None:
    """Return freed blocks to the driver so the next shape starts from an empty device."""
    gc.collect()
    torch.cuda.empty_cache()
