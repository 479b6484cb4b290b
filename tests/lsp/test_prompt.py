"""The FIM prompt with the tiny checkpoint's real tokenizer: layout, append-only typing, anchor moves,
coarse truncation, context files, and reuse of generated tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lsp_dscoder.prompt import Budgets, ContextFile, PromptBuilder
from lsp_dscoder.tokens import Piece, cut_known, pieces_of, safe_boundary

SOURCE = "import os\n\ndef main(args):\n    \n    return 0\n"
CURSOR = SOURCE.index("\n    return")  # end of the blank, indented line


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def type_text(builder: PromptBuilder, text: str, cursor: int, typed: str, prompt):
    """Type `typed` at the cursor one character at a time; yields (prompt, text, cursor) per key."""
    for ch in typed:
        text, cursor = text[:cursor] + ch + text[cursor:], cursor + 1
        prompt = builder.build(text, cursor, head=prompt.head, known=prompt.middle_pieces)
        yield prompt, text, cursor


def test_layout_is_psm_with_the_middle_from_the_anchor(tokenizer):
    p = PromptBuilder(tokenizer, Budgets(), heal=False).build(SOURCE, CURSOR)
    t = tokenizer
    anchor = SOURCE.rindex("\n", 0, CURSOR) + 1
    head = [t.bos_id, t.fim_begin_id, *t.encode(SOURCE[:anchor]), t.fim_hole_id]
    expected = (*head, *t.encode(SOURCE[CURSOR:]), t.fim_end_id, *t.encode("    "))
    assert tuple(p.ids) == expected
    assert (p.head.anchor, p.middle, p.head_reused) == (anchor, "    ", False)
    assert "".join(piece.text for piece in p.middle_pieces) == "    "
    assert p.heal_text == ""
    # With token healing (the default), the indentation has no safe boundary after the anchor: the
    # prompt ends at <｜fim▁end｜> and the model spells "    " itself.
    healed = PromptBuilder(tokenizer, Budgets()).build(SOURCE, CURSOR)
    assert tuple(healed.ids) == expected[: len(p.head.ids)] == tuple(healed.head.ids)
    assert (healed.middle, healed.heal_text, healed.middle_pieces) == ("    ", "    ", ())


def test_typing_keeps_the_head_and_changes_only_the_last_tokens(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets(), heal=False)
    first = builder.build(SOURCE, CURSOR)
    prev = first
    new_tokens = []
    for p, text, cursor in type_text(builder, SOURCE, CURSOR, "value = args", first):
        assert p.head_reused and p.head is first.head
        assert p.ids[: len(first.head.ids)] == first.head.ids
        assert p.middle == text[first.head.anchor : cursor]
        assert tokenizer.decode(p.ids[len(first.head.ids) :]) == p.middle
        new_tokens.append(len(p.ids) - common_prefix(prev.ids, p.ids))
        prev = p
    # "    " was one token; "    v" is "   " + " " + "v". Then one new or re-merged token per key.
    assert new_tokens == [3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]


def test_anchor_moves_when_the_cursor_leaves_the_region(tokenizer):
    builder = PromptBuilder(tokenizer, replace(Budgets(), anchor_lines=1))
    first = builder.build(SOURCE, CURSOR)
    text = SOURCE[:CURSOR] + "a\n    b" + SOURCE[CURSOR:]
    one_below = builder.build(text, CURSOR + 7, head=first.head)
    assert one_below.head_reused and one_below.middle == "    a\n    b"
    text = text[: CURSOR + 7] + "\n    c" + text[CURSOR + 7 :]
    two_below = builder.build(text, CURSOR + 13, head=first.head)
    assert not two_below.head_reused
    assert two_below.middle == "    c" and two_below.head.anchor == CURSOR + 8
    # Moving the cursor back up (text after the cursor changes) moves the anchor too.
    up = builder.build(text, 3, head=two_below.head)
    assert not up.head_reused and (up.head.anchor, up.middle) == (0, "imp")


def test_middle_past_its_bound_moves_the_anchor(tokenizer):
    builder = PromptBuilder(tokenizer, replace(Budgets(), middle_tokens=8, anchor_lines=10))
    first = builder.build(SOURCE, CURSOR)
    text, cursor = SOURCE, CURSOR
    for line in ("x = 1", "y = 2", "z = 3"):
        text = text[:cursor] + line + "\n    " + text[cursor:]
        cursor += len(line) + 5
    p = builder.build(text, cursor, head=first.head)
    assert not p.head_reused and p.middle == "    " and p.head.anchor == cursor - 4


def test_prefix_truncation_moves_in_coarse_steps(tokenizer):
    lines = [f"value_{i} = compute({i}, args)\n" for i in range(200)]
    text = "".join(lines)
    builder = PromptBuilder(tokenizer, replace(Budgets(), prefix_tokens=300, truncation_step_tokens=150))
    head, starts, kept = None, [], 0
    for anchor_line in range(100, 140):  # the anchor moves down one line at a time
        cursor = sum(len(line) for line in lines[:anchor_line])
        new = builder.build(text, cursor, head=head).head
        prefix = tokenizer.decode(new.ids[2 : 2 + new.prefix_tokens])
        assert text[new.prefix_start : cursor] == prefix and 0 < new.prefix_tokens <= 300
        assert text[new.prefix_start - 1] == "\n"  # whole lines
        if head is not None and new.prefix_start == head.prefix_start:
            kept += 1  # the old prompt up to the old anchor is a prefix of the new one
            assert new.ids[: len(head.ids) - head.suffix_tokens - 2] == head.ids[: -head.suffix_tokens - 2]
        starts.append(new.prefix_start)
        head = new
    # A fresh cut uses ~150 of 300 tokens (7 of these 22-token lines), so it holds for ~7 anchor moves.
    assert len(set(starts)) <= 40 // 6 + 1 and kept >= 33


def test_suffix_and_huge_lines_stay_within_budget(tokenizer):
    budgets = replace(Budgets(), prefix_tokens=64, suffix_tokens=32, middle_tokens=16)
    huge = "x = [" + ", ".join(str(i) for i in range(5000)) + "]\n"
    text = huge + huge
    p = PromptBuilder(tokenizer, budgets).build(text, len(huge) - 100)
    assert p.head.anchor == len(huge) - 100 and p.middle == ""  # anchor at the cursor inside the line
    assert 0 < p.head.prefix_tokens <= 64 and p.head.suffix_tokens <= 32
    assert len(p.ids) <= 4 + 64 + 32


def test_context_files_in_path_order_with_headers_within_budget(tokenizer):
    b = ContextFile("b.py", "def helper():\n    return 2\n", "python", ("file:///b.py", 1))
    a = ContextFile("a.py", "A = 1", "python", ("file:///a.py", 3))
    builder = PromptBuilder(tokenizer, replace(Budgets(), context_tokens=200))
    p = builder.build(SOURCE, CURSOR, lambda: [b, a], "python")
    context = tokenizer.decode(p.ids[2 : 2 + p.head.context_tokens])
    assert context == "# a.py\nA = 1\n# b.py\ndef helper():\n    return 2\n"
    again = PromptBuilder(tokenizer, replace(Budgets(), context_tokens=200)).build(
        SOURCE, CURSOR, lambda: [a, b], "python"
    )
    assert again.ids == p.ids
    small = PromptBuilder(tokenizer, replace(Budgets(), context_tokens=12)).build(
        SOURCE, CURSOR, lambda: [a, b], "javascript"
    )
    assert tokenizer.decode(small.ids[2 : 2 + small.head.context_tokens]) == "// a.py\nA = 1\n"


def test_a_crlf_document_reads_to_the_model_as_its_lf_twin(tokenizer):
    """The text around the edit reaches the model with \n line ends, whatever the document's: the same
    prompt ids as the LF document (the middle, on the cursor's line, has no line end), while the head
    keeps the document's own offsets, so typing on extends it as before."""
    crlf = SOURCE.replace("\n", "\r\n")
    other = ContextFile("b.py", "def helper():\r\n    return 2\r\n", "python", ("file:///b.py", 1))
    builder = PromptBuilder(tokenizer, replace(Budgets(), context_tokens=64))
    want = builder.build(SOURCE, CURSOR, lambda: [replace(other, text=other.text.replace("\r\n", "\n"))])
    got = PromptBuilder(tokenizer, replace(Budgets(), context_tokens=64)).build(
        crlf, crlf.index("\r\n    return"), lambda: [other]
    )
    assert got.ids == want.ids and "\r" not in tokenizer.decode(got.ids)
    assert got.head.anchor == crlf.rindex("\n", 0, crlf.index("\r\n    return")) + 1
    for (p, *_), (q, *_) in zip(
        type_text(builder, SOURCE, CURSOR, "return", want),
        type_text(builder, crlf, crlf.index("\r\n    return"), "return", got),
        strict=True,
    ):
        assert p.ids == q.ids and q.head_reused


def test_context_is_read_only_when_the_head_is_rebuilt(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets())
    calls = []
    first = builder.build(SOURCE, CURSOR, lambda: calls.append(1) or [])
    text = SOURCE[:CURSOR] + "x" + SOURCE[CURSOR:]
    builder.build(text, CURSOR + 1, lambda: calls.append(2) or [], head=first.head)
    assert calls == [1]


def test_accepting_generated_tokens_needs_no_new_tokens(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets(), heal=False)
    p = builder.build(SOURCE, CURSOR)
    # The model spelled "return args" one character per token: not how the tokenizer would.
    generated = [Piece(tokenizer.encode(c)[0], c) for c in "return args"]
    assert [x.token_id for x in generated] != tokenizer.encode("return args")
    text = SOURCE[:CURSOR] + "return args" + SOURCE[CURSOR:]
    accepted = builder.build(text, CURSOR + 11, head=p.head, known=[*p.middle_pieces, *generated])
    assert tuple(accepted.ids) == (*p.ids, *(x.token_id for x in generated))
    assert accepted.known_reused == len(p.middle_pieces) + 11


def test_known_tokens_are_kept_only_up_to_a_safe_boundary(tokenizer):
    known = [Piece(tokenizer.encode(c)[0], c) for c in "foo(bar"]
    pieces, kept = cut_known(tokenizer, "foo(barz", known)
    assert kept == 4  # "foo(" : "(" | "b" is a split the pre-tokenizer always makes; "bar" | "z" is not
    assert [p.token_id for p in pieces] == [x.token_id for x in known[:4]] + tokenizer.encode("barz")
    assert [safe_boundary("a b", i) for i in range(4)] == [True, True, False, True]
    assert [safe_boundary("x(y", i) for i in range(4)] == [True, True, True, True]
    assert not safe_boundary("x  y", 2) and not safe_boundary("\n    y", 1)


def test_pieces_of_emoji_and_cjk_give_the_character_to_the_last_byte(tokenizer):
    text = "s = '😀你'"
    pieces = pieces_of(tokenizer, text, tokenizer.encode(text))
    assert "".join(p.text for p in pieces) == text
    assert [p.text for p in pieces if p.text in ("😀", "你")] == ["😀", "你"]
    assert pieces[[p.text for p in pieces].index("😀") - 1].text == ""


def test_budgets_fit_the_context(tokenizer):
    fitted = Budgets().fit(max_context=1024, max_tokens=128)
    total = fitted.context_tokens + fitted.prefix_tokens + fitted.suffix_tokens
    assert total + fitted.middle_tokens + 128 + 4 <= 1024
    assert fitted.prefix_tokens > fitted.suffix_tokens > 0
    assert Budgets().fit(max_context=8192, max_tokens=128) == Budgets()
    with pytest.raises(ValueError, match="max_context 256"):
        Budgets().fit(max_context=256, max_tokens=128)


def test_known_pieces_that_do_not_spell_their_tokens_are_not_reused(tokenizer):
    # Text reported against the wrong token (e.g. held back by a stop string) must not reach the prompt.
    ids = tokenizer.encode("a y")
    known = [Piece(ids[0], "a"), Piece(ids[1], " "), Piece(ids[2], "x")]
    pieces, kept = cut_known(tokenizer, "a x", known)
    assert kept == 0 and [p.token_id for p in pieces] == tokenizer.encode("a x")


def test_token_healing_leaves_the_last_word_to_the_model(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets())
    first = builder.build(SOURCE, CURSOR)
    prompts = [first, *(p for p, _, _ in type_text(builder, SOURCE, CURSOR, "value = args", first))]
    heals = [p.heal_text for p in prompts]
    # The indentation alone is healed whole; then only the word with its space, not the indentation.
    word = [" v", " va", " val", " valu", " value"]
    assert heals == ["    ", *word, " ", " =", " ", " a", " ar", " arg", " args"]
    for p in prompts:
        assert p.head is first.head
        kept = p.middle[: len(p.middle) - len(p.heal_text)]
        assert p.middle == kept + p.heal_text
        assert tuple(p.ids) == (*first.head.ids, *tokenizer.encode(kept))
        assert "".join(piece.text for piece in p.middle_pieces) == kept
    # The prompt changes only when the cursor passes a word: typing a word appends nothing.
    ids = [tuple(p.ids) for p in prompts]
    assert ids[1] == ids[2] == ids[5] == (*first.head.ids, *tokenizer.encode("   "))
    assert ids[6] == ids[7] and ids[8] == ids[9] == ids[12]
    assert len({ids[0], ids[1], ids[6], ids[8]}) == 4


def test_indentation_is_healed_from_the_line_start_whenever_it_was_typed(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets())
    text = "class P:\n    def __init__(self, x):\n"
    at_newline = builder.build(text + "\n", len(text))
    indented = builder.build(text + "        \n", len(text) + 8)
    assert (at_newline.heal_text, indented.heal_text) == ("", "        ")
    assert indented.ids == at_newline.ids  # the same prompt: the model spells the indentation itself
    # With the head of an earlier keystroke (the anchor lines above), the prompt still ends at the
    # line start.
    earlier = builder.build(text[:-1] + "\n", len(text) - 1)
    reused = builder.build(text + "        \n", len(text) + 8, head=earlier.head)
    assert reused.head_reused and reused.heal_text == "        "
    assert tokenizer.decode(reused.ids[len(earlier.head.ids) :]) == reused.middle[:-8]
    assert reused.middle.endswith(":\n        ")


def test_token_healing_reuses_generated_tokens_up_to_the_healed_text(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets())
    p = builder.build(SOURCE, CURSOR)
    generated = [Piece(tokenizer.encode(c)[0], c) for c in "    return args"]
    text = SOURCE[:CURSOR] + "return args" + SOURCE[CURSOR:]
    accepted = builder.build(text, CURSOR + 11, head=p.head, known=[*p.middle_pieces, *generated])
    assert accepted.heal_text == " args"
    assert tuple(accepted.ids) == (*p.ids, *(x.token_id for x in generated[:10]))  # "    return"
    assert accepted.known_reused == 10


def test_healing_is_short_ascii_text_on_one_line(tokenizer):
    builder = PromptBuilder(tokenizer, Budgets())
    heals = {m: builder.build(m, len(m)).heal_text for m in ("x", "self.va", "x = ", "f(a, b", "x\n    y")}
    assert heals == {"x": "x", "self.va": "va", "x = ": " ", "f(a, b": " b", "x\n    y": " y"}
    assert builder.build('s = "é', 7).heal_text == ""  # not ASCII: nothing healed
    long_word = "    " + "a" * 40
    assert builder.build(long_word, len(long_word)).heal_text == ""  # no safe boundary within 32
    from lsp_dscoder.prompt import heal_start

    assert [heal_start(m) for m in ("", "x", "    ", "self.va", "x = ", "f(a, b")] == [0, 0, 0, 5, 3, 4]


class CountingTokenizer:
    """The real tokenizer, counting the characters it is given to encode."""

    def __init__(self, inner) -> None:
        self.inner, self.chars = inner, 0
        self.bos_id, self.fim_begin_id = inner.bos_id, inner.fim_begin_id
        self.fim_hole_id, self.fim_end_id = inner.fim_hole_id, inner.fim_end_id

    def encode(self, text: str) -> list[int]:
        self.chars += len(text)
        return self.inner.encode(text)

    def decode(self, ids) -> str:
        return self.inner.decode(ids)


@pytest.mark.parametrize(
    "document",
    [
        "x = [" + ", ".join(str(i % 1000) for i in range(1_000_000)) + "]\n",  # ~5 MB on one line
        "".join(f"value_{i} = compute({i})\n" for i in range(200_000)),  # 200k lines
    ],
    ids=["5MB-line", "200k-lines"],
)
def test_prompt_work_is_bounded_by_the_budget_not_the_document(tokenizer, document):
    budgets = Budgets(context_tokens=64, prefix_tokens=256, suffix_tokens=128, middle_tokens=64)
    # What the budgets let the builder look at: 8 characters per budgeted token (prefix + middle
    # before the cursor, suffix after it, context per file), each part tokenised a small number of times.
    window = 8 * (budgets.prefix_tokens + budgets.middle_tokens + budgets.suffix_tokens)
    counting = CountingTokenizer(tokenizer)
    builder = PromptBuilder(counting, budgets)
    other = ContextFile("big.py", document, "python", ("file:///big.py", 1))
    for cursor in (len(document) // 2, 7, len(document) - 3):
        counting.chars = 0
        p = builder.build(document, cursor, lambda: [other], "python")
        assert counting.chars <= 6 * window, (cursor, counting.chars)
        assert p.head.prefix_tokens <= 256 and p.head.suffix_tokens <= 128 and p.head.context_tokens <= 64
        # The next keystroke reuses the head: only the middle is tokenised again.
        typed = document[:cursor] + "z" + document[cursor:]
        counting.chars = 0
        again = builder.build(typed, cursor + 1, head=p.head, known=p.middle_pieces)
        assert again.head_reused and counting.chars <= 8 * budgets.middle_tokens
