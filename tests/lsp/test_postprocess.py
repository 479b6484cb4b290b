"""Stop rules on streamed text: exact suggestions, the rule that fired, and text that only grows."""

from __future__ import annotations

import itertools

import pytest

from lsp_dscoder.postprocess import CursorContext, Shaper, StopRule


def shape(document: str, generated: str) -> tuple[str, StopRule, list[str]]:
    """Feed `generated` one character at a time at the `|` in `document`."""
    cursor = document.index("|")
    shaper = Shaper(CursorContext.at(document.replace("|", ""), cursor))
    shown = []
    for ch in generated:
        shaper.feed(ch)
        shown.append(shaper.text)
        if shaper.stopped:
            break
    shown.append(shaper.finish())
    return shaper.text, shaper.rule, shown


@pytest.mark.parametrize(
    ("document", "generated", "text", "rule"),
    [
        # Text to the right of the cursor: one line, without the closers the line already has.
        ("print(|)\n", "value, end='')\nx = 1\n", "value, end=''", StopRule.LINE_END),
        ("d = {'k': [|]}\n", "1, 2]}\n", "1, 2", StopRule.LINE_END),
        ("s = f(|) + 1\n", "x) * (y\n", "x) * (y", StopRule.LINE_END),
        # A body ends at a blank line once brackets are balanced...
        ("def f(x):\n    |", "return x + 1\n\ndef g():\n", "return x + 1", StopRule.BLANK_AFTER_BLOCK),
        ("def f():|\n", "\n    return 1\n\n", "\n    return 1", StopRule.BLANK_AFTER_BLOCK),
        # ...but not inside an open bracket.
        ("x = |", "[\n    1,\n\n    2,\n]\n\nz", "[\n    1,\n\n    2,\n]", StopRule.BLANK_AFTER_BLOCK),
        # Leaving the cursor's indentation scope.
        ("if a:\n    |\nz = 2\n", "b = 2\n    c = 3\nprint(c)\n", "b = 2\n    c = 3", StopRule.SCOPE_END),
        # A line equal to the suffix's next line.
        ("if a:\n    |\n    return b\n", "b = 1\n    return b\n", "b = 1", StopRule.REPEATS_SUFFIX),
        (
            "function f() {\n  |\n}\n",
            "let x = 1;\n  return x;\n}\n",
            "let x = 1;\n  return x;",
            StopRule.SCOPE_END,
        ),
        # Generation ended without a rule: the unterminated last line is judged too.
        ("def f():\n    |", "a = 1\n    b = 2", "a = 1\n    b = 2", StopRule.NONE),
        ("def f():\n    |", "a = 1\nb = 2", "a = 1", StopRule.SCOPE_END),
    ],
)
def test_stop_rules(document, generated, text, rule):
    got, got_rule, shown = shape(document, generated)
    assert (got, got_rule) == (text, rule)
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(shown))


@pytest.mark.parametrize("chunks", [["\r\n"], ["\r", "\n"]])
def test_a_crlf_line_end_is_a_line_end_and_no_stray_carriage_return_is_shown(chunks):
    # The first line ends the suggestion where the line has text to the cursor's right...
    document = "x = 1\r\ny = f(|)\r\n"
    shaper = Shaper(CursorContext.at(document.replace("|", ""), document.index("|")))
    for piece in ["g(b", *chunks, "z = 1"]:
        shaper.feed(piece)
        assert "\r" not in shaper.text
    assert shaper.text == "g(b" and shaper.finish() == "g(b"
    # ...and where it has none, later lines follow, every break an "\n".
    shaper = Shaper(CursorContext.at("def f(x):\r\n    ", 15))  # the end of the document
    shown = []
    for piece in ["if x:", *chunks, "        return 1", *chunks, *chunks, "def g():"]:
        shaper.feed(piece)
        shown.append(shaper.text)
    assert shaper.finish() == "if x:\n        return 1" and shaper.rule is StopRule.BLANK_AFTER_BLOCK
    assert all(b.startswith(a) for a, b in itertools.pairwise(shown)) and "\r" not in "".join(shown)


def test_a_suggestion_that_is_only_a_line_end_shows_nothing():
    for generated in ("\r\n", "\r"):
        shaper = Shaper(CursorContext.at("x = 1\r\ny = 2\r\n", 12))
        for ch in generated:
            shaper.feed(ch)
        assert shaper.finish() == ""


def test_emoji_and_cjk_pass_through_unchanged():
    text, rule, _ = shape("s = '|'\n", "😀 你好'\n")
    assert (text, rule) == ("😀 你好", StopRule.LINE_END)


def test_first_line_ready_waits_for_a_complete_non_blank_line():
    shaper = Shaper(CursorContext.at("def f():\n", 8))
    assert shaper.first_line_ready() is None
    for piece in ["\n", "    ret", "urn 1"]:
        shaper.feed(piece)
        assert shaper.first_line_ready() is None  # the first line is blank; the second still grows
    shaper.feed("\n    ")
    assert shaper.first_line_ready() == "\n    return 1"
    assert shaper.first_line_ready(skip=5) == "return 1"  # "\n    " typed through already
    assert not shaper.done


def test_first_line_ready_on_a_single_line_and_at_the_end():
    shaper = Shaper(CursorContext.at("f()\n", 2))
    shaper.feed("a, b")
    assert shaper.first_line_ready() is None
    shaper.feed(")\n")
    assert (shaper.first_line_ready(), shaper.done) == ("a, b", True)
    ended = Shaper(CursorContext.at("x = ", 4))
    ended.feed("1")
    ended.finish()
    assert ended.first_line_ready() == "1" and ended.first_line_ready(skip=1) == ""


def test_a_later_line_is_shown_as_soon_as_no_rule_can_reject_it():
    # The new line's indentation is final once it has text, and "ret" cannot become the next line.
    _, rule, shown = shape("def f(x):|\n    y = 1\n", "\n    return x\n\n")
    assert shown[:7] == ["", "", "", "", "", "\n    r", "\n    re"]
    assert rule is StopRule.BLANK_AFTER_BLOCK and shown[-1] == "\n    return x"
    # Held while it may still be the suffix's next line ("y = 1") or leave the scope.
    _, rule, shown = shape("def f(x):\n    a = 0|\n    y = 1\n", "\n    y = 1\n")
    assert set(shown) == {""} and rule is StopRule.REPEATS_SUFFIX
    _, _, shown = shape("def f(x):\n    a = 0|\nz = 2\n", "\n    y = 2\nq")
    assert "\n    y" in shown and not any(s.endswith("\nq") for s in shown)


def test_first_line_is_not_ready_while_the_shown_line_grows():
    shaper = Shaper(CursorContext.at("def f(x):\n", len("def f(x):")))
    for ch in "\n    return x":
        shaper.feed(ch)
    assert shaper.text == "\n    return x" and shaper.first_line_ready() is None
    shaper.feed("\n")
    assert shaper.first_line_ready() == "\n    return x"
