"""Load/compile progress on stderr: a progress bar on a terminal, one line per stage otherwise."""

from __future__ import annotations

import sys
from typing import TextIO


class StderrProgress:
    """Callable as an engine `progress(stage, done, total)` callback."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._bar = None
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self.close()
            self._stage = stage
            if self.tty and total > 1:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=stage, file=self.stream, unit="step", leave=False)
            elif total > 1 or not self.tty:
                print(f"lsp-dscoder: {stage}", file=self.stream, flush=True)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
