from __future__ import annotations

import pytest

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.training.fim import SpecialIds


@pytest.fixture(scope="session")
def tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))


@pytest.fixture(scope="session")
def special(tok) -> SpecialIds:
    return SpecialIds.from_tokenizer(tok)
