"""What `lsp-dscoder eval` scores: held-out files and the cases it draws from them (rest of a line,
whole lines removed, other files open beside the case), all from a seeded `random.Random`.

Held-out files come from `--data` (a `heldout.jsonl.xz` written by `lsp_dscoder.training.corpus`), else
from the list recorded beside the bundled model, read from this machine's standard library and
site-packages (files whose content changed are skipped).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from lsp_dscoder.prompt import ContextFile

HELDOUT_LIST = "heldout_files.txt"


@dataclass(frozen=True)
class Case:
    source: str
    prefix: str
    middle: str
    suffix: str


Doc = dict[str, str]  # {"id": "source:path", "text": ...}


def load_heldout(data: Path | None, bundled: Path) -> list[Doc]:
    """Held-out documents {"id", "text"}: from a corpus split file, or the recorded list on this machine."""
    from lsp_dscoder.training.corpus import read_docs

    if data is not None:
        return read_docs(data)
    docs: list[Doc] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for line in (bundled / HELDOUT_LIST).read_text(encoding="utf-8").splitlines():
        doc_id, digest = line.rsplit(" ", 1)
        source, rel = doc_id.split(":", 1)
        try:
            path = stdlib / rel if source == "stdlib" else Path(str(md.distribution(source).locate_file(rel)))
            text = path.read_text(encoding="utf-8")
        except (md.PackageNotFoundError, OSError, UnicodeDecodeError):
            continue
        if hashlib.sha256(text.encode()).hexdigest().startswith(digest):
            docs.append({"id": doc_id, "text": text})
    return docs


def line_cases(docs: list[Doc], n: int, rng: random.Random) -> list[Case]:
    """Cursor inside a line (before its last non-blank character); middle = the rest of the line."""
    cases: list[Case] = []
    while len(cases) < n:
        doc = rng.choice(docs)
        text = doc["text"]
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        start = rng.choice(starts)
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        content = text[start:end].rstrip()
        if not content.strip():
            continue
        cursor = start + rng.randrange(len(content))
        cases.append(Case(doc["id"], text[:cursor], text[cursor:end], text[end:]))
    return cases


def fim_cases(docs: list[Doc], n: int, rng: random.Random) -> list[Case]:
    """One to three whole non-blank lines (with their newlines) removed; the model must restore them."""
    cases: list[Case] = []
    while len(cases) < n:
        doc = rng.choice(docs)
        lines = doc["text"].splitlines(keepends=True)
        k = rng.randint(1, 3)
        if len(lines) <= k:
            continue
        i = rng.randrange(len(lines) - k + 1)
        middle = "".join(lines[i : i + k])
        if not all(line.strip() for line in lines[i : i + k]):
            continue
        cases.append(Case(doc["id"], "".join(lines[:i]), middle, "".join(lines[i + k :])))
    return cases


def context_files(docs: list[Doc], case: Case, n: int, rng: random.Random) -> tuple[ContextFile, ...]:
    """`n` other held-out files, as other open documents of the editor."""
    others = [d for d in docs if d["id"] != case.source]
    picked = rng.sample(others, min(n, len(others)))
    return tuple(ContextFile(d["id"].split(":", 1)[1], d["text"], "python", (d["id"], 1)) for d in picked)
