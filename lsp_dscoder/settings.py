"""Typed server settings: defaults, the command line's overrides, and validation of what a client sends.

Clients send settings as `initializationOptions` and in `workspace/didChangeConfiguration`, either flat or
under a `"dscoder"` key, with camelCase names. Each bad value falls back to its default and yields one
message for `window/showMessage`; unknown names are reported the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lsp_dscoder.prompt_parts import Budgets

SECTION = "dscoder"


class ResponseMode(enum.Enum):
    """When the final inlineCompletion response is sent."""

    FIRST_LINE = "firstLine"  # once the first non-blank line is complete; decoding continues into the cache
    FULL = "full"  # once generation stops


class CompletionFallback(enum.Enum):
    """Whether `textDocument/completion` offers the suggestion as a completion item."""

    AUTO = "auto"  # only to clients that cannot show inline completions
    ALWAYS = "always"
    NEVER = "never"


class BackendKind(enum.Enum):
    """Where the tokens come from."""

    LOCAL = "local"  # the in-process engine
    REMOTE = "remote"  # an OpenAI-compatible /v1/completions endpoint (vLLM, SGLang, llama.cpp's server)


class RemotePrompt(enum.Enum):
    """How the remote endpoint gets the prompt."""

    TOKENS = "tokens"  # token ids, and the generated ids asked back (vLLM, llama.cpp's server)
    TEXT = "text"  # text with the FIM markers spelled out (any endpoint, e.g. SGLang)


class DType(enum.Enum):
    AUTO = "auto"  # float32 on cpu, bfloat16 on cuda
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


_BUDGETS = Budgets()  # the defaults


@dataclass(frozen=True)
class Settings:
    # Engine: changing any of these reloads the model.
    model: str | None = None  # checkpoint folder; None means the bundled model
    device: str = "auto"  # "auto" (cuda when available, else cpu), "cpu", "cuda" or "cuda:N"
    dtype: DType = DType.AUTO
    max_context: int = 4096  # KV cache length per slot, in tokens
    num_slots: int = 4  # documents whose KV stays cached (LRU)
    draft_tokens: int | None = None  # greedy draft tokens a step (engine/lookup.py); None: the engine's
    # Prompt budgets, in tokens: the fields of `prompt_parts.Budgets` (meanings and defaults there).
    context_tokens: int = _BUDGETS.context_tokens
    prefix_tokens: int = _BUDGETS.prefix_tokens
    suffix_tokens: int = _BUDGETS.suffix_tokens
    middle_tokens: int = _BUDGETS.middle_tokens
    anchor_lines: int = _BUDGETS.anchor_lines
    truncation_step_tokens: int = _BUDGETS.truncation_step_tokens
    context_files: int = 8  # at most this many other documents in the context
    # Decoding and responses.
    max_tokens: int = 128
    response_mode: ResponseMode = ResponseMode.FIRST_LINE
    debounce_ms: int = 0  # wait this long before submitting (0: no debounce)
    deadline_ms: int | None = None  # stop decoding this long after submission (None: no deadline)
    completion_fallback: CompletionFallback = CompletionFallback.AUTO
    keep_warm_ms: int = 5  # while typing, replay the last keystroke's server work this often (0: off)
    start_on_edit: bool = True  # start a keystroke's suggestion from its didChange, before the request
    # Backend: changing any of these reloads it. `model` still names the tokenizer for "remote".
    backend: BackendKind = BackendKind.LOCAL
    endpoint: str | None = None  # remote: http(s)://host:port of the serving engine
    remote_model: str | None = None  # remote: the served model's name (None: the first it lists)
    api_key_env: str | None = None  # remote: environment variable holding the API key (never logged)
    remote_prompt: RemotePrompt = RemotePrompt.TOKENS
    connect_timeout_ms: int = 2000  # remote: opening a connection
    first_token_timeout_ms: int = 10_000  # remote: from the request to the first streamed chunk
    read_timeout_ms: int = 5000  # remote: between two streamed chunks
    remote_request: Mapping[str, Any] | None = None  # remote: more body fields, e.g. {"top_k": 1}

    ENGINE_FIELDS = (
        "model", "device", "dtype", "max_context", "num_slots", "draft_tokens", "backend", "endpoint",
        "remote_model", "api_key_env", "remote_prompt", "connect_timeout_ms", "first_token_timeout_ms",
        "read_timeout_ms", "remote_request",
    )  # fmt: skip

    def engine_key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.ENGINE_FIELDS)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected an integer in [{low}, {high}], got {value!r}")
        return value

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _enum(kind: type[enum.Enum]) -> Callable[[Any], enum.Enum]:
    def check(value: Any) -> enum.Enum:
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(e.value) for e in kind)
            raise ValueError(f"expected one of {allowed}, got {value!r}") from None

    return check


def _text(pattern: str, expected: str) -> Callable[[Any], str]:
    """A string that `pattern` matches as a whole."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise ValueError(f"expected {expected}, got {value!r}")
        return value

    return check


def _endpoint(value: Any) -> str:
    """An http(s)://host[:port][/prefix] URL that the remote backend can connect to (its port in range, an
    IPv6 host in brackets): checked here, with the other settings, not at the first connection."""
    from lsp_dscoder.remote_http import Endpoint  # torch-free, like this module

    checked: str = _text(r"https?://[^/?#@\s]+(/[^?#\s]*)?", "an http(s)://host:port URL")(value)
    Endpoint.parse(checked)
    return checked


def _json_object(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"expected an object of request fields, got {value!r}")
    return dict(value)


