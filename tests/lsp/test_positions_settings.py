"""Positions in every negotiated encoding (emoji, CJK, CRLF, lone surrogates) and settings validation."""

from __future__ import annotations

import pytest

from lsp_dscoder.errors import PositionError
from lsp_dscoder.positions import Encoding, offset_at, position_at, sanitize
from lsp_dscoder.settings import DEFAULTS, CompletionFallback, ResponseMode, Settings, parse, to_json

TEXT = "a😀b你c\r\nx\rend"


@pytest.mark.parametrize(
    ("encoding", "units_before_c"),
    [(Encoding.UTF16, 5), (Encoding.UTF8, 9), (Encoding.UTF32, 4)],
)
def test_offsets_of_emoji_and_cjk(encoding, units_before_c):
    c = TEXT.index("c")
    assert offset_at(TEXT, 0, units_before_c, encoding) == c
    assert position_at(TEXT, c, encoding) == (0, units_before_c)
    for offset in range(len(TEXT) + 1):
        if TEXT[offset - 1 : offset + 1] == "\r\n":
            continue  # between \r and \n is not a position
        line, character = position_at(TEXT, offset, encoding)
        assert offset_at(TEXT, line, character, encoding) == offset


def test_line_breaks_past_the_end_and_inside_a_character():
    assert offset_at(TEXT, 1, 0, Encoding.UTF16) == TEXT.index("x")
    assert offset_at(TEXT, 2, 0, Encoding.UTF16) == TEXT.index("end")
    assert offset_at(TEXT, 0, 99, Encoding.UTF16) == TEXT.index("\r")  # clamped to the line end
    assert offset_at(TEXT, 0, 2, Encoding.UTF16) == 1  # inside the surrogate pair: before the emoji
    assert offset_at("a\n", 1, 0, Encoding.UTF16) == 2  # the empty last line exists
    with pytest.raises(PositionError, match="line 3 is past the end of the document \\(3 lines\\)"):
        offset_at(TEXT, 3, 0, Encoding.UTF16)
    with pytest.raises(PositionError):
        offset_at(TEXT, 0, -1, Encoding.UTF16)


def test_sanitize_replaces_lone_surrogates_keeping_offsets():
    text = "a\ud800b\udfffc😀"
    clean = sanitize(text)
    assert clean == "a\ufffdb\ufffdc😀" and len(clean) == len(text)
    assert clean.encode("utf-8")
    assert sanitize("plain") == "plain"


def test_encoding_parse():
    assert Encoding.parse("utf-8") is Encoding.UTF8
    assert Encoding.parse(None) is Encoding.UTF16
    assert Encoding.parse("ucs-2") is Encoding.UTF16


def test_settings_defaults_and_values():
    assert DEFAULTS.debounce_ms == 0 and DEFAULTS.response_mode is ResponseMode.FIRST_LINE
    assert DEFAULTS.model is None and DEFAULTS.deadline_ms is None
    raw = {"dscoder": {"maxTokens": 32, "responseMode": "full", "device": "cuda:1", "deadlineMs": None}}
    settings, problems = parse(raw)
    assert problems == []
    assert (settings.max_tokens, settings.response_mode, settings.device) == (
        32,
        ResponseMode.FULL,
        "cuda:1",
    )
    flat, _ = parse({"maxContext": 2048, "model": "/models/ds"})
    assert (flat.max_context, flat.model) == (2048, "/models/ds")
    assert parse(None) == (DEFAULTS, [])
    assert to_json(settings)["responseMode"] == "full" and to_json(DEFAULTS)["debounceMs"] == 0


def test_bad_settings_fall_back_to_the_base_with_a_message():
    base = Settings(max_tokens=7)
    settings, problems = parse(
        {
            "maxTokens": -3,
            "responseMode": "all",
            "debounceMs": True,
            "numSlots": 2,
            "device": "gpu",
            "colour": 1,
        },
        base,
    )
    assert (settings.max_tokens, settings.response_mode, settings.num_slots) == (
        7,
        ResponseMode.FIRST_LINE,
        2,
    )
    assert problems == [
        "dscoder: setting 'maxTokens': expected an integer in [1, 65536], got -3; using the command line's 7",
        "dscoder: setting 'responseMode': expected one of 'firstLine', 'full', got 'all'; "
        'using the default "firstLine"',
        "dscoder: setting 'debounceMs': expected an integer in [0, 10000], got True; using the default 0",
        "dscoder: setting 'device': expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'; "
        'using the default "auto"',
        "dscoder: unknown setting 'colour' ignored",
    ]


