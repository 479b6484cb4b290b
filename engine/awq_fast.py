"""INT4 AWQ layer matrices on the fast path (engine/fast.py): steps of up to MAX_M rows on the packed
kernels, larger steps through one reused bf16 buffer that each matrix is dequantized into for cuBLAS
(docs/awq.md). Where bf16 MMAs run, the packed words are permuted once, at construction, into the layout
of the tensor-core kernel (kernels/awq_mma.py), whose split-K sums the next kernel takes.

A step of a few dozen rows sits between the two: dequantizing writes and reads back every matrix in bf16
(2.5 bytes a weight moved, whatever the rows), while the tensor-core kernel streams the packed weights
once per 16 rows (0.5 bytes a weight each time). Up to STREAM_ROWS rows both ways are offered to the
runner's warm-up, which keeps the faster per graph bucket (`stream`). A bucket runs all its rows, so a
64-row step streams four times: slower than dequantizing at every DeepSeek-Coder shape on the H200
(docs/awq.md), and not offered."""

from __future__ import annotations

import torch

from lsp_dscoder.engine.awq import AwqLinear, PackedLayout
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.kernels.awq_dequant import awq_dequant, fragment_dequant
from lsp_dscoder.kernels.awq_gemm import AwqWorkspace, awq_skinny
from lsp_dscoder.kernels.awq_mma import awq_mma, awq_mma_sums, mma_supported
from lsp_dscoder.kernels.skinny_gemm import MAX_M
from lsp_dscoder.kernels.split_sums import SplitSums

STREAM_ROWS = 32  # the longest step offered to the tensor-core kernel in launches of 16 rows


class PackedLinears:
    """The buffers every packed matrix of a model shares, and its product with a step's rows."""

    def __init__(self, model: Transformer, widest: int) -> None:
        cfg, dev, dtype = model.cfg, model.device, model.w.embed.dtype
        self.fragments = mma_supported(dev, dtype)  # the tensor-core kernel's layout: steps may stream
        if self.fragments:
            for layer in model.w.layers:
                assert layer.quant is not None  # every layer of a packed checkpoint is
                layer.quant = layer.quant.to_fragments()
        self.workspace = AwqWorkspace.allocate(widest, dev)
        largest = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size) * cfg.hidden_size
        self.dense = torch.empty(largest, dtype=dtype, device=dev)

    @staticmethod
    def of(model: Transformer, widest: int) -> PackedLinears | None:
        """The model's packed matrices' buffers, or None for a dense checkpoint."""
        packed = bool(model.w.layers) and model.w.layers[0].quant is not None
        return PackedLinears(model, widest) if packed else None

    def streams(self, rows: int) -> bool:
        """Whether a step of `rows` rows may stream the packed weights instead of dequantizing them."""
        return self.fragments and MAX_M < rows <= STREAM_ROWS

    def product(
        self, x: torch.Tensor, packed: AwqLinear, pdl: bool, stream: bool = False
    ) -> torch.Tensor | SplitSums:
        """x @ W.T; up to MAX_M rows on the MMA kernel as split-K sums for the next kernel; with `stream`,
        up to STREAM_ROWS rows on the same kernel, 16 rows a launch, finished in the kernel."""
        p = (packed.qweight, packed.qzeros, packed.scales)
        m = x.shape[0]
        fragments = packed.layout is PackedLayout.FRAGMENTS
        if m <= MAX_M and fragments:
            return awq_mma_sums(x, *p, workspace=self.workspace, pdl=pdl)
        if m <= MAX_M:
            return awq_skinny(x, *p, workspace=self.workspace, pdl=pdl)
        if stream and fragments and m <= STREAM_ROWS:
            return awq_mma(x, *p, workspace=self.workspace, pdl=pdl)
        k, n = packed.in_features, packed.out_features
        dequant = fragment_dequant if fragments else awq_dequant
        return x @ dequant(*p, out=self.dense[: k * n].view(k, n))  # (K, N)
