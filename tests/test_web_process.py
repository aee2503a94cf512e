"""A web process on CHAT_BACKEND=openai never imports torch or transformers, start-up checks and
a served turn included (its RSS and start-up time: docs/operations.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.liveserver import ROOT
from harness.openai_server import FakeOpenAIServer

from .conftest import LIVE_CACHE_URL

# Migrate (which runs the system checks, the eos check among them), load the app as daphne
# does, serve one turn over the app's WebSocket route, and say what got imported.
CHILD = """
import asyncio, json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from channels.testing import WebsocketCommunicator
from project.asgi import application
from chat.infra.runtime import runtime
assert runtime.wait(120), runtime.detail

async def turn():
    ws = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost")]
    )
    assert (await ws.connect())[0]
    await ws.send_to(text_data=json.dumps({"type": "prompt", "request_id": "t", "text": "Hi"}))
    while True:
        event = json.loads(await ws.receive_from(timeout=120))
        if event["type"] in {"done", "error"}:
            await ws.disconnect()
            return event

done = asyncio.run(turn())
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "xgrammar"})
print(json.dumps({"done": done, "loaded": loaded}))
"""


@pytest.fixture
def fake(backend):
    server = FakeOpenAIServer(backend).start()
    yield server
    server.stop()


@pytest.mark.integration
def test_a_web_process_on_the_openai_backend_serves_a_turn_without_torch(fake, tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'web.sqlite3'}",
        "CHAT_CACHE_REDIS_URL": LIVE_CACHE_URL,
        "CHAT_BACKEND": "openai",
        "CHAT_REMOTE": f"{fake.url}?model={fake.model}",
    }
    child = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["done"]["type"] == "done" and report["done"]["text"], report
    assert report["done"]["metrics"]["prompt_tokens"] > 0  # counted here, by the file tokenizer
    assert report["loaded"] == []
    assert fake.served and fake.served[-1].body["messages"][-1]["content"] == "Hi"


@pytest.mark.unit
@pytest.mark.timeout(600)  # the child converts the bundled model, up to 300 s
def test_make_run_in_front_of_a_server_prepares_the_tokenizer_folder_in_a_child_process():
    """`python -m project.serve` converts the bundled model (the tokenizer for token counts) in
    a child process on CHAT_BACKEND=openai, so the serving process stays torch-free."""
    script = (
        "import sys, types\n"
        "from project.serve import prepare_bundled_model\n"
        "prepare_bundled_model(types.SimpleNamespace("
        "CHAT_BACKEND='openai', CHAT_REMOTE_TOKENIZER='', DATA_DIR='var', CHAT_MODEL_QUANT='auto'))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "Model ready at" in child.stdout  # the child ran chat.engine.weights.convert
    assert child.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.unit
def test_the_serving_process_leaves_migrations_static_files_and_checks_to_a_child(monkeypatch):
    """`project.serve` prepares in a child process that exits before it serves, so the serving
    process keeps none of their imports (about 47 MB of a torch-free web process); a child
    that fails stops the start with its exit status."""
    from types import SimpleNamespace

    from daphne.cli import CommandLineInterface

    import project.serve as serve_module

    children: list[list[str]] = []
    status = {"code": 0}

    def child(args, **kwargs):
        children.append(args)
        return SimpleNamespace(returncode=status["code"])

    def in_process(*args, **kwargs):
        raise AssertionError(f"a management command ran in the serving process: {args}")

    served: list[list[str]] = []
    monkeypatch.setattr(serve_module.subprocess, "run", child)
    monkeypatch.setattr("django.core.management.call_command", in_process)
    monkeypatch.setattr(CommandLineInterface, "run", lambda self, args: served.append(args))
    serve_module.serve(["--verbosity", "1"])
    assert children == [[sys.executable, "-m", "project.serve", serve_module.PREPARE]]
    assert served and served[0][-3:] == ["--verbosity", "1", "project.asgi:application"]
    status["code"] = 3
    with pytest.raises(SystemExit) as stopped:
        serve_module.serve([])
    assert stopped.value.code == 3 and len(served) == 1
