"""Fixtures of the language-server tests: the tiny checkpoint's real tokenizer, and (in `client.py`)
real server processes driven by pytest-lsp clients."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests import tiny


class TinyTokenizer:
    """The tiny checkpoint's tokenizer.json with the interface the prompt builder needs."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.bos_id = self._tok.token_to_id(tiny.BOS)
        self.eos_id = self._tok.token_to_id(tiny.EOS)
        self.fim_begin_id = self._tok.token_to_id(tiny.FIM_BEGIN)
        self.fim_hole_id = self._tok.token_to_id(tiny.FIM_HOLE)
        self.fim_end_id = self._tok.token_to_id(tiny.FIM_END)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> TinyTokenizer:
    return TinyTokenizer(tiny_model)
