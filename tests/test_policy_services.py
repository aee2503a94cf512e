"""The hooks that ask a service: a `/v1/moderations` endpoint and a guard model, against a
small HTTP server each test starts on loopback (and the guard once against the product's own
/v1 on the bundled model, for the request's structure)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chat.policy import HookConfigError, load_hook
from chat.policy.guard import GuardModelHook, guard_prompt, parse_assessment
from chat.policy.http import ServiceError
from chat.policy.remote_moderation import RemoteModerationHook


@dataclass
class Stub:
    """What the stub answers (status, JSON or raw body, after a delay) and what it was sent."""

    status: int = 200
    reply: object = None
    raw: bytes | None = None
    delay_s: float = 0.0
    seen: list[dict] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            state.seen.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            time.sleep(state.delay_s)
            payload = state.raw if state.raw is not None else json.dumps(state.reply).encode()
            try:
                self.send_response(state.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the hook gave up waiting

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def moderation_reply(flagged: dict[str, bool], scores: dict[str, float] | None = None) -> dict:
    return {
        "id": "modr-1",
        "model": "omni-moderation-latest",
        "results": [
            {
                "flagged": any(flagged.values()),
                "categories": flagged,
                "category_scores": scores or {name: float(hit) for name, hit in flagged.items()},
            }
        ],
    }


# --- /v1/moderations ----------------------------------------------------------------


@pytest.mark.unit
def test_remote_moderation_flags_withdraw_with_categories_and_send_the_key(stub, monkeypatch):
    monkeypatch.setenv("MODERATION_KEY", "sk-test")
    stub.reply = moderation_reply({"harassment": True, "violence": True, "sexual": False})
    hook = RemoteModerationHook(url=stub.url + "/v1/moderations", api_key_env="MODERATION_KEY")
    verdict = hook.check("you will regret this", final=False)
    assert not verdict.allowed and verdict.categories == ("harassment", "violence")
    assert verdict.reason == "moderation service flagged: harassment, violence"
    sent = stub.seen[-1]
    assert sent["path"] == "/v1/moderations"
    assert sent["body"] == {"input": "you will regret this", "model": "omni-moderation-latest"}
    assert sent["headers"]["Authorization"] == "Bearer sk-test"
    stub.reply = moderation_reply({"harassment": False})
    assert hook.check("have a nice day", final=True).allowed


@pytest.mark.unit
def test_remote_moderation_counts_only_chosen_categories_or_scores_over_a_threshold(stub):
    stub.reply = moderation_reply(
        {"harassment": True, "violence": False}, {"harassment": 0.6, "violence": 0.3}
    )
    only_violence = RemoteModerationHook(url=stub.url, api_key_env="", categories=["violence"])
    assert only_violence.check("text", final=True).allowed
    scored = RemoteModerationHook(url=stub.url, api_key_env="", threshold=0.25)
    verdict = scored.check("text", final=True)
    assert verdict.categories == ("harassment", "violence")
    assert "Authorization" not in stub.seen[-1]["headers"]


@pytest.mark.unit
@pytest.mark.parametrize("fail_open", [False, True])
@pytest.mark.parametrize(
    ("setup", "problem"),
    [
        ({"delay_s": 1.0, "reply": moderation_reply({"x": False})}, "within 0.3 s"),
        ({"status": 500, "reply": {"error": "boom"}}, "HTTP 500"),
        ({"raw": b"<html>not json</html>"}, "not JSON"),
        ({"reply": {"unexpected": True}}, "results[0]"),
    ],
)
def test_remote_moderation_failures_follow_fail_open(stub, setup, problem, fail_open):
    """Too slow, an error status, not JSON, not the right shape: withdrawn, or let through."""
    for name, value in setup.items():
        setattr(stub, name, value)
    hook = RemoteModerationHook(url=stub.url, api_key_env="", timeout_s=0.3, fail_open=fail_open)
    verdict = hook.check("some answer", final=False)
    if fail_open:
        assert verdict.allowed
    else:
        assert not verdict.allowed and verdict.categories == ("unavailable",)
        assert problem in verdict.reason


@pytest.mark.unit
def test_remote_moderation_unreachable_is_a_failure_too():
    hook = RemoteModerationHook(url="http://127.0.0.1:9/v1/moderations", api_key_env="")
    verdict = hook.check("some answer", final=True)
    assert not verdict.allowed and "cannot reach" in verdict.reason


@pytest.mark.unit
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"url": "ftp://x"}, "url"),
        ({"api_key_env": "sk-live-123"}, "api_key_env"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"fail_open": "yes"}, "fail_open"),
        ({"categories": "violence"}, "categories"),
        ({"threshold": 2}, "threshold"),
    ],
)
def test_remote_moderation_settings_errors(config, message):
    with pytest.raises(HookConfigError, match=message):
        load_hook("remote_moderation", config)


# --- the guard model ----------------------------------------------------------------


def completion(content: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("safe", (True, ())),
        ("  Safe.\n", (True, ())),
        ("unsafe\nS1,S10", (False, ("Violent Crimes", "Hate"))),
        ("unsafe\nS10, S10, S99", (False, ("Hate", "S99"))),
        ("unsafe", (False, ())),
    ],
)
def test_guard_assessment_parsing(reply, expected):
    assert parse_assessment(reply) == expected


@pytest.mark.unit
def test_guard_assessment_that_says_neither_is_a_failure():
    with pytest.raises(ServiceError, match="neither safe nor unsafe"):
        parse_assessment("I think this text is fine")


@pytest.mark.unit
def test_guard_model_asks_llama_guard_style_and_withdraws_unsafe(stub):
    stub.reply = completion("unsafe\nS9")
    hook = GuardModelHook(url=stub.url + "/v1/chat/completions", model="guard")
    verdict = hook.check("Mix these chemicals to make a weapon.", final=False)
    assert not verdict.allowed and verdict.categories == ("Indiscriminate Weapons",)
    body = stub.seen[-1]["body"]
    assert body["model"] == "guard" and body["temperature"] == 0 and body["max_tokens"] == 20
    prompt = body["messages"][0]["content"]
    assert prompt == guard_prompt("Mix these chemicals to make a weapon.")
    assert "Agent: Mix these chemicals" in prompt and "S14: Code Interpreter Abuse." in prompt
    stub.reply = completion("safe")
    assert hook.check("Bread needs flour, water and salt.", final=True).allowed
    chat = GuardModelHook(url=stub.url, model="guard", style="chat")
    chat.check("Some answer.", final=True)
    assert stub.seen[-1]["body"]["messages"][-1] == {"role": "assistant", "content": "Some answer."}


@pytest.mark.unit
@pytest.mark.parametrize("fail_open", [False, True])
def test_guard_model_failures_follow_fail_open(stub, fail_open):
    stub.reply = completion("Well, it depends.")
    hook = GuardModelHook(url=stub.url, model="guard", fail_open=fail_open)
    verdict = hook.check("Some answer.", final=True)
    assert verdict.allowed == fail_open
    if not fail_open:
        assert "neither safe nor unsafe" in verdict.reason
    stub.reply, stub.delay_s = completion("safe"), 1.0
    slow = GuardModelHook(url=stub.url, model="guard", timeout_s=0.3, fail_open=fail_open)
    assert slow.check("Some answer.", final=True).allowed == fail_open


@pytest.mark.integration
def test_guard_model_request_is_served_by_the_products_own_v1(daphne_server, monkeypatch):
    """Structure only: the bundled model is no guard, but the request is a valid chat
    completion on a real OpenAI-compatible server and its reply is read and judged."""
    make_user = "from django.contrib.auth import get_user_model as u; u().objects.get_or_create(username='guard')"
    daphne_server.manage("shell", "-c", make_user)
    out = daphne_server.manage("apikey", "create", "--user", "guard", "--name", "guard test")
    monkeypatch.setenv("GUARD_TEST_KEY", out.strip().splitlines()[-1])
    hook = GuardModelHook(
        url=daphne_server.url + "/v1/chat/completions",
        model="smollm2",
        api_key_env="GUARD_TEST_KEY",
        timeout_s=60,
        max_tokens=4,
    )
    verdict = hook.check("Bread needs flour, water and salt.", final=True)
    # Whatever the small model says, it was an answer read from choices[0].message.content:
    # safe, unsafe, or neither (then withdrawn, fail-closed) - never a transport error.
    assert verdict.allowed or verdict.reason.startswith(
        ("guard model: unsafe", "guard model unavailable: the guard model answered neither")
    ), verdict.reason


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
async def test_a_turn_with_a_service_hook_is_judged_off_the_event_loop(
    stub, scripted, application, make_policy
):
    """Over the socket: the moderation service flags the answer, which is withdrawn; the
    service was asked from a worker thread, so the event loop never waited on it."""
    from asgiref.sync import sync_to_async

    from harness.scripted import Answer
    from tests.conftest import ChatClient, chunks_text

    stub.reply = moderation_reply({"violence": True})
    stub.delay_s = 0.2
    threads = []
    original = RemoteModerationHook.check

    def spy(self, text, *, final):
        threads.append(threading.current_thread() is threading.main_thread())
        return original(self, text, final=final)

    RemoteModerationHook.check = spy  # type: ignore[method-assign]
    try:
        await sync_to_async(make_policy)(
            slug="remote",
            moderation_hooks=[
                {"hook": "remote_moderation", "settings": {"url": stub.url, "api_key_env": ""}}
            ],
            holdback_chars=16,
        )
        answer = "I am going to describe something violent here, in some detail."
        scripted(Answer(tuple(answer[i : i + 4] for i in range(0, len(answer), 4)), "eos"))
        chat = await ChatClient(application).connect()
        try:
            request_id = await chat.prompt("Tell me something.", policy="remote")
            events = await chat.receive_until("done", request_id, timeout=60)
        finally:
            await chat.close()
    finally:
        RemoteModerationHook.check = original  # type: ignore[method-assign]
    done = events[-1]
    assert done["finish_reason"] == "moderated" and "violence" in done["reason"]
    assert "violent" not in chunks_text(events)  # caught inside the window
    assert threads and not any(threads)
    assert stub.seen and stub.seen[0]["body"]["input"].startswith("I am going")
