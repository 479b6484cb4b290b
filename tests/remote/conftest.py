"""Fixtures of the remote-backend tests: llama.cpp's server (built by install_llama_server.sh) serving
the bundled model converted to GGUF. A missing server fails the tests, pointing at the install script."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lsp_dscoder.bundled import default_model_path
from tests.remote.llama_server import INSTALL, LlamaServer, convert, llama_dir


@pytest.fixture(scope="session")
def bundled() -> Path:
    return Path(default_model_path())


@pytest.fixture(scope="session")
def gguf(bundled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = llama_dir()
    if (
        not (folder / "bin" / "llama-server").is_file()
        or not (folder / "src" / "convert_hf_to_gguf.py").is_file()
    ):
        pytest.fail(f"llama.cpp's server is not installed in {folder}: run `{INSTALL}` first", pytrace=False)
    return convert(bundled, tmp_path_factory.mktemp("gguf") / "bundled-f32.gguf")


@pytest.fixture(scope="module")
def llama(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(gguf, tmp_path_factory.mktemp("llama") / "llama-server.log").start()
    yield server
    server.kill()
