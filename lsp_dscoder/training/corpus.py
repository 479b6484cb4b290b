"""Build the training corpus: permissively licensed Python source found on this machine.

Sources are the CPython standard library (PSF licence) and the installed distributions whose licence
metadata (SPDX expression, trove classifiers or licence field) names only permissive licences. Vendored
third-party code (`_vendor/`, `vendored/`, `third_party/`) is skipped because its licence is not the
distribution's. Files are filtered like StarCoder's data (no generated or minified files, strict UTF-8),
exact duplicates are dropped, and each distribution (not the standard library) is capped so that a few
huge projects do not dominate.

Held-out files are whole files, chosen deterministically: whole distributions picked by a hash of their
name (so that near-copies inside one project stay on one side) plus a hash-picked share of the standard
library. Writes, under the output folder (default `.train_data/`):

    train.jsonl.xz, heldout.jsonl.xz   one JSON object per file: {"id": "<source>:<path>", "text": ...}
    manifest.json                      sources, licences, sizes, held-out ids with content hashes

    python -m lsp_dscoder.training.corpus --out .train_data
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import lzma
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PERMISSIVE_SPDX = frozenset(
    [
        "MIT",
        "MIT-0",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "0BSD",
        "Apache-2.0",
        "LLVM-exception",
        "PSF-2.0",
        "Python-2.0",
        "CNRI-Python",
        "ISC",
        "Zlib",
        "CC0-1.0",
        "BSL-1.0",
        "Unlicense",
    ]
)
PERMISSIVE_CLASSIFIERS = frozenset(
    {
        "MIT License",
        "MIT No Attribution License (MIT-0)",
        "BSD License",
        "Apache Software License",
        "Python Software Foundation License",
        "ISC License (ISCL)",
    }
)
# Free-text licence fields that name one permissive licence, used when neither SPDX nor classifiers say.
PERMISSIVE_TEXT = re.compile(r"^\s*(MIT|BSD|Apache|ASL 2|PSF|ISC|Modified BSD)\b", re.IGNORECASE)
SKIP_PARTS = frozenset({"_vendor", "vendored", "vendor", "third_party", "site-packages"})
SKIP_DISTRIBUTIONS = frozenset({"lsp-dscoder"})


@dataclass(frozen=True)
class CorpusConfig:
    max_file_bytes: int = 200_000
    min_file_bytes: int = 64
    max_line_chars: int = 1000
    max_mean_line_chars: float = 100.0
    min_alnum_fraction: float = 0.25
    cap_bytes_per_source: int = 24_000_000  # the standard library is not capped
    heldout_source_modulus: int = 12  # a distribution is held out when hash(name) % this == 0 ...
    heldout_source_max_bytes: int = 1_500_000  # ... and it is small enough
    heldout_stdlib_modulus: int = 50  # a stdlib file is held out when hash(path) % this == 0


@dataclass(frozen=True)
class Source:
    name: str  # "stdlib" or the distribution name
    licence: str
    root: Path
    files: tuple[Path, ...]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def spdx_permissive(expression: str) -> bool:
    tokens = [t for t in re.split(r"[\s()]+", expression) if t and t.upper() not in ("AND", "OR", "WITH")]
    return bool(tokens) and all(t in PERMISSIVE_SPDX for t in tokens)


def licence_of(dist: md.Distribution) -> str | None:
    """The permissive licence of a distribution as its metadata states it, or None if not permissive."""
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if expression:
        return expression if spdx_permissive(expression) else None
    classifiers = [
        c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")
    ]
    classifiers = [c for c in classifiers if c != "OSI Approved"]
    if classifiers:
        return "; ".join(classifiers) if all(c in PERMISSIVE_CLASSIFIERS for c in classifiers) else None
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and spdx_permissive(text):
        return text
    if PERMISSIVE_TEXT.match(text) and not re.search(r"GPL|MPL|Mozilla", text):
        return text.splitlines()[0][:80]
    return None


def _python_files(root: Path, paths: Iterator[Path]) -> tuple[Path, ...]:
    keep = []
    for path in paths:
        if path.suffix != ".py" or not path.is_relative_to(root):
            continue
        if not SKIP_PARTS.intersection(path.relative_to(root).parts[:-1]) and path.is_file():
            keep.append(path)
    return tuple(sorted(keep))


def discover_sources() -> tuple[list[Source], list[tuple[str, str]]]:
    """Permissive sources on this machine, and the (distribution, licence) pairs that were refused."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [Source("stdlib", "PSF-2.0", stdlib, _python_files(stdlib, stdlib.rglob("*.py")))]
    refused: list[tuple[str, str]] = []
    seen: set[str] = set()
    for dist in sorted(md.distributions(), key=lambda d: d.metadata["Name"].lower()):
        name = dist.metadata["Name"]
        if name.lower() in seen or name in SKIP_DISTRIBUTIONS:
            continue
        seen.add(name.lower())
        licence = licence_of(dist)
        if licence is None:
            meta = dist.metadata
            refused.append((name, meta.get("License-Expression") or (meta.get("License") or "?")[:60]))
            continue
        root = Path(dist.locate_file("")).resolve()
        files = _python_files(root, (Path(dist.locate_file(f)).resolve() for f in dist.files or ()))
        if files:
            sources.append(Source(name, licence, root, files))
    return sources, refused


