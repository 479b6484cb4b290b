"""The server and the engine pass `mypy --strict`.

pyproject maps `lsp_dscoder.engine` to `engine/` and `lsp_dscoder.kernels` to `kernels/`, a layout mypy
cannot follow from the source tree, so the check runs over a tree of links laid out as installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_server_and_engine_pass_mypy_strict(tmp_path: Path) -> None:
    package = tmp_path / "lsp_dscoder"
    package.mkdir()
    for entry in (ROOT / "lsp_dscoder").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "engine").symlink_to(ROOT / "engine")
    (package / "kernels").symlink_to(ROOT / "kernels")
    files = sorted(str(p.relative_to(tmp_path)) for p in package.glob("*.py"))
    files += sorted(str(p.relative_to(tmp_path)) for p in (package / "engine").glob("*.py"))
    cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--ignore-missing-imports"]
    cmd += ["--cache-dir", str(tmp_path / ".mypy_cache"), *files]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
