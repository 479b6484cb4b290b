"""The model shipped inside the package: used when no `--model` is given."""

from __future__ import annotations

from pathlib import Path

REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json")


def default_model_path() -> Path:
    """The bundled checkpoint folder; FileNotFoundError naming what is missing if the install lacks it."""
    folder = Path(__file__).resolve().parent / "bundled"
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not missing and not any(folder.glob("model-*.safetensors")):
        missing = ["model-*.safetensors"]
    if missing:
        raise FileNotFoundError(
            f"the bundled model is incomplete in {folder} (missing {', '.join(missing)}); "
            "reinstall lsp-dscoder or pass --model PATH to a DeepSeek-Coder checkpoint folder"
        )
    return folder
