"""The hooks that ask a service: a `/v1/moderations` endpoint and a guard model, against a
small HTTP server each test starts on loopback (and the guard once against the product's own
/v1 on the bundled model, for the request's structure)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from chat.policy import HookConfigError, load_hook
from chat.policy.guard import GuardModelHook, guard_prompt, parse_assessment
from chat.policy.http import ServiceError, service_failures
from chat.policy.remote_moderation import RemoteModerationHook
from tests.hook_service import Stub, moderation_reply, serving


@pytest.fixture
def stub() -> Iterator[Stub]:
    with serving() as state:
        yield state


@pytest.fixture(autouse=True)
def allow(settings):
    """The stubs' host is allowed; a test names the secrets it sends."""

    def operator(**secrets: str) -> None:
        settings.CHAT_HOOK_HOSTS = ["127.0.0.1"]
        settings.CHAT_HOOK_SECRETS = secrets

    operator()
    return operator


# --- /v1/moderations ----------------------------------------------------------------


@pytest.mark.unit
def test_remote_moderation_flags_withdraw_with_categories_and_send_the_key(stub, allow):
    allow(MODERATION_KEY="sk-test")
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
    """Too slow, an error status, not JSON, not the right shape: withdrawn, or let through; the
    user's reason is plain, staff trying a draft read the status."""
    for name, value in setup.items():
        setattr(stub, name, value)
    hook = RemoteModerationHook(url=stub.url, api_key_env="", timeout_s=0.3, fail_open=fail_open)
    with service_failures() as failures:
        verdict = hook.check("some answer", final=False)
    assert len(failures) == 1 and failures[0].startswith("remote_moderation: ")
    assert problem in failures[0]
    if fail_open:
        assert verdict.allowed
    else:
        assert not verdict.allowed and verdict.categories == ("unavailable",)
        assert verdict.reason == "moderation service unavailable"


@pytest.mark.unit
def test_remote_moderation_unreachable_is_a_failure_too():
    hook = RemoteModerationHook(url="http://127.0.0.1:9/v1/moderations", api_key_env="")
    with service_failures() as failures:
        verdict = hook.check("some answer", final=True)
    assert not verdict.allowed and failures == ["remote_moderation: cannot connect"]


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
    with service_failures() as failures:
        verdict = hook.check("Some answer.", final=True)
    assert verdict.allowed == fail_open
    assert failures == ["guard: the guard model answered neither safe nor unsafe"]
    if not fail_open:
        assert verdict.reason == "guard model unavailable"
    stub.reply, stub.delay_s = completion("safe"), 1.0
    slow = GuardModelHook(url=stub.url, model="guard", timeout_s=0.3, fail_open=fail_open)
    assert slow.check("Some answer.", final=True).allowed == fail_open


@pytest.mark.integration
def test_guard_model_request_is_served_by_the_products_own_v1(daphne_server, allow):
    """Structure only: the bundled model is no guard, but the request is a valid chat
    completion on a real OpenAI-compatible server and its reply is read and judged."""
    make_user = "from django.contrib.auth import get_user_model as u; u().objects.get_or_create(username='guard')"
    daphne_server.manage("shell", "-c", make_user)
    out = daphne_server.manage("apikey", "create", "--user", "guard", "--name", "guard test")
    allow(GUARD_TEST_KEY=out.strip().splitlines()[-1])
    hook = GuardModelHook(
        url=daphne_server.url + "/v1/chat/completions",
        model="smollm2",
        api_key_env="GUARD_TEST_KEY",
        timeout_s=60,
        max_tokens=4,
    )
    with service_failures() as failures:
        verdict = hook.check("Bread needs flour, water and salt.", final=True)
    # Whatever the small model says, it was an answer read from choices[0].message.content:
    # safe, unsafe, or neither (then withdrawn, fail-closed) - never a transport error.
    assert failures in ([], ["guard: the guard model answered neither safe nor unsafe"])
    assert verdict.allowed or verdict.reason.startswith("guard model"), verdict.reason


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
