"""Weights from safetensors (single file or sharded through the index), checked against the config and
fused at load: Q/K/V into one projection, gate/up into one.

INT4 AWQ checkpoints (engine/awq.py) are dequantized at load for the reference path, or kept packed for
the fast path's dequantizing kernels (`packed=True`): their QKV and gate/up are fused on the packed layout,
and the dense matrices are then meta tensors (shapes only, no memory)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from lsp_dscoder.engine.awq import AwqConfig, AwqLinear, read_awq_linear
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.errors import CheckpointError

Progress = Callable[[str, int, int], None]
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class QuantLayer:
    """A layer's packed INT4 matrices, fused as the dense ones are."""

    wqkv: AwqLinear  # out H*D + 2*KVH*D, in C
    wo: AwqLinear  # out C, in H*D
    w_gate_up: AwqLinear  # out 2*I, in C
    w_down: AwqLinear  # out C, in I

    def to_fragments(self) -> QuantLayer:
        """The layer with every matrix in the tensor-core kernel's fragment layout (kernels/awq_mma.py), or
        as it is when one of them does not fit that layout."""
        mats = (self.wqkv, self.wo, self.w_gate_up, self.w_down)
        if not all(m.fragments_fit() for m in mats):
            return self
        return QuantLayer(*(m.to_fragments() for m in mats))


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # (C,)
    wqkv: torch.Tensor  # (H*D + 2*KVH*D, C)
    wo: torch.Tensor  # (C, H*D)
    post_norm: torch.Tensor  # (C,)
    w_gate_up: torch.Tensor  # (2*I, C)
    w_down: torch.Tensor  # (C, I)
    quant: QuantLayer | None = None  # packed AWQ (fast path); the four matrices above are then meta

    def streamed(self) -> list[torch.Tensor]:
        """The tensors a forward reads: the packed AWQ matrices when the layer has them (the dense ones are
        meta), else the dense ones; and the norms."""
        if self.quant is not None:
            q = self.quant
            mats = (q.wqkv, q.wo, q.w_gate_up, q.w_down)
            packed = [t for m in mats for t in (m.qweight, m.qzeros, m.scales)]
            return [*packed, self.input_norm, self.post_norm]
        return [self.wqkv, self.wo, self.w_gate_up, self.w_down, self.input_norm, self.post_norm]


@dataclass
class Weights:
    embed: torch.Tensor  # (V, C)
    layers: list[LayerWeights]
    norm: torch.Tensor  # (C,)
    lm_head: torch.Tensor  # (V, C)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    c, v = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, c), "model.norm.weight": (c,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, c)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": (c,), p + "post_attention_layernorm.weight": (c,)}
        shapes |= {f"{p}{name}.weight": shape for name, shape in linear_shapes(cfg).items()}
    return shapes


