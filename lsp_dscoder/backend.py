"""What the server uses of an engine: the typed seam between `lsp_dscoder` and `lsp_dscoder.engine`.

The engine package imports torch, which takes seconds; the server imports it only in the loading thread
(`engine_host.py`). The engine's types are imported here for the type checker alone, so this module (and
every server module that names them) stays light at run time.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

from lsp_dscoder.prompt_parts import FimTokenizer

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import Completion, CompletionRequest, TokenEvent


class BackendTokenizer(FimTokenizer, Protocol):
    """The tokenizer of the loaded model: what the prompt builder uses, and the end of sequence."""

    @property
    def eos_id(self) -> int: ...


class Handle(Protocol):
    """One submitted request: its token events as they become final, then its completion. Both raise the
    engine's errors (`EngineHost.engine_errors`)."""

    def cancel(self) -> None: ...

    def stream(self) -> AsyncGenerator[TokenEvent, None]: ...

    async def wait(self) -> Completion: ...


class Backend(Protocol):
    """A loaded engine (`lsp_dscoder.engine.Engine`, or anything that serves the same requests)."""

    @property
    def tokenizer(self) -> BackendTokenizer: ...
    @property
    def max_context(self) -> int: ...

    def submit(self, request: CompletionRequest, hand_off: bool = False) -> Handle:
        """Queue `request`. hand_off: the caller runs an event loop and goes on with its own work after
        this; an in-process engine lets its thread start first (engine.Engine.submit)."""
        ...

    def validate(self, request: CompletionRequest) -> CompletionRequest:
        """The checks of `submit`, nothing queued or sent: raises what `submit` would raise for the request
        itself. The keep-warm replays (keep_warm.py) run it on the last keystroke's prompt."""
        ...

    def keep_warm(self, interval_s: float | None) -> None:
        """Replay the host work of the last request's first token every `interval_s` while requests keep
        coming, off the event loop (the engine thread's own part; None: never)."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
