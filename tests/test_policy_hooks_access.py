"""What a policy editor (staff with only the output-policy permissions) can make a hook reach:
the hook secrets and hosts the operator allows, nothing else; what a failing hook tells staff
and users; and a tried draft in the audit trail. Over the admin's own forms and trial endpoint,
against real listeners on loopback."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from auditlog.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client

from chat.models import Message, OutputPolicy
from chat.policy.guard import GuardModelHook
from chat.policy.remote_moderation import RemoteModerationHook
from harness.scripted import Answer
from tests.conftest import ChatClient
from tests.hook_service import Stub, moderation_reply, serving
from tests.test_policy_editors import posted

SERVER_SECRET = "server-secret-not-for-hooks-5150"
HOOK_KEY = "sk-hook-key-for-the-test"
SERVICE_BODY = "INTERNAL-ONLY-BODY-4242"
EDITOR_PERMISSIONS = [
    f"{verb}_{model}"
    for model in ("outputpolicy", "regressioncase")
    for verb in ("add", "change", "delete", "view")
]


@pytest.fixture
def stub() -> Iterator[Stub]:
    with serving() as state:
        yield state


@pytest.fixture
def other() -> Iterator[Stub]:
    """A second listener: where a redirect would send the hook."""
    with serving() as state:
        yield state


@pytest.fixture
def allow(settings):
    """What the operator allows hooks: these hosts, these secrets (name -> value)."""

    def operator(*, hosts=(), secrets=None):
        settings.CHAT_HOOK_HOSTS = list(hosts)
        settings.CHAT_HOOK_SECRETS = dict(secrets or {})

    operator()
    return operator


@pytest.fixture
def answers(scripted):
    """The scripted model plays these answers; the form checks stop strings for shape only."""

    def play(*texts: str):
        backend = scripted(*(Answer((text,), "eos") for text in texts))
        backend.tokenizer = None

    return play


@pytest.fixture
def editor(db):
    """A policy editor: staff with the output-policy permissions and nothing else."""
    user = User.objects.create_user("editor", "editor@example.com", "pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="chat", codename__in=EDITOR_PERMISSIONS)
    )
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def change_url(policy: OutputPolicy) -> str:
    return f"/admin/chat/outputpolicy/{policy.pk}/change/"


def with_remote_hook(data: dict, url: str, api_key_env: str, **settings) -> dict:
    """The change form as posted after adding a remote moderation hook in its editor."""
    prefix = "moderation_hooks-new-remote_moderation-p-"
    data = {**data, "moderation_hooks-add-remote_moderation": "on"}
    data[prefix + "url"], data[prefix + "api_key_env"] = url, api_key_env
    for name, value in settings.items():
        data[prefix + name] = value
    return data


def try_draft(editor, policy: OutputPolicy, data: dict, prompt: str = "Say something.") -> str:
    response = editor.post(
        f"/admin/chat/outputpolicy/{policy.pk}/try/", {**data, "trial_prompt": prompt}
    )
    html = response.content.decode()
    assert response.status_code in (200, 400), html[:2000]
    return html


# --- secrets ------------------------------------------------------------------------


@pytest.mark.unit
def test_a_draft_trial_cannot_send_a_server_secret_to_the_editors_listener(
    editor, stub, answers, allow, monkeypatch
):
    """The host is allowed, the variable is not one of the hook secrets: the form refuses the
    draft, saying which are allowed, and the listener receives nothing at all."""
    monkeypatch.setenv("SECRET_KEY", SERVER_SECRET)
    allow(hosts=["127.0.0.1"], secrets={"MODERATION_KEY": HOOK_KEY})
    answers("A harmless answer.")
    stub.reply = moderation_reply({"violence": False})
    policy = OutputPolicy.objects.create(name="p", slug="p")
    data = with_remote_hook(posted(editor, change_url(policy)), stub.url, "SECRET_KEY")
    html = try_draft(editor, policy, data)
    assert SERVER_SECRET not in json.dumps(stub.seen)
    assert stub.seen == []
    assert "api_key_env &#x27;SECRET_KEY&#x27; is not a hook secret" in html
    assert "MODERATION_KEY" in html  # what is allowed


@pytest.mark.unit
def test_saving_a_hook_is_refused_unless_its_secret_and_host_are_allowed(editor, stub, allow):
    allow(hosts=["127.0.0.1"], secrets={"MODERATION_KEY": HOOK_KEY})
    policy = OutputPolicy.objects.create(name="p", slug="p")
    page = posted(editor, change_url(policy))
    refused = [
        (with_remote_hook(page, stub.url, "DATABASE_URL"), "is not a hook secret"),
        (with_remote_hook(page, "http://169.254.169.254/latest/", ""), "169.254.169.254"),
        (with_remote_hook(page, "http://10.1.2.3:8080/v1/moderations", ""), "10.1.2.3"),
        # The default URL, with no CHAT_HOOK_HOSTS naming it.
        (with_remote_hook(page, "https://api.openai.com/v1/moderations", ""), "api.openai.com"),
    ]
    for data, problem in refused:
        html = editor.post(change_url(policy), data).content.decode()
        assert problem in html and "CHAT_HOOK" in html, html[:3000]
    policy.refresh_from_db()
    assert policy.moderation_hooks == [] and policy.version == 1
    saved = editor.post(change_url(policy), with_remote_hook(page, stub.url, "MODERATION_KEY"))
    assert saved.status_code == 302, saved.content.decode()[:3000]
    policy.refresh_from_db()
    assert policy.moderation_hooks[0]["settings"]["api_key_env"] == "MODERATION_KEY"
    assert stub.seen == []  # saving asks no service


@pytest.mark.unit
@pytest.mark.parametrize("fail_open", [False, True])
def test_at_call_time_a_secret_or_host_no_longer_allowed_sends_nothing(stub, allow, fail_open):
    """Saved while allowed, then taken off the operator's lists: the hook refuses to call,
    fails closed even with fail_open, and says so without a secret or a URL."""
    stub.reply = moderation_reply({"violence": False})
    hook = RemoteModerationHook(
        url=stub.url + "/v1/moderations", api_key_env="MODERATION_KEY", fail_open=fail_open
    )
    allow(hosts=["127.0.0.1"], secrets={"MODERATION_KEY": HOOK_KEY})
    assert hook.check("fine", final=True).allowed
    assert stub.seen[-1]["headers"]["Authorization"] == f"Bearer {HOOK_KEY}"
    for lists in ({"hosts": ["127.0.0.1"]}, {"secrets": {"MODERATION_KEY": HOOK_KEY}}):
        allow(**lists)
        sent = len(stub.seen)
        verdict = hook.check("fine", final=True)
        assert not verdict.allowed and verdict.categories == ("unavailable",)
        assert verdict.reason == "moderation service unavailable"
        assert len(stub.seen) == sent


@pytest.mark.unit
def test_a_redirect_is_never_followed(stub, other, allow):
    """The hook's host answers a redirect to another listener: the key never goes there."""
    allow(hosts=["127.0.0.1"], secrets={"GUARD_KEY": HOOK_KEY})
    for status in (301, 302, 303, 307, 308):
        stub.status, stub.headers = status, {"Location": other.url + "/elsewhere"}
        for hook in (
            RemoteModerationHook(url=stub.url, api_key_env="GUARD_KEY"),
            GuardModelHook(url=stub.url, model="guard", api_key_env="GUARD_KEY"),
        ):
            verdict = hook.check("Some answer.", final=True)
            assert not verdict.allowed and verdict.categories == ("unavailable",)
    assert other.seen == [] and len(stub.seen) == 10


