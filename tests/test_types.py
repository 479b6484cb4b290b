"""The server, the engine and the kernels' host code pass `mypy --strict`.

The kernels are checked on their own, with untyped defs, calls and decorators allowed: @triton.jit kernels
and helpers carry no annotations by design (Triton specialises on the arguments it is given). Everything else
there (launchers, plans, the check CLIs) is held to the same strict checks as the server and the engine.

pyproject maps `lsp_dscoder.engine` to `engine/` and `lsp_dscoder.kernels` to `kernels/`, a layout mypy
cannot follow from the source tree, so the check runs over a tree of links laid out as installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MYPY = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--ignore-missing-imports"]
# What @triton.jit functions are: untyped defs (some with a typed tl.constexpr), called by the launchers,
# behind a decorator mypy cannot see through.
TRITON_JIT = [
    "--allow-untyped-defs",
    "--allow-incomplete-defs",
    "--allow-untyped-calls",
    "--allow-untyped-decorators",
]


def mypy(tmp_path: Path, folders: tuple[str, ...], flags: list[str]) -> subprocess.CompletedProcess[str]:
    """mypy with `flags` over the *.py of `folders` (relative to the installed lsp_dscoder/)."""
    package = tmp_path / "lsp_dscoder"
    package.mkdir()
    for entry in (ROOT / "lsp_dscoder").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "engine").symlink_to(ROOT / "engine")
    (package / "kernels").symlink_to(ROOT / "kernels")
    files = [str(p.relative_to(tmp_path)) for f in folders for p in sorted((package / f).glob("*.py"))]
    cmd = [*MYPY, *flags, "--cache-dir", str(tmp_path / ".mypy_cache"), *files]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_server_and_engine_pass_mypy_strict(tmp_path: Path) -> None:
    result = mypy(tmp_path, (".", "engine"), [])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_kernels_pass_mypy_strict_but_for_jit_functions(tmp_path: Path) -> None:
    result = mypy(tmp_path, ("kernels",), TRITON_JIT)
    assert result.returncode == 0, result.stdout + result.stderr
