"""Server lifecycle: TCP transport, a model that fails to load and a reload that fixes it, exit codes."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys

import pytest
from lsprotocol import types
from pytest_lsp.client import make_test_lsp_client

from tests.lsp.client import Editor, server_command, start

BODY = "def main(args):\n    \n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def connect(port: int, process: asyncio.subprocess.Process) -> Editor:
    """Connect once the server listens (a probe connection would be its one client)."""
    client = make_test_lsp_client()
    for _ in range(600):
        try:
            await client.start_tcp("127.0.0.1", port)
            break
        except OSError:
            assert process.returncode is None, "the server exited before listening"
            await asyncio.sleep(0.05)
    editor = Editor(client)
    caps = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    editor.initialize_result = await client.initialize_session(types.InitializeParams(capabilities=caps))
    return editor


async def test_tcp_serves_one_client_and_exits_after_shutdown(tiny_model):
    port = free_port()
    args = ["-m", "lsp_dscoder", "serve", "--tcp", "--port", str(port), "--model", str(tiny_model)]
    process = await asyncio.create_subprocess_exec(sys.executable, *args, "--max-context", "1024")
    try:
        editor = await connect(port, process)
        await editor.ready()
        doc = editor.open("file:///work/tcp.py", BODY)
        request = editor.inline(doc, 1, 4)
        await request.result()
        assert (await editor.record(request))["outcome"] in ("ok", "empty")
        await editor.client.shutdown_async(None)
        editor.client.exit(None)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await editor.client.stop()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_model_that_fails_to_load_then_a_reload(tiny_model, tmp_path):
    editor = await start(tmp_path / "no-such-model", wait=False)
    reports = await editor.ready()
    assert reports[-1].message.startswith("failed: ")
    error = next(m for m in editor.client.messages if m.type == types.MessageType.Error)
    assert error.message.startswith("dscoder: the model did not load: ")
    doc = editor.open("file:///work/nomodel.py", BODY)
    request = editor.inline(doc, 1, 4)
    assert await request.result() is None
    assert (await editor.record(request))["outcome"] == "not_ready"
    assert (await editor.stats())["engineState"] == "failed"

    # Pointing the `model` setting at a real checkpoint reloads the engine.
    editor.client.progress_reports.clear()
    change = types.DidChangeConfigurationParams(settings={"dscoder": {"model": str(tiny_model)}})
    editor.client.workspace_did_change_configuration(change)
    reports = [r.message for r in await editor.ready()]
    assert reports[-1] == "ready"
    # Each stage reports its start and its end, in order, and the end comes once, last.
    for stage in ("import", "reading config", "allocating KV cache", "warmup"):
        assert reports.index(f"{stage} 0/1") < reports.index(f"{stage} 1/1"), reports
    assert (
        reports.index("reading config 1/1") < reports.index("allocating KV cache 0/1")
        and reports.count("ready") == 1
    )
    request = editor.inline(doc, 1, 4)
    await request.result()
    assert (await editor.record(request))["outcome"] in ("ok", "empty")

    editor.client.exit(None)  # without shutdown: exit code 1 (LSP)
    assert await asyncio.wait_for(editor.client._server.wait(), 30) == 1
    await editor.client.stop()


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("[]", "failed: {} must hold a JSON object, not a JSON array"),
        (
            {"num_attention_heads": 0},
            "failed: {}: num_attention_heads=0 must be a positive integer",
        ),
    ],
)
async def test_a_broken_config_ends_the_load_with_its_reason(tiny_model, tmp_path, config, reason):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_model, folder)
    path = folder / "config.json"
    text = config if isinstance(config, str) else json.dumps({**json.loads(path.read_text()), **config})
    path.write_text(text)
    editor = await start(folder, wait=False)
    reports = await editor.ready()
    assert reports[-1].message == reason.format(path)
    messages = [m.message for m in editor.client.messages]
    assert messages == [f"dscoder: the model did not load: {reason.format(path)[len('failed: ') :]}"]
    assert (await editor.stats())["engineState"] == "failed"
    await editor.client.shutdown_session()
    await editor.client.stop()


async def test_a_max_context_too_small_for_the_prompt_is_refused_with_a_message(tiny_model):
    editor = await start(tiny_model, init={"maxContext": 256})
    assert [m.message for m in editor.client.messages] == [
        "dscoder: settings maxContext 256, maxTokens 128, middleTokens 256 leave -132 tokens for the "
        "prompt: maxContext must be at least maxTokens + middleTokens + 68 (452); using maxContext 1024, "
        "maxTokens 128, middleTokens 256"
    ]
    doc = editor.open("file:///work/room.py", BODY)
    request = editor.inline(doc, 1, 4)
    await request.result()
    assert (await editor.record(request))["outcome"] in ("ok", "empty")  # served, with maxContext 1024
    assert (await editor.stats())["settings"]["maxContext"] == 1024
    await editor.client.shutdown_session()
    await editor.client.stop()


async def test_completion_items_only_for_clients_without_inline_completion(tiny_model):
    client = make_test_lsp_client()
    editor = Editor(client)
    await client.start_io(*server_command(tiny_model))
    inline = types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities()
    )
    caps = types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True), text_document=inline
    )
    await client.initialize_session(types.InitializeParams(capabilities=caps))
    await editor.ready()
    doc = editor.open("file:///work/fallback.py", BODY)
    params = types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=doc.uri), position=types.Position(line=1, character=4)
    )
    for fallback, served in (("auto", False), ("always", True), ("never", False)):
        change = types.DidChangeConfigurationParams(settings={"completionFallback": fallback})
        client.workspace_did_change_configuration(change)
        request = editor.request(types.TEXT_DOCUMENT_COMPLETION, params, doc.version)
        result = await request.result()
        recent = (await editor.stats())["requests"]["recent"]
        assert any(r["requestId"] == request.id for r in recent) is served, fallback
        if not served:
            assert result is None
    await client.shutdown_session()
    await client.stop()
