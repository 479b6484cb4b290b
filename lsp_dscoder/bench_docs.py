"""What `lsp-dscoder bench --protocol` types into and serves: generated Python documents of a given token
count, the keystroke script, and checkpoints with random weights of a real DeepSeek-Coder shape."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

# Typed at the cursor, one character per keystroke (repeated when the session is longer).
SCRIPT = (
    "\n    count = len(items)\n    if count > limit:\n        return count\n    average = total / count\n"
)
_NAMES = ("parse", "scan", "merge", "split", "render", "update", "load", "check", "score", "index")
_NOUNS = ("token", "line", "record", "buffer", "entry", "node", "column", "chunk", "frame", "value")


@dataclass(frozen=True)
class Document:
    text: str
    tokens: int  # by the served model's tokenizer
    cursor: int  # offset where typing starts: the end of a `total = 0` line about 60% into the text


def _block(rng: random.Random, i: int) -> str:
    verb, noun = rng.choice(_NAMES), rng.choice(_NOUNS)
    k, n = rng.randint(2, 9), rng.randint(10, 999)
    return (
        f"def {verb}_{noun}_{i}(items, limit={n}):\n"
        f'    """Return the weighted sum of the {noun}s of `items` up to `limit`."""\n'
        "    total = 0\n"
        "    for index, value in enumerate(items):\n"
        "        if value > limit:\n"
        "            break\n"
        f"        total += value * {k} + index\n"
        "    return total\n\n\n"
        f"class {noun.title()}{verb.title()}{i}:\n"
        f"    def __init__(self, size={n}):\n"
        "        self.size = size\n"
        f"        self.values = [{k}] * size\n\n"
        "    def update(self, key, value):\n"
        "        self.values[key % self.size] = value\n"
        "        return self.values\n\n\n"
    )


def generate(tokenizer_json: Path, target_tokens: int, seed: int = 0) -> Document:
    """A Python module of about `target_tokens` tokens (whole blocks, the first that reach it)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    rng = random.Random(seed)
    parts, total = ['"""Generated for lsp-dscoder bench --protocol."""\n\nimport math\n\n\n'], 0
    while total < target_tokens:
        parts.append(_block(rng, len(parts)))
        total += count(parts[-1])
    text = "".join(parts)
    anchor = text.find("    total = 0\n", int(0.6 * len(text)))
    if anchor < 0:
        anchor = text.rfind("    total = 0\n")
    return Document(text, count(text), anchor + len("    total = 0"))


def tokenizer_vocab(folder: Path) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True))


def write_random_checkpoint(folder: Path, config: dict[str, object], tokenizer_from: Path) -> Path:
    """A checkpoint folder of `config`'s shape: random bf16 weights (normal 0.02, norms 1), the tokenizer
    of `tokenizer_from`. LM head rows past that tokenizer's vocabulary are zero, so greedy decoding never
    picks a token the tokenizer cannot spell (their logits are 0, far below the best of thousands)."""
    import torch
    from safetensors.torch import save_file

    from lsp_dscoder.engine.config import ModelConfig
    from lsp_dscoder.engine.weights import expected_shapes

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    cfg = ModelConfig.from_dict(dict(config), source="bench shape")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (
                torch.empty(shape, device=device, dtype=torch.bfloat16)
                .normal_(0.0, 0.02, generator=gen)
                .cpu()
            )
        tensors[name] = t
    tensors["lm_head.weight"][tokenizer_vocab(tokenizer_from) :] = 0
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=1))
    return folder
