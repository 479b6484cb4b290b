"""INT4 AWQ checkpoints (AutoAWQ's GEMM format): the typed quantization config, a packed linear layer, and
reading one from a checkpoint with every shape checked.

The format itself (nibble order, dequantization) is defined in kernels/awq_format.py, where the kernels'
references use it too. Only the transformer's linear layers are quantized; embeddings, norms and the LM
head stay in floating point, as AutoAWQ leaves them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import torch

from lsp_dscoder.engine.errors import CheckpointError, UnsupportedModelError
from lsp_dscoder.kernels.awq_format import BITS, PACK, dequantize, pack_int4
from lsp_dscoder.kernels.awq_fragments import fragment_pack, fragment_unpack, fragments_fit

GROUP_SIZES = (32, 64, 128)
QUANT_CONFIG_FILE = "quant_config.json"  # AutoAWQ's own file, next to config.json in older checkpoints


@dataclass(frozen=True)
class AwqConfig:
    """`quantization_config` of an AWQ checkpoint; only what our kernels run is accepted."""

    group_size: int = 128
    bits: int = BITS
    zero_point: bool = True
    version: str = "gemm"

    def to_dict(self) -> dict[str, Any]:
        """As AutoAWQ writes it into config.json (transformers' AwqConfig keys)."""
        return {
            "quant_method": "awq",
            "bits": self.bits,
            "group_size": self.group_size,
            "zero_point": self.zero_point,
            "version": self.version,
            "modules_to_not_convert": None,
        }

    @classmethod
    def from_dict(cls, raw: Any, source: str) -> AwqConfig:
        """Validate a `quantization_config` (or quant_config.json) object; unsupported variants are
        refused with what was found."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: quantization_config must be a JSON object, got {raw!r}")
        method = raw.get("quant_method", "awq" if "w_bit" in raw else None)
        if str(method).lower() != "awq":
            raise UnsupportedModelError(
                f"{source}: quantization method {method!r} is not supported (only AWQ INT4, GEMM format)"
            )
        bits = raw.get("bits", raw.get("w_bit"))
        group = raw.get("group_size", raw.get("q_group_size"))
        zero_point = raw.get("zero_point", True)
        version = str(raw.get("version", "gemm")).lower()
        if bits != BITS:
            raise UnsupportedModelError(f"{source}: AWQ with bits={bits!r} is not supported (4 only)")
        if version != "gemm":
            raise UnsupportedModelError(
                f"{source}: AWQ version {version!r} is not supported: only the GEMM layout (AutoAWQ's "
                "default, qweight [in, out/8]); GEMV, Marlin and ExLlama checkpoints use other layouts"
            )
        if group not in GROUP_SIZES:
            raise UnsupportedModelError(
                f"{source}: AWQ group_size={group!r} is not supported (one of {GROUP_SIZES})"
            )
        if zero_point is not True:
            raise UnsupportedModelError(f"{source}: AWQ zero_point={zero_point!r} is not supported (true)")
        skipped = raw.get("modules_to_not_convert")
        if skipped:
            raise UnsupportedModelError(
                f"{source}: AWQ modules_to_not_convert={json.dumps(skipped)} is not supported: every "
                "linear layer of the transformer must be quantized"
            )
        return cls(group_size=group, bits=bits, zero_point=True, version=version)


class PackedLayout(Enum):
    """Order of the words in `qweight`: as the checkpoint stores them, or permuted at load for the
    tensor-core kernel (kernels/awq_mma.py: each lane's word is its MMA fragment). Same shape."""

    AWQ = "awq"
    FRAGMENTS = "fragments"


@dataclass(frozen=True)
class AwqLinear:
    """One packed linear layer y = x @ W.T, W (out, in); tensors as in kernels/awq_format.py."""

    qweight: torch.Tensor  # (in, out / 8) int32
    qzeros: torch.Tensor  # (in / group, out / 8) int32
    scales: torch.Tensor  # (in / group, out) fp16
    group_size: int
    layout: PackedLayout = PackedLayout.AWQ

    @property
    def in_features(self) -> int:
        return int(self.qweight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.scales.shape[1])

    def awq_qweight(self) -> torch.Tensor:
        """qweight in AutoAWQ's order, whatever the layout."""
        if self.layout is PackedLayout.AWQ:
            return self.qweight
        k, n = self.in_features, self.out_features
        return pack_int4(fragment_unpack(self.qweight, k, n, self.group_size))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """W (out, in) in `dtype`, for the reference path."""
        w: torch.Tensor = dequantize(self.awq_qweight(), self.qzeros, self.scales).T
        return w.contiguous().to(dtype)

    def to(self, device: torch.device) -> AwqLinear:
        return replace(
            self,
            qweight=self.qweight.to(device),
            qzeros=self.qzeros.to(device),
            scales=self.scales.to(device),
        )

    def fragments_fit(self) -> bool:
        return fragments_fit(self.in_features, self.out_features, self.group_size)

    def to_fragments(self) -> AwqLinear:
        """The same layer in the fragment layout (a no-op if it is already)."""
        if self.layout is PackedLayout.FRAGMENTS:
            return self
        return replace(
            self, qweight=fragment_pack(self.qweight, self.group_size), layout=PackedLayout.FRAGMENTS
        )

    @staticmethod
    def cat(parts: list[AwqLinear]) -> AwqLinear:
        """Layers sharing their input, side by side along the output (fused QKV, gate/up). Whole words
        only: every part's output is a multiple of 8, so no word straddles two parts."""
        if any(p.layout is not PackedLayout.AWQ for p in parts):
            raise ValueError("only layers in AutoAWQ's layout concatenate (fuse before permuting)")
        return AwqLinear(
            torch.cat([p.qweight for p in parts], dim=1).contiguous(),
            torch.cat([p.qzeros for p in parts], dim=1).contiguous(),
            torch.cat([p.scales for p in parts], dim=1).contiguous(),
            parts[0].group_size,
        )


def awq_shapes(out: int, inp: int, group: int) -> dict[str, tuple[int, ...]]:
    return {
        "qweight": (inp, out // PACK),
        "qzeros": (inp // group, out // PACK),
        "scales": (inp // group, out),
    }


def check_divisible(name: str, out: int, inp: int, group: int) -> None:
    if out % PACK or inp % group:
        raise CheckpointError(
            f"{name} ({out} x {inp}) cannot be AWQ-packed with group_size {group}: out must be a multiple "
            f"of {PACK} and in a multiple of {group}"
        )


def read_awq_linear(
    get: Callable[[str], torch.Tensor], prefix: str, out: int, inp: int, qcfg: AwqConfig
) -> AwqLinear:
    """The packed layer `prefix` (e.g. model.layers.0.self_attn.q_proj) of shape (out, in), checked."""
    check_divisible(prefix, out, inp, qcfg.group_size)
    dtypes = {"qweight": (torch.int32,), "qzeros": (torch.int32,), "scales": (torch.float16, torch.bfloat16)}
    tensors: dict[str, torch.Tensor] = {}
    for part, shape in awq_shapes(out, inp, qcfg.group_size).items():
        name = f"{prefix}.{part}"
        t = get(name)
        if tuple(t.shape) != shape:
            raise CheckpointError(
                f"tensor {name} has shape {tuple(t.shape)} but config.json (group_size "
                f"{qcfg.group_size}) implies {shape}"
            )
        if t.dtype not in dtypes[part]:
            raise CheckpointError(f"tensor {name} has dtype {t.dtype}, AWQ stores it as {dtypes[part][0]}")
        tensors[part] = t
    return AwqLinear(tensors["qweight"], tensors["qzeros"], tensors["scales"].half(), qcfg.group_size)