_NOT_BLANK = r"(?s).*\S.*"

_CHECKS: dict[str, Callable[[Any], Any]] = {
    "model": _optional(_text(_NOT_BLANK, "a folder path")),
    "device": _text(r"auto|cpu|cuda(:\d+)?", "'auto', 'cpu', 'cuda' or 'cuda:N'"),
    "dtype": _enum(DType),
    "max_context": _int_in(64, 1 << 20),
    "num_slots": _int_in(1, 64),
    "draft_tokens": _optional(_int_in(0, 7)),
    "context_tokens": _int_in(0, 1 << 20),
    "prefix_tokens": _int_in(0, 1 << 20),
    "suffix_tokens": _int_in(0, 1 << 20),
    "middle_tokens": _int_in(8, 1 << 16),
    "anchor_lines": _int_in(0, 1000),
    "truncation_step_tokens": _int_in(1, 1 << 20),
    "context_files": _int_in(0, 256),
    "max_tokens": _int_in(1, 1 << 16),
    "response_mode": _enum(ResponseMode),
    "debounce_ms": _int_in(0, 10_000),
    "deadline_ms": _optional(_int_in(1, 3_600_000)),
    "completion_fallback": _enum(CompletionFallback),
    "keep_warm_ms": _int_in(0, 1000),
    "start_on_edit": _bool,
    "backend": _enum(BackendKind),
    "endpoint": _optional(_endpoint),
    "remote_model": _optional(_text(_NOT_BLANK, "a model name")),
    "api_key_env": _optional(_text(r"[A-Za-z_][A-Za-z0-9_]*", "the name of an environment variable")),
    "remote_prompt": _enum(RemotePrompt),
    "connect_timeout_ms": _int_in(1, 600_000),
    "first_token_timeout_ms": _int_in(1, 600_000),
    "read_timeout_ms": _int_in(1, 600_000),
    "remote_request": _optional(_json_object),
}
_BY_CAMEL = {_camel(name): name for name in _CHECKS}
DEFAULTS = Settings()


def section(raw: Any) -> Mapping[str, Any]:
    """The settings object out of what a client sent: `{"dscoder": {...}}`, flat `{...}`, or nothing."""
    if not isinstance(raw, Mapping):
        return {}
    inner = raw.get(SECTION)
    return inner if isinstance(inner, Mapping) else raw


def parse(raw: Any, base: Settings = DEFAULTS, refuse: bool = False) -> tuple[Settings, list[str]]:
    """Apply the client's values over `base`. Returns the settings and one message per rejected value; a
    rejected value keeps `base`'s (the command line's, or the default), which the message names unless
    `refuse` (the command line itself: its caller stops)."""
    values = section(raw)
    changes: dict[str, Any] = {}
    problems: list[str] = []
    if isinstance(raw, Mapping) and SECTION in raw and not isinstance(raw[SECTION], Mapping):
        got = (
            json.dumps(raw[SECTION]) if isinstance(raw[SECTION], (str, int, float, bool)) else "another type"
        )
        problems.append(f"dscoder: the '{SECTION}' settings must be an object, got {got}; ignored")
        values = {}
    for key, value in values.items():
        name = _BY_CAMEL.get(key)
        if name is None:
            problems.append(f"dscoder: unknown setting {key!r} ignored")
            continue
        try:
            changes[name] = _CHECKS[name](value)
        except ValueError as exc:
            kept = getattr(base, name)
            source = "the default" if kept == getattr(DEFAULTS, name) else "the command line's"
            shown = json.dumps(kept.value if isinstance(kept, enum.Enum) else kept)
            problems.append(
                f"dscoder: setting {key!r}: {exc}" + ("" if refuse else f"; using {source} {shown}")
            )
            changes[name] = kept
    settings = dataclasses.replace(base, **changes)
    if (room := prompt_room(settings)) < MIN_PROMPT_TOKENS:
        # Back to the values before this change (the command line's, or the last good ones).
        fallback = base if prompt_room(base) >= MIN_PROMPT_TOKENS else DEFAULTS
        problems.append(_too_small(settings, room, fallback))
        settings = dataclasses.replace(settings, **{n: getattr(fallback, n) for n in _ROOM_FIELDS})
    return settings, problems


# A prompt needs room for its FIM markers and some text: below this, completion could never work.
MIN_PROMPT_TOKENS = 64
_ROOM_FIELDS = ("max_context", "max_tokens", "middle_tokens")


def prompt_room(s: Settings) -> int:
    """Tokens left in the context for the prompt's head (context, prefix, suffix): what the prompt
    builder scales its budgets into (`Budgets.fit`)."""
    return Budgets.of(s).room(s.max_context, s.max_tokens)


def _too_small(s: Settings, room: int, fallback: Settings) -> str:
    need = s.max_tokens + s.middle_tokens + 4 + MIN_PROMPT_TOKENS
    shown = ", ".join(f"{_camel(n)} {getattr(fallback, n)}" for n in _ROOM_FIELDS)
    return (
        f"dscoder: settings maxContext {s.max_context}, maxTokens {s.max_tokens}, middleTokens "
        f"{s.middle_tokens} leave {room} tokens for the prompt: maxContext must be at least "
        f"maxTokens + middleTokens + {4 + MIN_PROMPT_TOKENS} ({need}); using {shown}"
    )


def to_json(settings: Settings) -> dict[str, Any]:
    """The settings as a client would write them (camelCase, enum values)."""
    out = {}
    for name in _CHECKS:
        value = getattr(settings, name)
        out[_camel(name)] = value.value if isinstance(value, enum.Enum) else value
    return out
