"""Where does bf16 error come from on the GPU? Run by hand: `python -m tests.gpu.precision_probe`.

Variants of the reference forward at the 1.3B shape (random weights), each compared with transformers in
float32 on the same weights: fused vs separate QKV/gate-up GEMMs, masked SDPA vs is_causal, and cuBLAS's
bf16 reduced-precision reductions on and off.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lsp_dscoder.bench import exact_rotary, transformers_model
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.model import Transformer, apply_rope_ref, rms_norm_ref
from lsp_dscoder.engine.weights import weights_from_tensors
from tests.gpu.reference_parity import DS_13B


def forward(m: Transformer, ids: torch.Tensor, fused: bool, causal: bool) -> torch.Tensor:
    cfg, w = m.cfg, m.w
    t, h_, kvh, d = ids.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    cos, sin = m.cos[:t].to(m.dtype), m.sin[:t].to(m.dtype)
    mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
    h = w.embed[ids]
    for layer in w.layers:
        x = rms_norm_ref(h, layer.input_norm, cfg.rms_norm_eps)
        if fused:
            q, k, v = (x @ layer.wqkv.T).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        else:
            q, k, v = (x @ part.T for part in layer.wqkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size]))
        q = apply_rope_ref(q.view(t, h_, d), cos, sin).transpose(0, 1)
        k = apply_rope_ref(k.view(t, kvh, d), cos, sin).transpose(0, 1)
        v = v.view(t, kvh, d).transpose(0, 1)
        if causal:
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + a.transpose(0, 1).reshape(t, cfg.q_size) @ layer.wo.T
        x = rms_norm_ref(h, layer.post_norm, cfg.rms_norm_eps)
        if fused:
            gate, up = (x @ layer.w_gate_up.T).chunk(2, dim=-1)
        else:
            gate, up = (x @ part.T for part in layer.w_gate_up.chunk(2))
        h = h + (F.silu(gate) * up) @ layer.w_down.T
    return (rms_norm_ref(h[-1:], w.norm, cfg.rms_norm_eps) @ w.lm_head.T).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    raw = dict(DS_13B)
    if args.dry_run:
        raw.update(
            hidden_size=256,
            intermediate_size=300,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    hf = transformers_model(raw, dev)
    cfg = ModelConfig.from_dict({**raw, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    m = Transformer(cfg, weights_from_tensors(lambda n: sd[n], cfg, dev, torch.bfloat16), 1024)
    ids = torch.randint(2, cfg.vocab_size, (512,), device=dev)
    with torch.no_grad():
        truth = hf.float()(ids[None], logits_to_keep=1).logits[0].float()
        hf.to(torch.bfloat16)
        exact_rotary(hf)

        def rel(x: torch.Tensor) -> str:
            return f"{float((x - truth).norm() / truth.norm()):.3e}"

        for reduced in (True, False):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
            row = {"transformers bf16": rel(hf(ids[None], logits_to_keep=1).logits[0].float())}
            for fused in (True, False):
                for causal in (False, True):
                    row[f"ours fused={fused} causal={causal}"] = rel(forward(m, ids, fused, causal))
            print(f"bf16 reduced-precision reduction={reduced}:", row, flush=True)


if __name__ == "__main__":
    main()
