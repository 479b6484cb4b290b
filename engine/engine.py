"""The engine: one thread owns the device; callers submit requests and consume token streams.

`Engine` is the only API the server uses. Submitting is thread-safe; a `CompletionHandle` can be
consumed from a thread (iteration, `result`) or from asyncio (`stream`, `wait`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from lsp_dscoder.engine.api import Completion, CompletionRequest, StopReason, TokenEvent
from lsp_dscoder.engine.checkpoint import resolve_model
from lsp_dscoder.engine.config import EngineConfig, ModelConfig
from lsp_dscoder.engine.errors import CheckpointError, ContextOverflowError, EngineClosedError, EngineError
from lsp_dscoder.engine.factory import ReferenceRunner as ReferenceRunner  # where callers have found it
from lsp_dscoder.engine.factory import assemble, wants_fast_path
from lsp_dscoder.engine.generate import generate
from lsp_dscoder.engine.handle import CompletionHandle
from lsp_dscoder.engine.lookup import FAST_PATH_DRAFTS
from lsp_dscoder.engine.prefix import VocabularyCheck, out_of_vocabulary, token_ids
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.warm import WINDOW_S, rehearse
from lsp_dscoder.engine.weights import load_weights

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


class Engine:
    """Loads the model on its own thread, which then serves every request: torch work stays on one
    thread, so there is one OpenMP thread pool (a pool per thread would make each parallel op wake the
    other's sleeping threads). The constructor waits for the load and raises its error."""

    def __init__(self, config: EngineConfig, progress: Progress | None = None) -> None:
        self.config = config
        self._queue: queue.Queue[CompletionHandle | None] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(
            (
                "requests",
                "completed",
                "cancelled",
                "errors",
                "prompt_tokens",
                "reused_tokens",
                "prefilled_tokens",
                "generated_tokens",
                "warm_replays",
            ),
            0,
        )
        self._ttfts: deque[float] = deque(maxlen=1000)
        self._warm_interval: float | None = None  # keep_warm()
        self._warm_busy_s = 0.0
        self._last: CompletionRequest | None = None  # the last request served
        loaded = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self._load(progress or (lambda stage, done, total: None))
            except BaseException as e:  # handed to the constructor, which raises it
                failure.append(e)
                return
            finally:
                loaded.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="lsp-dscoder-engine", daemon=True)
        self._thread.start()
        loaded.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    def _load(self, report: Progress) -> None:
        config = self.config
        folder = resolve_model(config.model)
        report("reading config", 0, 1)
        self.model_config = ModelConfig.from_file(folder / "config.json")
        self._vocabulary = VocabularyCheck(self.model_config.vocab_size)
        self.tokenizer = Tokenizer(folder)
        if self.tokenizer.vocab_size > self.model_config.vocab_size:
            raise CheckpointError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens "
                f"but the model only {self.model_config.vocab_size}"
            )
        self.tokenizer.prepare_healing()  # token healing's vocabulary index, before the first keystroke
        report("reading config", 1, 1)
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"device {config.device} requested but CUDA is not available here")
        # AWQ layers stay packed for the fast path's dequantizing kernels
        packed = wants_fast_path(config.fast_path, self.device, self.model_config)
        weights = load_weights(folder, self.model_config, self.device, config.torch_dtype, report, packed)
        self.max_context = config.max_context
        report("allocating KV cache", 0, 1)
        built = assemble(
            self.model_config,
            weights,
            num_slots=config.num_slots,
            max_context=config.max_context,
            device=self.device,
            dtype=config.torch_dtype,
            fast_path=config.fast_path,
            progress=report,
        )
        self.cache, self.model, self.runner, self.fast_path = (
            built.cache,
            built.model,
            built.runner,
            built.fast_path,
        )
        default = FAST_PATH_DRAFTS if self.fast_path else 0
        self.draft_tokens = default if config.draft_tokens is None else config.draft_tokens
        report("allocating KV cache", 1, 1)  # and the fast path's warm-up (its own stage in between)

    def submit(self, request: CompletionRequest, hand_off: bool = False) -> CompletionHandle:
        """Queue a request. Raises ContextOverflowError / EngineError on bad input. Returns at once, or with
        `hand_off` on a CUDA device once the engine thread has queued the request's first forward (at most
        CompletionHandle.PICKUP_S): for a submitter on an event loop, whose work after the submit would
        otherwise hold the interpreter while the woken engine thread waits for it and the device idles.
        On the CPU the forward is the engine thread's own work: nothing to overlap, no wait."""
        request = self.validate(request)
        handle = CompletionHandle(request)
        with self._lock:
            self._counters["requests"] += 1
        self._queue.put(handle)
        if hand_off and self.device.type == "cuda":
            handle.wait_launched(handle.PICKUP_S)
        return handle

    def validate(self, request: CompletionRequest) -> CompletionRequest:
        """The checks of `submit`, nothing queued: raises what `submit` would raise, else returns the
        request as `submit` would queue it (prompt ids as an int64 array)."""
        if self._closed:
            raise EngineClosedError("the engine has been shut down")
        vocab = self.model_config.vocab_size
        try:
            ids = token_ids(request.prompt_ids, vocab)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if ids is not request.prompt_ids:
            request = dataclasses.replace(request, prompt_ids=ids)
        n = len(ids)
        if n == 0:
            raise EngineError("empty prompt: at least one token (e.g. BOS) is required")
        if n > self.max_context:
            raise ContextOverflowError(f"prompt of {n} tokens exceeds the max context of {self.max_context}")
        with self._lock:  # submitted from any thread
            bad = self._vocabulary.outside(request.slot_key, ids)
        if bad is not None:
            raise EngineError(out_of_vocabulary(bad, vocab))
        if not self.tokenizer.can_heal(request.heal_text):
            heal = request.heal_text
            raise EngineError(f"heal_text {heal!r} cannot be spelled by whole tokens of this vocabulary")
        return request

    def complete(self, request: CompletionRequest, timeout: float | None = None) -> Completion:
        return self.submit(request).result(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
            ttfts = sorted(self._ttfts)
        if ttfts:
            out["ttft_ms"] = {
                f"p{q}": 1e3 * ttfts[min(len(ttfts) - 1, int(q / 100 * len(ttfts)))] for q in (50, 90, 99)
            }
        out["slots"] = [len(s.tokens) for s in self.cache.slots]
        out["warm_busy_ms"] = round(1e3 * self._warm_busy_s, 3)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=10)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keep_warm(self, interval_s: float | None) -> None:
        """While requests keep coming (one in the last `warm.WINDOW_S`), replay the host work of the last
        one's first token on the idle engine thread every `interval_s` (engine/warm.py); None: never."""
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"keep-warm interval must be > 0 seconds or None, got {interval_s!r}")
        self._warm_interval = interval_s

    def _next(self) -> CompletionHandle | None:
        """The next queued request; while waiting for it within a burst, keep-warm replays."""
        idle_since = time.monotonic()  # the burst's window counts from the end of the last request
        while True:
            interval, last = self._warm_interval, self._last
            if interval is None or last is None or time.monotonic() - idle_since > WINDOW_S:
                return self._queue.get()
            try:
                return self._queue.get(timeout=interval)
            except queue.Empty:
                started = time.thread_time()
                try:
                    rehearse(last, self.cache, self.tokenizer)
                except Exception:  # a replay must never stop the engine thread
                    log.exception("keep-warm replay failed; replays stop")
                    self._warm_interval = None
                self._warm_busy_s += time.thread_time() - started
                with self._lock:
                    self._counters["warm_replays"] += 1

    def _loop(self) -> None:
        # A stopped request's result, published once the next request has shown its first text: publishing
        # wakes the stopped request's consumer, whose thread would take the interpreter while this one
        # starts the request the user now waits for (measured in docs/benchmarks.md). At most one waits:
        # it is put off only while a request is queued, and published when that request ends at the latest.
        pending: Callable[[], None] | None = None
        free_at = time.perf_counter()  # when the last request ended

        def flush() -> None:
            nonlocal pending
            if pending is not None:
                publish, pending = pending, None
                publish()

        def then_flush(publish: Callable[[TokenEvent], None]) -> Callable[[TokenEvent], None]:
            def emit(event: TokenEvent) -> None:
                publish(event)
                if event.text:
                    flush()

            return emit

        while (handle := self._next()) is not None:
            self._last = handle.request
            previous_end = free_at
            emit = handle._publish if pending is None else then_flush(handle._publish)
            try:
                result = generate(
                    handle.request,
                    self.runner,
                    self.cache,
                    self.tokenizer,
                    handle._cancel,
                    emit,
                    self.config.prefill_chunk,
                    handle.submitted_at,
                    launched=handle._mark_launched,
                    draft_tokens=self.draft_tokens,
                )
            except Exception as e:  # any failure of one request must not stop the engine thread
                log.exception("request failed")
                with self._lock:
                    self._counters["errors"] += 1
                handle._publish(
                    error=e if isinstance(e, EngineError) else EngineError(f"generation failed: {e}")
                )
                continue
            finally:
                free_at = time.perf_counter()
                handle._mark_launched()  # one that stopped before its first sample frees its submitter too
                flush()
            if handle.submitted_at < previous_end:
                stats = dataclasses.replace(result.stats, stopping_s=previous_end - handle.submitted_at)
                result = dataclasses.replace(result, stats=stats)
            s = result.stats
            with self._lock:
                c = self._counters
                c["completed" if s.stop_reason is not StopReason.CANCELLED else "cancelled"] += 1
                for key in ("prompt_tokens", "reused_tokens", "prefilled_tokens", "generated_tokens"):
                    c[key] += getattr(s, key)
                if s.ttft_s is not None:
                    self._ttfts.append(s.ttft_s)
            if s.stop_reason is StopReason.CANCELLED and not self._queue.empty():
                pending = functools.partial(handle._publish, result=result)
            else:
                handle._publish(result=result)
        flush()  # the queued item was the engine's close