def test_a_bad_value_keeps_the_command_lines_and_the_command_line_itself_is_refused():
    cli, problems = parse({"numSlots": 2, "maxContext": 2048, "dtype": "float16"}, refuse=True)
    assert problems == []
    settings, problems = parse({"numSlots": 1000, "maxContext": "big", "maxTokens": 0}, cli)
    assert (settings.num_slots, settings.max_context, settings.max_tokens) == (2, 2048, 128)
    assert problems == [
        "dscoder: setting 'numSlots': expected an integer in [1, 64], got 1000; using the command line's 2",
        "dscoder: setting 'maxContext': expected an integer in [64, 1048576], got 'big'; "
        "using the command line's 2048",
        "dscoder: setting 'maxTokens': expected an integer in [1, 65536], got 0; using the default 128",
    ]
    assert parse({"numSlots": 0}, refuse=True)[1] == [
        "dscoder: setting 'numSlots': expected an integer in [1, 64], got 0"
    ]


def test_a_settings_section_that_is_not_an_object_is_refused_as_a_whole():
    assert parse({"dscoder": 5}) == (
        DEFAULTS,
        ["dscoder: the 'dscoder' settings must be an object, got 5; ignored"],
    )
    assert parse({"dscoder": {"maxTokens": 7}})[0].max_tokens == 7


def test_an_endpoint_the_remote_backend_cannot_connect_to_is_refused_with_the_settings():
    assert parse({"endpoint": "http://gpu-box:8000/v1"}) == (Settings(endpoint="http://gpu-box:8000/v1"), [])
    assert parse({"endpoint": "http://127.0.0.1:99999"}, refuse=True)[1] == [
        "dscoder: setting 'endpoint': expected an http(s)://host[:port] URL, got 'http://127.0.0.1:99999': "
        "Port out of range 0-65535"
    ]
    assert parse({"endpoint": "http://[::1:80"}, refuse=True)[1][0].endswith("Invalid IPv6 URL")


def test_completion_fallback_setting():
    assert DEFAULTS.completion_fallback is CompletionFallback.AUTO
    settings, problems = parse({"completionFallback": "never"})
    assert settings.completion_fallback is CompletionFallback.NEVER and problems == []
    settings, problems = parse({"completionFallback": "sometimes"})
    assert settings.completion_fallback is CompletionFallback.AUTO
    assert problems == [
        "dscoder: setting 'completionFallback': expected one of 'auto', 'always', 'never', got 'sometimes'; "
        'using the default "auto"'
    ]


def test_a_context_too_small_for_the_prompt_falls_back_with_the_reason():
    base = Settings(max_context=1024)
    settings, problems = parse({"maxContext": 256}, base)
    assert (settings.max_context, settings.max_tokens, settings.middle_tokens) == (1024, 128, 256)
    assert problems == [
        "dscoder: settings maxContext 256, maxTokens 128, middleTokens 256 leave -132 tokens for the prompt: "
        "maxContext must be at least maxTokens + middleTokens + 68 (452); using maxContext 1024, maxTokens "
        "128, middleTokens 256"
    ]
    fits, problems = parse({"maxContext": 452}, base)  # exactly enough room
    assert (fits.max_context, problems) == (452, [])
    small, problems = parse({"maxContext": 128, "maxTokens": 16, "middleTokens": 8})
    assert (small.max_context, problems) == (128, [])
    # A base that does not fit either (a bad command line) falls back to the defaults.
    settings, problems = parse({"maxTokens": 900}, Settings(max_context=300))
    assert (settings.max_context, settings.max_tokens) == (4096, 128) and len(problems) == 1