# --- what staff and users are told ----------------------------------------------------


@pytest.mark.unit
def test_the_trial_panel_shows_the_hooks_status_never_its_reply(editor, stub, answers, allow):
    """An error reply's body (what an internal address would answer) is never on the panel:
    only which hook failed and how."""
    allow(hosts=["127.0.0.1"])
    policy = OutputPolicy.objects.create(name="p", slug="p")
    page = posted(editor, change_url(policy))
    for status, raw, shown in (
        (500, json.dumps({"error": SERVICE_BODY}).encode(), "HTTP 500"),
        (200, f"<html>{SERVICE_BODY}</html>".encode(), "not JSON"),
        (200, json.dumps({"results": SERVICE_BODY}).encode(), "results[0]"),
    ):
        answers("A harmless answer.")
        stub.status, stub.raw = status, raw
        html = try_draft(editor, policy, with_remote_hook(page, stub.url + "/internal", ""))
        assert stub.seen, "the hook was asked"
        assert SERVICE_BODY not in html and "/internal" not in html, html
        assert "remote_moderation" in html and shown in html, html
        assert 'data-finish="moderated"' in html


@pytest.mark.unit
def test_a_tried_draft_is_in_the_audit_trail(editor, stub, answers, allow):
    allow(hosts=["127.0.0.1"], secrets={"MODERATION_KEY": HOOK_KEY})
    stub.reply = moderation_reply({"violence": False})
    policy = OutputPolicy.objects.create(name="p", slug="p")
    answers("A harmless answer.")
    data = with_remote_hook(posted(editor, change_url(policy)), stub.url, "MODERATION_KEY")
    try_draft(editor, policy, data)
    [entry] = LogEntry.objects.filter(additional_data__event="outputpolicy.try")
    assert entry.actor_id == editor.user.pk and entry.object_pk == str(policy.pk)
    before, after = entry.changes["moderation_hooks"]
    assert before == [] and after[0]["settings"]["url"] == stub.url
    assert after[0]["settings"]["api_key_env"] == "MODERATION_KEY"
    assert HOOK_KEY not in json.dumps(entry.changes)
    policy.refresh_from_db()
    assert policy.version == 1  # tried, not saved
    # A draft of a new policy is recorded too, under no stored policy.
    answers("A harmless answer.")
    new_data = {**data, "name": "n", "slug": "n"}
    response = editor.post("/admin/chat/outputpolicy/try/", {**new_data, "trial_prompt": "Hi."})
    assert response.status_code == 200, response.content.decode()[:2000]
    assert LogEntry.objects.filter(
        additional_data__event="outputpolicy.try", object_pk="", actor_id=editor.user.pk
    ).exists()


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_users_get_a_plain_reason_and_the_log_the_detail(stub, scripted, allow, caplog):
    """A failing service over the socket: the user's retract and done say the service is
    unavailable, never its URL or what it answered; the server log has both."""
    from project.asgi import application

    allow(hosts=["127.0.0.1"])
    stub.status, stub.raw = 503, json.dumps({"error": SERVICE_BODY}).encode()
    hook_url = stub.url + "/moderate-internal"
    await sync_to_async(OutputPolicy.objects.create)(
        name="remote",
        slug="remote",
        moderation_hooks=[
            {"hook": "remote_moderation", "settings": {"url": hook_url, "api_key_env": ""}}
        ],
    )
    answer = "A perfectly ordinary answer, long enough to be judged."
    scripted(Answer(tuple(answer[i : i + 5] for i in range(0, len(answer), 5)), "eos"))
    logging.getLogger("chat").addHandler(caplog.handler)
    try:
        chat = await ChatClient(application).connect()
        try:
            request_id = await chat.prompt("Tell me something.", policy="remote")
            events = await chat.receive_until("done", request_id, timeout=60)
        finally:
            await chat.close()
    finally:
        logging.getLogger("chat").removeHandler(caplog.handler)
    assert stub.seen
    done = events[-1]
    assert done["finish_reason"] == "moderated"
    assert done["reason"] == "moderation service unavailable"
    seen_by_user = json.dumps(events)
    assert SERVICE_BODY not in seen_by_user and "127.0.0.1" not in seen_by_user
    assert "moderate-internal" not in seen_by_user and "retract" in [e["type"] for e in events]
    stored = await Message.objects.aget(pk=done["message"])
    assert SERVICE_BODY not in stored.outcome_reason and "127.0.0.1" not in stored.outcome_reason
    assert hook_url in caplog.text and SERVICE_BODY in caplog.text


@pytest.mark.unit
def test_a_url_is_checked_as_the_client_connects_and_an_entry_as_written(allow):
    from chat.policy import reach

    allow(hosts=["127.0.0.1", "guard.internal:8000", "[::1]"])
    allowed = ["http://127.0.0.1:9/x", "https://guard.internal:8000/", "http://[::1]:7/"]
    refused = [
        "http://guard.internal/",  # another port of a host allowed on one
        "http://127.1/",  # the same address, written another way
        "http://127.0.0.1.nip.io/",
        "http://user:pw@127.0.0.1/",
        "http://evil.example\\@127.0.0.1/",
        "http://127.0.0.1:bad/",
    ]
    assert [url for url in allowed if reach.host_problem(url)] == []
    assert [url for url in refused if reach.host_problem(url) is None] == []
    for entry in ("::1", "a b", "x:port", "user@host"):
        with pytest.raises(ValueError, match="is not a host name"):
            reach.parse_host(entry)