def shard_map(folder: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from the index when the checkpoint is sharded."""
    if (folder / INDEX).exists():
        try:
            index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
            mapping = {name: folder / file for name, file in index["weight_map"].items()}
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{folder / INDEX} is not a valid safetensors index: {e}") from None
        for file in sorted(set(mapping.values())):
            if not file.exists():
                raise CheckpointError(f"missing shard {file.name} (listed in {INDEX}) in {folder}")
        return mapping
    if (folder / SINGLE).exists():
        return {}  # filled lazily from the single file's keys
    hint = (
        " (.bin checkpoints are not supported: use the safetensors files)"
        if any(folder.glob("pytorch_model*.bin"))
        else ""
    )
    raise CheckpointError(f"missing {SINGLE} or {INDEX} in checkpoint folder {folder}{hint}")


def load_weights(
    folder: Path,
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    packed: bool = False,
) -> Weights:
    """The checkpoint's weights on `device`. `packed` keeps AWQ layers packed (for FastRunner); without it,
    or for a dense checkpoint, every matrix is dense in `dtype`."""
    mapping = shard_map(folder)
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}  # safe_open handles (untyped)

        def open_file(path: Path) -> Any:
            if path not in handles:
                try:
                    handles[path] = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
                except (SafetensorError, OSError, ValueError) as e:
                    raise CheckpointError(
                        f"{path.name} in {folder} is corrupted or not safetensors: {e}"
                    ) from None
            return handles[path]

        if not mapping:
            single = folder / SINGLE
            mapping = {k: single for k in open_file(single).keys()}  # noqa: SIM118 (not a dict)

        def get(name: str) -> torch.Tensor:
            if name not in mapping:
                raise CheckpointError(f"tensor {name} is missing from the checkpoint in {folder}")
            try:
                t: torch.Tensor = open_file(mapping[name]).get_tensor(name)
                return t
            except (SafetensorError, OSError, RuntimeError) as e:
                raise CheckpointError(f"cannot read {name} from {mapping[name].name}: {e}") from None

        return weights_from_tensors(get, cfg, device, dtype, progress, packed)


def weights_from_tensors(
    get: Callable[[str], torch.Tensor],
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    packed: bool = False,
) -> Weights:
    """Build fused `Weights` from a name -> tensor getter (a checkpoint, or a state_dict in tests)."""
    shapes = expected_shapes(cfg)
    total, done = cfg.num_layers + 2, 0

    def take(name: str) -> torch.Tensor:
        t = get(name)
        if tuple(t.shape) != shapes[name]:
            raise CheckpointError(
                f"tensor {name} has shape {tuple(t.shape)} but config.json implies {shapes[name]}"
            )
        return t.to(device=device, dtype=dtype)

    def step() -> None:
        nonlocal done
        done += 1
        if progress:
            progress("loading weights", done, total)

    embed = take("model.embed_tokens.weight")
    step()
    layers = []
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        norms = take(p + "input_layernorm.weight"), take(p + "post_attention_layernorm.weight")
        if cfg.quantization is None:
            layers.append(
                LayerWeights(
                    input_norm=norms[0],
                    wqkv=torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
                    wo=take(p + "self_attn.o_proj.weight"),
                    post_norm=norms[1],
                    w_gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
                    w_down=take(p + "mlp.down_proj.weight"),
                )
            )
        else:
            quant = read_quant_layer(get, p, cfg, cfg.quantization, device)
            layers.append(quant_layer_weights(quant, norms, dtype, packed))
        step()
    lm_head = embed if cfg.tie_word_embeddings else take("lm_head.weight")
    weights = Weights(embed=embed, layers=layers, norm=take("model.norm.weight"), lm_head=lm_head)
    step()
    return weights


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear layer of a transformer layer, by its checkpoint name."""
    c, i = cfg.hidden_size, cfg.intermediate_size
    return {
        "self_attn.q_proj": (cfg.q_size, c),
        "self_attn.k_proj": (cfg.kv_size, c),
        "self_attn.v_proj": (cfg.kv_size, c),
        "self_attn.o_proj": (c, cfg.q_size),
        "mlp.gate_proj": (i, c),
        "mlp.up_proj": (i, c),
        "mlp.down_proj": (c, i),
    }


def read_quant_layer(
    get: Callable[[str], torch.Tensor], prefix: str, cfg: ModelConfig, qcfg: AwqConfig, device: torch.device
) -> QuantLayer:
    """One layer's packed matrices, shapes checked, fused along the output on the packed layout."""
    lin = {
        name: read_awq_linear(get, prefix + name, out, inp, qcfg).to(device)
        for name, (out, inp) in linear_shapes(cfg).items()
    }
    return QuantLayer(
        wqkv=AwqLinear.cat([lin[f"self_attn.{x}_proj"] for x in "qkv"]),
        wo=lin["self_attn.o_proj"],
        w_gate_up=AwqLinear.cat([lin["mlp.gate_proj"], lin["mlp.up_proj"]]),
        w_down=lin["mlp.down_proj"],
    )


def quant_layer_weights(
    quant: QuantLayer, norms: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype, packed: bool
) -> LayerWeights:
    """LayerWeights of a packed layer: dequantized (reference path), or packed with meta stand-ins."""

    def dense(lin: AwqLinear) -> torch.Tensor:
        if packed:
            return torch.empty((lin.out_features, lin.in_features), dtype=dtype, device="meta")
        return lin.dequantized(dtype)

    return LayerWeights(
        input_norm=norms[0],
        wqkv=dense(quant.wqkv),
        wo=dense(quant.wo),
        post_norm=norms[1],
        w_gate_up=dense(quant.w_gate_up),
        w_down=dense(quant.w_down),
        quant=quant if packed else None,
    )


def dequantized_weights(weights: Weights, dtype: torch.dtype) -> Weights:
    """`weights` with every packed AWQ layer dequantized (the reference path cannot run packed layers)."""
    layers = [
        quant_layer_weights(w.quant, (w.input_norm, w.post_norm), dtype, packed=False) if w.quant else w
        for w in weights.layers
    ]
    return Weights(embed=weights.embed, layers=layers, norm=weights.norm, lm_head=weights.lm_head)


def random_weights(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Weights:
    """Random tensors with the config's exact shapes (benchmarks at real model sizes without a download).
    An AWQ config gets random packed layers (kept packed), with weights of about the same spread."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = expected_shapes(cfg)

    def get(name: str) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shapes[name], device=device, dtype=dtype)
        if name.endswith(("qweight", "qzeros", "scales")):  # "model.layers.N.<linear>.<part>"
            out, inp = linear_shapes(cfg)[name.split(".", 3)[3].rsplit(".", 1)[0]]
            if name.endswith("scales"):  # (q - z) spans about +-8: 0.02 / 4.6 gives a spread near 0.02
                return torch.full((inp // group, out), 0.02 / 4.6, dtype=torch.float16, device=device)
            rows = inp if name.endswith("qweight") else inp // group  # random bits: nibbles uniform in 0..15
            return torch.randint(
                -(2**31), 2**31 - 1, (rows, out // 8), device=device, generator=gen, dtype=torch.int32
            )
        t = torch.empty(shapes[name], device=device, dtype=dtype)
        return t.normal_(0.0, 0.02, generator=gen)

    group = cfg.quantization.group_size if cfg.quantization else 1
    return weights_from_tensors(get, cfg, device, dtype, packed=True)
