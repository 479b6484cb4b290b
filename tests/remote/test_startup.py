"""The remote backend's server starts without torch: its modules, the server and the engine package's
torch-free names import in a fresh interpreter with torch never loaded (torch costs seconds to import)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import lsp_dscoder.server, lsp_dscoder.remote, lsp_dscoder.remote_http, lsp_dscoder.remote_stream
from lsp_dscoder.engine import CompletionHandle, CompletionRequest, TokenEvent
from lsp_dscoder.engine.stops import StopStringFilter
from lsp_dscoder.engine.tokenizer import Tokenizer
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_remote_path_imports_no_torch() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]


def test_the_engine_package_still_gives_the_local_engine() -> None:
    probe = (
        "import sys; from lsp_dscoder.engine import Engine; print('torch' in sys.modules, Engine.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "lsp_dscoder.engine.engine"]
