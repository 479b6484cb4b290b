"""`lsp-dscoder complete` as a user runs it: a real process, real checkpoint, JSON and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.positions import Encoding, offset_at
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.prompt import Budgets, PromptBuilder

SOURCE = 'import os\n\ndef main():\n    s = "😀你好"\n    return s\n'


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lsp_dscoder", *args], capture_output=True, text=True, timeout=120
    )


def test_complete_json_matches_engine_on_same_prompt(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "sample.py"
    src.write_text(SOURCE, encoding="utf-8")
    # line 3, UTF-16 column 11: after `    s = "😀` (the emoji counts 2 units)
    args = (
        "complete",
        str(src),
        "--line",
        "3",
        "--col",
        "11",
        "--max-tokens",
        "6",
        "--json",
        "--model",
        str(tiny_model),
    )
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert set(got) == {"text", "token_ids", "stats"}
    cursor = offset_at(SOURCE, 3, 11, Encoding.UTF16)
    assert SOURCE[:cursor].endswith('s = "😀')
    with Engine(EngineConfig(model=tiny_model, max_context=4096)) as eng:
        prompt = PromptBuilder(eng.tokenizer, Budgets().fit(4096, 6)).build(SOURCE, cursor)
        request = CompletionRequest(
            prompt_ids=prompt.ids, params=SamplingParams(max_tokens=6), heal_text=prompt.heal_text
        )
        ref = eng.complete(request)
    shaper = Shaper(CursorContext.at(SOURCE, cursor))
    shaper.feed(ref.text)
    assert got["text"] == shaper.finish()  # the editor's stop rules applied to the same tokens
    assert got["stats"]["stop_rule"] == shaper.rule.value
    assert got["token_ids"] == list(ref.token_ids[: len(got["token_ids"])])
    if shaper.rule.value == "none":
        assert got["token_ids"] == list(ref.token_ids)
        assert got["stats"]["stop_reason"] in ("max_tokens", "eos")
    assert got["stats"]["prompt_tokens"] == len(prompt.ids)
    raw = cli(*args, "--raw")
    assert raw.returncode == 0, raw.stderr
    assert json.loads(raw.stdout)["text"] == ref.text
    assert json.loads(raw.stdout)["token_ids"] == list(ref.token_ids)


def test_complete_streams_text_and_prints_timings(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text(SOURCE, encoding="utf-8")
    out = cli(
        "complete", str(src), "--line", "4", "--col", "4", "--max-tokens", "5", "--model", str(tiny_model)
    )
    assert out.returncode == 0, out.stderr
    assert "TTFT" in out.stderr and "tokens, stop:" in out.stderr
    assert "Traceback" not in out.stderr


def test_complete_errors_are_one_clear_line(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text(SOURCE, encoding="utf-8")
    cases = [
        (
            ("--line", "40", "--col", "0", "--model", str(tiny_model)),
            "line 40 is past the end of the document",
        ),
        (("--line", "0", "--col", "0", "--model", str(tmp_path / "none")), "does not exist"),
    ]
    for args, message in cases:
        out = cli("complete", str(src), *args)
        assert out.returncode == 2
        assert out.stderr.strip().splitlines()[-1].startswith("lsp-dscoder: error: ")
        assert message in out.stderr and "Traceback" not in out.stderr
    missing = cli(
        "complete", str(tmp_path / "nofile.py"), "--line", "0", "--col", "0", "--model", str(tiny_model)
    )
    assert missing.returncode == 2 and "No such file" in missing.stderr


def test_complete_with_the_bundled_model_infills_in_the_server_layout(tmp_path: Path) -> None:
    """No --model: the shipped model, with the server's edit-anchor prompt, completes `self.` from a name
    that only the code below the cursor uses, and stops with its own <eos>."""
    src = tmp_path / "config.py"
    src.write_text(
        "class Config:\n"
        "    def __init__(self, name, value):\n"
        "        self.name = name\n"
        "        self.\n"
        "\n"
        "    def __repr__(self):\n"
        '        return f"Config({self.name!r}, {self.value!r})"\n',
        encoding="utf-8",
    )
    out = cli("complete", str(src), "--line", "3", "--col", "13", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["text"] == "value = value"
    # token healing: the prompt ends before `.`, which the model spells again (token 18) before `value`
    assert got["token_ids"] == [18, 448, 277, 612]
    assert got["stats"]["stop_reason"] == "eos"
    assert got["stats"]["stop_rule"] == "none"
    assert got["stats"]["prompt_tokens"] == got["stats"]["prefilled_tokens"] == 58
