"""Finding a checkpoint: a local folder, or a Hugging Face repo id already in the local cache.

Nothing is downloaded at run time; a missing model gets a message saying how to download it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lsp_dscoder.engine.errors import CheckpointError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve_model(spec: str | Path, revision: str = "main") -> Path:
    """A checkpoint folder for `spec`: the folder itself, or the cached snapshot of a repo id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec)
    if path.exists():
        raise CheckpointError(
            f"model {text} is a file, not a checkpoint folder (the folder holding config.json, "
            "tokenizer.json and the *.safetensors weights)"
        )
    if not REPO_ID.match(text):
        raise CheckpointError(f"model folder {text} does not exist")
    repo = hf_cache_dir() / ("models--" + text.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / revision
    candidates = []
    if ref.exists():
        candidates.append(snapshots / ref.read_text().strip())
    if snapshots.is_dir():
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for snap in candidates:
        if (snap / "config.json").exists():
            return snap
    raise CheckpointError(
        f"model {text} is neither a local folder nor in the Hugging Face cache ({hf_cache_dir()}); "
        f"download it first, e.g. `hf download {text}` (or `huggingface-cli download {text}`), "
        "or pass --model with a checkpoint folder"
    )
