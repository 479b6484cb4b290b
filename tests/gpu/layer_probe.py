"""Op-by-op comparison of one decoder layer, ours vs transformers, on identical bf16 inputs:
`python -m tests.gpu.layer_probe [--dry-run]`. Prints the relative difference after each step; 0 means
bit-identical. Locates where two bf16 implementations of the same layer part ways on a device."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lsp_dscoder.bench import transformers_model
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.model import Transformer, apply_rope_ref, rms_norm_ref
from lsp_dscoder.engine.weights import weights_from_tensors
from tests.gpu.reference_parity import DS_13B


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    raw = dict(DS_13B, num_hidden_layers=2)
    if args.dry_run:
        raw.update(hidden_size=256, intermediate_size=300, num_attention_heads=2, num_key_value_heads=2)
    hf = transformers_model(raw, dev)
    cfg = ModelConfig.from_dict({**raw, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    ours = Transformer(cfg, weights_from_tensors(lambda n: sd[n], cfg, dev, torch.bfloat16), 1024)
    seen: dict[str, torch.Tensor] = {}
    layer = hf.model.layers[0]

    def keep(name):
        return lambda mod, inp, out: seen.__setitem__(
            name, (out[0] if isinstance(out, tuple) else out).detach()
        )

    def keep_in(name):
        return lambda mod, inp: seen.__setitem__(name, inp[0].detach())

    layer.input_layernorm.register_forward_hook(keep("norm1"))
    layer.self_attn.q_proj.register_forward_hook(keep("q_proj"))
    layer.self_attn.o_proj.register_forward_pre_hook(keep_in("attn"))
    layer.self_attn.o_proj.register_forward_hook(keep("o_proj"))
    layer.post_attention_layernorm.register_forward_hook(keep("norm2"))
    layer.mlp.register_forward_hook(keep("mlp"))
    layer.register_forward_hook(keep("layer"))
    rot = hf.model.rotary_emb
    t = 512
    ids = torch.randint(2, cfg.vocab_size, (1, t), device=dev)
    with torch.no_grad():
        hf(ids)
        pos = torch.arange(t, device=dev)[None]
        hf_cos, _ = rot(seen["norm1"], pos)
        w, lw = ours.w, ours.w.layers[0]
        h = w.embed[ids[0]]
        rows = {}

        def cmp(name: str, mine: torch.Tensor) -> None:
            ref = seen[name].reshape(mine.shape).float()
            rows[name] = float((mine.float() - ref).norm() / ref.norm())

        x = rms_norm_ref(h, lw.input_norm, cfg.rms_norm_eps)
        cmp("norm1", x)
        x = seen["norm1"][0]  # from here on, each step starts from transformers' own input
        q, k, v = (x @ lw.wqkv.T).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        cmp("q_proj", q)
        rows["rope cos (ours vs hf)"] = float((ours.cos[:t] - hf_cos[0].float()).abs().max())
        cos, sin = ours.cos[:t].to(torch.bfloat16), ours.sin[:t].to(torch.bfloat16)
        q = apply_rope_ref(q.view(t, -1, cfg.head_dim), cos, sin).transpose(0, 1)
        k = apply_rope_ref(k.view(t, -1, cfg.head_dim), cos, sin).transpose(0, 1)
        a = F.scaled_dot_product_attention(
            q[None], k[None], v.view(t, -1, cfg.head_dim).transpose(0, 1)[None], is_causal=True
        )[0]
        cmp("attn", a.transpose(0, 1).reshape(t, cfg.q_size))
        cmp("o_proj", seen["attn"][0] @ lw.wo.T)
        h2 = h + seen["o_proj"][0]
        cmp("norm2", rms_norm_ref(h2, lw.post_norm, cfg.rms_norm_eps))
        gate, up = (seen["norm2"][0] @ lw.w_gate_up.T).chunk(2, dim=-1)
        cmp("mlp", (F.silu(gate) * up) @ lw.w_down.T)
        cmp("layer", h2 + seen["mlp"][0])
    for name, value in rows.items():
        print(f"{name:24s} {value:.3e}")


if __name__ == "__main__":
    main()
