"""The training data format: cut points, DeepSeek-Coder's PSM layout inside packed windows, packing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lsp_dscoder.training.fim import (
    MAX_MIDDLE_LINES,
    MIN_PIECE_TOKENS,
    SpecialIds,
    char_split,
    encode_plain,
    fim_split,
    fim_windows,
    line_split,
    pack,
    split_pieces,
)

TEXT = "import os\n\n\ndef f(x):\n    return x + 1\n\n\nclass A:\n    y = f(2)\n    z = 'end'\n"
LINE_STARTS = {0, *(i + 1 for i, c in enumerate(TEXT) if c == "\n")}


def test_char_split_is_two_cuts_of_the_text() -> None:
    rng = random.Random(0)
    for _ in range(200):
        prefix, middle, suffix = char_split(TEXT, rng)
        assert prefix + middle + suffix == TEXT


def test_line_split_middle_starts_at_a_line_start_and_ends_in_one_of_three_ways() -> None:
    rng = random.Random(0)
    endings = set()
    for _ in range(400):
        prefix, middle, suffix = line_split(TEXT, rng)
        assert prefix + middle + suffix == TEXT
        assert len(prefix) in LINE_STARTS
        assert middle.count("\n") <= MAX_MIDDLE_LINES
        b = len(prefix) + len(middle)
        if b in LINE_STARTS and middle.endswith("\n"):
            endings.add("line start")
        elif suffix.startswith("\n"):
            endings.add("line end")
        else:
            endings.add("inside a line")
    assert endings == {"line start", "line end", "inside a line"}


def test_line_split_of_text_without_newline_keeps_the_whole_text() -> None:
    rng = random.Random(1)
    for _ in range(20):
        prefix, middle, suffix = line_split("x = 1", rng)
        assert prefix == ""
        assert middle + suffix == "x = 1"


def test_fim_split_line_rate_chooses_the_cut() -> None:
    rng = random.Random(2)
    assert all(len(fim_split(TEXT, rng, line_rate=1.0)[0]) in LINE_STARTS for _ in range(100))
    prefixes = {len(fim_split(TEXT, rng, line_rate=0.0)[0]) for _ in range(300)}
    assert prefixes - LINE_STARTS  # character cuts land inside lines too


def test_split_pieces_lengths() -> None:
    segment = np.arange(5000, dtype=np.uint16)
    pieces = split_pieces(segment, 1024, random.Random(3))
    assert np.array_equal(np.concatenate(pieces), segment)
    assert all(MIN_PIECE_TOKENS <= len(p) <= 1024 for p in pieces[:-1])
    assert 1 <= len(pieces[-1]) <= 1024
    assert split_pieces(segment, None, random.Random(3))[0] is segment
    assert len(split_pieces(segment[:100], 1024, random.Random(3))) == 1


def test_encode_plain_wraps_each_text_and_caches(tok, special: SpecialIds) -> None:
    cache: dict[str, np.ndarray] = {}
    first = encode_plain(tok, [TEXT, "x = 1\n"], special, cache)
    assert first[1].tolist() == [special.bos, *tok.encode("x = 1\n").ids, special.eos]
    assert first[0].dtype == np.uint16
    again = encode_plain(tok, ["x = 1\n", TEXT], special, cache)
    assert again[0] is first[1] and again[1] is first[0]
    assert set(cache) == {TEXT, "x = 1\n"}


def test_pack_cuts_the_stream_into_windows() -> None:
    docs = [np.arange(5, dtype=np.uint16), np.arange(10, 17, dtype=np.uint16)]
    windows = [w.tolist() for w in pack(docs, 4)]
    assert windows == [[0, 1, 2, 3], [4, 10, 11, 12], [13, 14, 15, 16]]


def _documents(tok, special: SpecialIds, texts: list[str], room: int = 0) -> np.ndarray:
    """The texts as packed documents, then `room` <eos> tokens for the transformed window to grow into."""
    padding = np.full(room, special.eos, dtype=np.uint16)
    return np.concatenate([*encode_plain(tok, texts, special), padding])


def _fim_parts(tok, special: SpecialIds, window: np.ndarray) -> list[tuple[str, str, str, int | None]]:
    """Each PSM example in the window: (prefix, suffix, middle, the token after the middle or None)."""
    found, ids = [], window.tolist()
    for begin in [i for i, t in enumerate(ids) if t == special.fim_begin]:
        hole = ids.index(special.fim_hole, begin)
        end = ids.index(special.fim_end, hole)
        stop = next((i for i in range(end + 1, len(ids)) if ids[i] < 5), None)
        middle = ids[end + 1 : stop]
        found.append(
            (
                tok.decode(ids[begin + 1 : hole]),
                tok.decode(ids[hole + 1 : end]),
                tok.decode(middle),
                None if stop is None else ids[stop],
            )
        )
    return found


def test_fim_windows_rate_zero_leaves_windows_unchanged(tok, special: SpecialIds) -> None:
    stream = _documents(tok, special, [TEXT, TEXT.upper()])
    windows = list(pack([stream], 16))
    out = fim_windows(tok, windows, special, random.Random(0), fim_rate=0.0)
    assert all(np.array_equal(a, b) for a, b in zip(out, windows, strict=True))


def test_fim_windows_psm_examples_restore_the_text(tok, special: SpecialIds) -> None:
    stream = _documents(tok, special, [TEXT, TEXT.replace("x", "value")], room=32)
    (window,) = pack([stream], len(stream))
    (out,) = fim_windows(tok, [window], special, random.Random(5), fim_rate=1.0)
    assert len(out) == len(window)
    examples = _fim_parts(tok, special, out)
    assert len(examples) == 2
    for (prefix, suffix, middle, after), text in zip(
        examples, [TEXT, TEXT.replace("x", "value")], strict=True
    ):
        assert prefix + middle + suffix == text
        assert after == special.eos
    # each document still starts with <bos> right before <｜fim▁begin｜>
    starts = [i for i, t in enumerate(out.tolist()) if t == special.fim_begin]
    assert all(out[i - 1] == special.bos for i in starts)


def test_fim_windows_pieces_are_separate_documents(tok, special: SpecialIds) -> None:
    text = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(60))
    tokens = len(tok.encode(text).ids)
    stream = _documents(tok, special, [text], room=tokens // 2)
    (window,) = pack([stream], len(stream))
    (out,) = fim_windows(tok, [window], special, random.Random(1), fim_rate=1.0, piece_tokens=100)
    assert len(out) == len(window)
    examples = _fim_parts(tok, special, out)
    assert tokens // 100 <= len(examples) <= tokens // MIN_PIECE_TOKENS + 1
    assert all(after == special.eos for _, _, _, after in examples)
    ids = out.tolist()
    assert all(ids[i - 1] == special.bos for i, t in enumerate(ids) if t == special.fim_begin)
    assert "".join(p + m + s for p, s, m, _ in examples) == text


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_fim_windows_keep_their_length(tok, special: SpecialIds, rate: float) -> None:
    stream = _documents(tok, special, [TEXT * 5, TEXT])
    windows = list(pack([stream], 64))
    out = fim_windows(tok, windows, special, random.Random(7), fim_rate=rate, piece_tokens=32)
    assert [len(w) for w in out] == [64] * len(windows)
    assert all(w.dtype == np.uint16 for w in out)
