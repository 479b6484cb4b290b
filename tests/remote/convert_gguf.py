"""Convert a DeepSeek-Coder-format checkpoint folder to GGUF with llama.cpp's own converter.

    python tests/remote/convert_gguf.py LLAMA_DIR CHECKPOINT OUT.gguf [OUTTYPE]

LLAMA_DIR is what `install_llama_server.sh` prints (its `src/` holds the converter). OUTTYPE is the
converter's `--outtype` (default f32; bf16 keeps a bf16 checkpoint's weights exactly). Real DeepSeek-Coder
checkpoints convert with the converter as it is. The bundled model has a BPE tokenizer of its own, whose
fingerprint the converter does not know: its pre-tokenizer is then declared `deepseek-coder` (the same
kind of splits), which only matters to text prompts (the remote backend sends token ids), and a tokenizer
without `tokenizer.model` goes straight to the BPE path instead of failing on a missing sentencepiece.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[0]) / "src"
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    from conversion import base, llama  # type: ignore[import-not-found]

    known = base.TextModel.get_vocab_base_pre

    def vocab_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:
            return "deepseek-coder"

    stock_vocab = llama.LlamaModel.set_vocab

    def set_vocab(self: Any) -> None:
        if (self.dir_model / "tokenizer.model").is_file():
            stock_vocab(self)
        else:
            self._set_vocab_gpt2()

    base.TextModel.get_vocab_base_pre = vocab_pre
    llama.LlamaModel.set_vocab = set_vocab
    outtype = argv[3] if len(argv) == 4 else "f32"
    sys.argv = ["convert_hf_to_gguf.py", argv[1], "--outfile", argv[2], "--outtype", outtype]
    namespace = {"__name__": "convert_hf_to_gguf", "__file__": str(src / "convert_hf_to_gguf.py")}
    exec(compile((src / "convert_hf_to_gguf.py").read_text(), namespace["__file__"], "exec"), namespace)
    namespace["main"]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
