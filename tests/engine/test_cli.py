"""`lsp-dscoder complete` as a user runs it: a real process, real checkpoint, JSON and errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_complete_drafts_when_told_and_prints_what_it_kept(tmp_path: Path) -> None:
    """The bundled model on the CPU drafts only with --draft-tokens; the completion is the same."""
    src = tmp_path / "r.py"
    src.write_text(
        "def run(model_path, device_name, max_tokens):\n"
        "    result = load_and_run(model_path, device_name, max_tokens)\n"
        "    return result\n\n\n"
        "def run_twice(model_path, device_name, max_tokens):\n"
        "    first = load_and_run(\n",
        encoding="utf-8",
    )
    plain = cli("complete", str(src), "--line", "6", "--col", "25")
    drafted = cli("complete", str(src), "--line", "6", "--col", "25", "--draft-tokens", "3")
    assert plain.returncode == drafted.returncode == 0, plain.stderr + drafted.stderr
    assert plain.stdout == drafted.stdout == "model_path, device_name, max_tokens"
    assert "drafts kept" not in plain.stderr
    assert "; drafts kept 6 of 9; " in drafted.stderr
    bad = cli("complete", str(src), "--line", "6", "--col", "25", "--draft-tokens", "8")
    assert bad.returncode == 2 and "--draft-tokens: invalid choice: 8" in bad.stderr


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


@pytest.mark.slow  # ten processes, each importing torch
def test_complete_refuses_what_cannot_work_in_one_line(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text(SOURCE, encoding="utf-8")
    array = tmp_path / "array"
    shutil.copytree(tiny_model, array)
    (array / "config.json").write_text("[]")
    no_heads = tmp_path / "no-heads"
    shutil.copytree(tiny_model, no_heads)
    config = json.loads((no_heads / "config.json").read_text())
    (no_heads / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    binary, latin1, utf16 = tmp_path / "b.bin", tmp_path / "latin1.py", tmp_path / "utf16.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00x = 1\n")
    latin1.write_bytes("s = 'café'\n".encode("latin-1"))
    utf16.write_bytes("s = 'x'\n".encode("utf-16"))
    model = ("--model", str(tiny_model))
    cases = [
        ((src, "--max-context", str(10**12), *model), f"--max-context must be in [64, {1 << 20}], got 10"),
        ((src, "--max-context", "256", *model), "--max-context 256 leaves -132 tokens for the prompt"),
        ((src, "--max-context", "256", "--max-tokens", "64", *model), "--max-context 256 leaves -68 tokens"),
        ((src, "--temperature", "nan", *model), "temperature must be a finite number >= 0, got nan"),
        ((src, "--temperature", "inf", *model), "temperature must be a finite number >= 0, got inf"),
        ((src, "--max-tokens", "0", *model), "--max-tokens must be in [1, 65536], got 0"),
        ((src, "--model", str(array)), "config.json must hold a JSON object, not a JSON array"),
        ((src, "--model", str(no_heads)), "config.json: num_attention_heads=0 must be a positive integer"),
        ((src, "--model", str(tiny_model / "config.json")), "config.json is a file, not a checkpoint folder"),
        ((binary, *model), "b.bin is a binary file (it holds NUL bytes), not source text"),
        ((latin1, *model), "latin1.py is not UTF-8 text (byte 0xe9 at offset 8; Latin-1?)"),
        ((utf16, *model), "utf16.py is UTF-16/32 text; complete reads UTF-8"),
    ]
    for (path, *args), message in cases:
        out = cli("complete", str(path), "--line", "0", "--col", "0", *args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith("lsp-dscoder: error: ")
        assert message in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr


def test_serve_refuses_a_bad_port_and_an_unwritable_log_file_in_one_line(tmp_path: Path) -> None:
    res = cli("serve", "--tcp", "--port", "99999")
    assert res.returncode == 2 and "argument --port: a TCP port is 0..65535, got '99999'" in res.stderr
    res = cli("serve", "--stdio", "--log-file", str(tmp_path / "missing" / "x.log"))
    assert res.returncode == 2 and res.stdout == ""
    assert (
        res.stderr.startswith("lsp-dscoder: error: cannot write the log file: ")
        and "Traceback" not in res.stderr
    )


def test_serve_refuses_a_bad_command_line_setting_without_claiming_to_go_on() -> None:
    res = cli("serve", "--stdio", "--max-context", "5")
    assert res.returncode == 2 and res.stdout == ""
    assert (
        res.stderr
        == "lsp-dscoder: error: setting 'maxContext': expected an integer in [64, 1048576], got 5\n"
    )
