"""Owns the engine for the server: loads it off the event loop, warms it up, reloads it when the engine
settings change, and builds engine requests.

`lsp_dscoder.engine` (and torch with it) is imported in the loading thread, so the server answers
`initialize` at once and reports the import as the first progress stage. The server sees the engine only
through `backend.Backend`. Every load failure, whatever its kind, ends the load with its reason.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsp_dscoder.backend import Backend, Handle
from lsp_dscoder.settings import BackendKind, Settings

if TYPE_CHECKING:
    from lsp_dscoder.engine.api import CompletionRequest, TokenEvent

log = logging.getLogger(__name__)

# (message, percentage or None); called on the event loop
Report = Callable[[str, int | None], None]


class LoadState(enum.Enum):
    IDLE = "idle"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class EngineHost:
    def __init__(self) -> None:
        self.state = LoadState.IDLE
        self.error: str | None = None
        self.engine: Backend | None = None
        self.settings: Settings | None = None
        self._errors: tuple[type[Exception], ...] = ()
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        # (logging level, message) for the user, called on the event loop: the remote backend's outages
        self.notify: Callable[[int, str], None] | None = None
        # `dscoder/status` params for the editor's status, called on the event loop: the remote outages
        self.status: Callable[[dict[str, Any]], None] | None = None
        self._params: dict[tuple[int, tuple[str, ...]], Any] = {}  # SamplingParams by (max_tokens, stop)

    @property
    def ready(self) -> bool:
        return self.state is LoadState.READY

    @property
    def engine_errors(self) -> tuple[type[Exception], ...]:
        return self._errors

    async def load(self, settings: Settings, report: Report) -> bool:
        """Load (or reload) the engine for `settings`. Returns whether it is ready; on failure `error`
        says why and requests keep getting empty results."""
        async with self._lock:  # a reload requested during a load waits for it, then replaces it
            return await self._load(settings, report)

    async def _load(self, settings: Settings, report: Report) -> bool:
        loop = self._loop = asyncio.get_running_loop()
        old, self.engine = self.engine, None
        self.state, self.error, self.settings = LoadState.LOADING, None, settings

        def progress(stage: str, done: int, total: int) -> None:
            percent = int(100 * done / total) if total else None
            loop.call_soon_threadsafe(report, f"{stage} {done}/{total}", percent)

        try:
            if old is not None:
                await asyncio.to_thread(old.close)
            self.engine = await asyncio.to_thread(self._open, settings, progress)
        except Exception as exc:  # any failure must end the load with its reason
            expected = isinstance(exc, self._expected)  # its message says it all: no class name, no traceback
            self.state, self.error = (
                LoadState.FAILED,
                str(exc) if expected else f"{type(exc).__name__}: {exc}",
            )
            log.error("engine failed to load: %s", self.error, exc_info=not expected)
            return False
        self.state = LoadState.READY
        self.keep_warm(settings.keep_warm_ms)
        return True

    def keep_warm(self, interval_ms: int) -> None:
        """The backend's own keep-warm replays (Backend.keep_warm), every `interval_ms` (0: none)."""
        if self.engine is not None:
            self.engine.keep_warm(interval_ms / 1000.0 if interval_ms else None)

    @property
    def _expected(self) -> tuple[type[Exception], ...]:
        """Failures with a message that says it all (no traceback in the log)."""
        return (ImportError, OSError, ValueError, *self._errors)

    def _open(self, settings: Settings, progress: Callable[[str, int, int], None]) -> Backend:
        progress("import", 0, 1)
        from lsp_dscoder import engine as api
        from lsp_dscoder.engine.errors import EngineError

        self._errors = (EngineError,)
        progress("import", 1, 1)
        if settings.model:
            model = Path(settings.model).expanduser()  # a folder, or a repo id in the local HF cache
        else:
            from lsp_dscoder.bundled import default_model_path

            model = default_model_path()  # FileNotFoundError naming what is missing
        if settings.backend is BackendKind.REMOTE:  # a serving engine; `model` names only the tokenizer
            from lsp_dscoder.remote import open_remote

            assert self._loop is not None
            return open_remote(settings, model, self.notify, self._loop, self.status)
        from lsp_dscoder.engine.config import resolve  # torch: the in-process engine only

        device, dtype = resolve(settings.device, settings.dtype.value)
        config = api.EngineConfig(
            model=model,
            device=device,
            dtype=dtype,
            max_context=settings.max_context,
            num_slots=settings.num_slots,
            draft_tokens=settings.draft_tokens,
        )
        log.info("loading %s on %s (%s)", model, device, dtype)
        engine = api.Engine(config, progress=progress)
        progress("warmup", 0, 1)
        tok = engine.tokenizer
        warm = (tok.bos_id, tok.fim_begin_id, tok.fim_hole_id, tok.fim_end_id)
        params = api.SamplingParams(max_tokens=2)
        engine.submit(api.CompletionRequest(prompt_ids=warm, params=params)).result()
        progress("warmup", 1, 1)
        return engine

    def request(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop: tuple[str, ...],
        slot_key: str,
        deadline: float | None = None,
        heal_text: str = "",
        observer: Callable[[TokenEvent], bool] | None = None,
    ) -> CompletionRequest:
        """An engine request for the loaded backend (for `submit`, or `validate`)."""
        from lsp_dscoder import engine as api  # already imported by the load

        params = self._params.get((max_tokens, stop))
        if params is None:  # the same few on every keystroke: built (and validated) once
            params = self._params[max_tokens, stop] = api.SamplingParams(max_tokens=max_tokens, stop=stop)
        return api.CompletionRequest(
            prompt_ids=prompt_ids,  # an array('q') from the prompt builder: taken as it is
            params=params,
            slot_key=slot_key,
            deadline=deadline,
            heal_text=heal_text,
            observer=observer,
        )

    def submit(self, request: CompletionRequest) -> Handle:
        assert self.engine is not None, "submit() before the engine is ready"
        # Called on the event loop, which builds the request's consumer next: the engine thread starts first.
        return self.engine.submit(request, hand_off=True)

    def validate(self, request: CompletionRequest) -> None:
        """The checks of `submit`, nothing sent (keep_warm.py)."""
        assert self.engine is not None, "validate() before the engine is ready"
        self.engine.validate(request)

    def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats()) if self.engine is not None else {}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.state = LoadState.IDLE