def keep_text(text: str, cfg: CorpusConfig) -> bool:
    """StarCoder-style quality filters: no generated, minified or data-only files."""
    if not cfg.min_file_bytes <= len(text) <= cfg.max_file_bytes:
        return False
    lines = text.splitlines() or [""]
    if max(map(len, lines)) > cfg.max_line_chars or len(text) / len(lines) > cfg.max_mean_line_chars:
        return False
    if sum(c.isalnum() for c in text) / len(text) < cfg.min_alnum_fraction:
        return False
    head = "\n".join(lines[:5]).lower()
    return not any(m in head for m in ("auto-generated", "autogenerated", "do not edit", "generated by"))


def build(cfg: CorpusConfig, out: Path) -> dict:
    sources, refused = discover_sources()
    seen_hashes: set[str] = set()
    splits: dict[str, list[dict]] = {"train": [], "heldout": []}
    summary = []
    for source in sources:
        docs = []
        for path in source.files:
            try:
                text = path.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            digest = hashlib.sha256(text.strip().encode()).hexdigest()
            if digest in seen_hashes or not keep_text(text, cfg):
                continue
            seen_hashes.add(digest)
            docs.append({"id": f"{source.name}:{path.relative_to(source.root).as_posix()}", "text": text})
        docs.sort(key=lambda d: _hash(d["id"]))  # a deterministic, content-independent sample under the cap
        kept, size = [], 0
        for doc in docs:
            if source.name != "stdlib" and size + len(doc["text"]) > cfg.cap_bytes_per_source:
                break
            kept.append(doc)
            size += len(doc["text"])
        whole_heldout = (
            source.name != "stdlib"
            and _hash(source.name) % cfg.heldout_source_modulus == 0
            and size <= cfg.heldout_source_max_bytes
        )
        for doc in kept:
            held = whole_heldout or (
                source.name == "stdlib" and _hash(doc["id"]) % cfg.heldout_stdlib_modulus == 0
            )
            splits["heldout" if held else "train"].append(doc)
        summary.append(
            {
                "source": source.name,
                "licence": source.licence,
                "files": len(kept),
                "bytes": size,
                "heldout": "whole" if whole_heldout else ("some" if source.name == "stdlib" else "none"),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    for split, docs in splits.items():
        with lzma.open(out / f"{split}.jsonl.xz", "wt", encoding="utf-8", preset=6) as f:
            for doc in docs:
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    manifest = {
        "config": cfg.__dict__,
        "sources": summary,
        "refused": [{"distribution": n, "licence": lic} for n, lic in refused],
        "train": {"files": len(splits["train"]), "bytes": sum(len(d["text"]) for d in splits["train"])},
        "heldout": {
            "files": len(splits["heldout"]),
            "bytes": sum(len(d["text"]) for d in splits["heldout"]),
            "ids": [
                f"{d['id']} {hashlib.sha256(d['text'].encode()).hexdigest()[:16]}" for d in splits["heldout"]
            ],
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest


def read_docs(path: Path) -> list[dict]:
    """The documents of one split file written by `build`."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def sources_markdown(manifest: dict) -> str:
    """The licence record shipped beside the model: every source, its licence, what was used."""
    lines = [
        "# Training data sources and licences",
        "",
        "Python source files (`*.py`) found on the build machine: the CPython 3.11 standard library and",
        "the installed distributions whose licence metadata names only permissive licences (SPDX",
        "expression, else trove classifiers, else the licence field). Vendored code (`_vendor/`,",
        "`vendored/`, `vendor/`, `third_party/`) was skipped. Written by `python -m",
        "lsp_dscoder.training.corpus --sources-md`.",
        "",
        f"Training split: {manifest['train']['files']} files, {manifest['train']['bytes'] / 1e6:.1f} MB. "
        f"Held-out split: {manifest['heldout']['files']} files, {manifest['heldout']['bytes'] / 1e6:.1f} MB "
        "(listed with content hashes in `heldout_files.txt`).",
        "",
        "| source | licence (as its metadata states it) | files used | MB used | held out |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for src in sorted(manifest["sources"], key=lambda s: (s["source"] != "stdlib", s["source"].lower())):
        licence = src["licence"].replace("|", "/")
        lines.append(
            f"| {src['source']} | {licence} | {src['files']} | {src['bytes'] / 1e6:.2f} | {src['heldout']} |"
        )
    lines += ["", "Refused (licence not permissive, or not stated as such), none of their files used:", ""]
    lines += [f"- {r['distribution']}: {r['licence']}" for r in manifest["refused"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".train_data"))
    parser.add_argument("--cap-mb", type=float, default=CorpusConfig.cap_bytes_per_source / 1e6)
    parser.add_argument(
        "--sources-md", type=Path, default=None, help="write the licence record from OUT/manifest.json"
    )
    args = parser.parse_args(argv)
    if args.sources_md is not None and (args.out / "manifest.json").exists():
        manifest = json.loads((args.out / "manifest.json").read_text())
        args.sources_md.write_text(sources_markdown(manifest), encoding="utf-8")
        return 0
    manifest = build(CorpusConfig(cap_bytes_per_source=int(args.cap_mb * 1e6)), args.out)
    for split in ("train", "heldout"):
        size = (args.out / f"{split}.jsonl.xz").stat().st_size
        info = manifest[split]
        print(f"{split}: {info['files']} files, {info['bytes'] / 1e6:.1f} MB text, {size / 2**20:.1f} MiB xz")
    refused = ", ".join(r["distribution"] for r in manifest["refused"])
    print(f"sources: {len(manifest['sources'])}, refused: {refused}")
    if args.sources_md is not None:
        args.sources_md.write_text(sources_markdown(manifest), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
