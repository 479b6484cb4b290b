"""What a pause does to the same Python: one keystroke's edit of an 8K-token document (`Documents.change`,
as a didChange applies it), timed after a pause of `--gaps` seconds each.

    python -m tests.lsp.cold_edit [--gaps 0,0.001,0.1] [--edits 60]

Prints the p50 and p10 of each pause's edits in µs. The edit is the same code on the same data every
time; what changes is how long ago it last ran (docs/benchmarks.md, "Cold code").
"""

from __future__ import annotations

import argparse
import statistics
import time

from lsp_dscoder.bench_docs import generate
from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.documents import Documents, keystroke_change
from lsp_dscoder.positions import Encoding


def edit_times(gap: float, edits: int) -> list[float]:
    doc = generate(default_model_path() / "tokenizer.json", 8000)
    docs = Documents()
    docs.open("file:///a.py", "python", 1, doc.text)
    line = doc.text.count("\n", 0, doc.cursor)
    character = doc.cursor - (doc.text.rfind("\n", 0, doc.cursor) + 1)
    times = []
    for version in range(2, 2 + edits):
        at = {"line": line, "character": character}
        raw = {
            "textDocument": {"uri": "file:///a.py", "version": version},
            "contentChanges": [{"range": {"start": at, "end": at}, "text": "a"}],
        }
        if gap:
            time.sleep(gap)
        start = time.perf_counter()
        change = keystroke_change(raw)
        assert change is not None
        docs.change(*change, Encoding.UTF8)
        times.append(time.perf_counter() - start)
        character += 1
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaps", default="0,0.001,0.1")
    ap.add_argument("--edits", type=int, default=60)
    args = ap.parse_args()
    for gap in (float(g) for g in args.gaps.split(",")):
        t = sorted(edit_times(gap, args.edits))
        p50, p10 = statistics.median(t) * 1e6, t[len(t) // 10] * 1e6
        print(f"pause {gap * 1e3:6.1f} ms: edit p50 {p50:7.1f} us, p10 {p10:7.1f} us")


if __name__ == "__main__":
    main()
