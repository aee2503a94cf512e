"""Access: CSRF on every form, and one signed-in user never reaching another's conversation or request."""

import re
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from chat.models import CachedAnswer, Conversation, Message, OutputPolicy

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
FORM = re.compile(r"<form\b(?P<attrs>[^>]*)>(?P<body>.*?)</form>", re.S | re.I)


@pytest.mark.unit
def test_every_post_form_in_the_templates_carries_the_csrf_token():
    """A form that posts without {% csrf_token %} would be refused for everyone, or be unprotected if exempted."""
    forms = [
        (path, match)
        for path in TEMPLATES.rglob("*.html")
        for match in FORM.finditer(path.read_text())
    ]
    assert forms, "no forms found: the scan is looking in the wrong place"
    posting = [
        (path, m) for path, m in forms if re.search(r"method\s*=\s*[\"']?post", m["attrs"], re.I)
    ]
    missing = [str(path) for path, m in posting if "{% csrf_token %}" not in m["body"]]
    assert missing == []


def all_views(patterns=None, prefix=""):
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            yield from all_views(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry.callback


@pytest.mark.unit
def test_no_view_is_exempt_from_csrf():
    """CsrfViewMiddleware guards every POST: no view of ours or the admin's opts out, except the
    OpenAI-compatible API, which reads no cookie (a Bearer key only), so a forged cross-site
    request carries no credentials (tests/test_openai_views.py checks a cookie alone gets 401);
    and the feedback endpoint, which takes a Bearer key the same way and checks CSRF itself for
    a session (tests/test_feedback_api.py checks a cookie without the token gets 403)."""
    views = list(all_views())
    assert len(views) > 10
    exempt = [route for route, view in views if getattr(view, "csrf_exempt", False)]
    bearer_too = {"api/messages/<int:message_id>/feedback"}
    assert exempt and all(route.startswith("v1/") or route in bearer_too for route in exempt), (
        exempt
    )


def pending_answer(*, policy_slug: str) -> CachedAnswer:
    """A cached answer awaiting review, as the cache records one."""
    return CachedAnswer.objects.create(
        key="k" * 64,
        prompt="p",
        rendered_prompt="p",
        answer="a",
        finish_reason="eos",
        policy_slug=policy_slug,
        policy_version=1,
        model_id="m",
    )


@pytest.fixture
def staff_without_token(example_policies):
    """A superuser whose client enforces CSRF like a browser does (Django's test client skips it by default)."""
    user = User.objects.create_superuser("boss", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.mark.unit
@pytest.mark.django_db
def test_admin_posts_without_a_csrf_token_are_refused(staff_without_token, example_policies):
    """Policy edits, deletes and cached-answer review actions all need the token: 403 without it."""
    policy = example_policies["json"]
    change = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    assert staff_without_token.post(change, {"name": "hijacked", "slug": "json"}).status_code == 403
    assert (
        staff_without_token.post(
            f"/admin/chat/outputpolicy/{policy.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    record = pending_answer(policy_slug="json")
    action = {"action": "reject", "_selected_action": [record.pk]}
    assert staff_without_token.post("/admin/chat/cachedanswer/", action).status_code == 403
    assert OutputPolicy.objects.get(pk=policy.pk).name != "hijacked"
    assert CachedAnswer.objects.get(pk=record.pk).status == "pending"


@pytest.mark.unit
@pytest.mark.django_db
def test_the_same_admin_post_with_the_token_gets_through(staff_without_token, example_policies):
    """The check above fails for the right reason: with the page's token the same post is not refused."""
    change = f"/admin/chat/outputpolicy/{example_policies['json'].pk}/change/"
    page = staff_without_token.get(change)
    token = (
        re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    )
    response = staff_without_token.post(change, {"csrfmiddlewaretoken": token, "name": "x"})
    assert response.status_code == 200  # the form comes back with its validation errors, not a 403


@pytest.mark.unit
@pytest.mark.django_db
def test_the_admin_login_form_needs_the_token():
    """Login is a form too: a cross-site post cannot log a victim in as someone else."""
    User.objects.create_superuser("boss", password="pw")
    client = Client(enforce_csrf_checks=True)
    assert client.post("/admin/login/", {"username": "boss", "password": "pw"}).status_code == 403


# -- two signed-in users ----------------------------------------------------------------


def signed_in(name: str) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(name, password="pw"))
    return client


@pytest.mark.unit
@pytest.mark.django_db
def test_a_signed_in_user_cannot_read_or_list_another_users_conversation():
    """User B gets 404 for user A's conversation and never sees it listed or preselected on the page."""
    alice, bob = signed_in("alice"), signed_in("bob")
    conversation = Conversation.objects.create(
        user=User.objects.get(username="alice"), title="alice's secret"
    )
    Message.objects.create(conversation=conversation, role="user", text="my secret")
    assert alice.get(f"/api/conversations/{conversation.pk}/").status_code == 200
    assert bob.get(f"/api/conversations/{conversation.pk}/").status_code == 404
    assert bob.get("/api/conversations/").json() == {"conversations": []}
    page = bob.get(f"/?c={conversation.pk}").content.decode()
    assert "alice's secret" not in page and '"conversation": null' in page


async def ws_client_for(make_client, http_client: Client):
    return await make_client(session_key=http_client.cookies["sessionid"].value)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
async def test_a_signed_in_user_cannot_continue_or_cancel_another_users_turn(make_client):
    """Over WebSockets user B can neither continue A's conversation nor cancel A's running request."""
    alice_http = await sync_to_async(signed_in)("alice")
    bob_http = await sync_to_async(signed_in)("bob")
    alice = await ws_client_for(make_client, alice_http)
    bob = await ws_client_for(make_client, bob_http)
    request_id = await alice.prompt(
        "Count from 1 to 10, separated by commas.", request_id="alice-1"
    )
    accepted = await alice.receive()
    assert accepted["type"] == "accepted"
    await bob.send({"type": "cancel", "request_id": request_id})
    refused = await bob.receive()
    assert (refused["type"], refused["code"]) == ("error", "unknown_request")
    events = await alice.receive_until("done", request_id)
    assert events[-1]["finish_reason"] in ("eos", "length")  # Bob's cancel did not touch it
    await bob.prompt("What did she ask?", conversation=accepted["conversation"], request_id="peek")
    error = await bob.receive()
    assert (error["code"], error["request_id"]) == ("unknown_conversation", "peek")
    owner = await sync_to_async(
        lambda: Conversation.objects.get(pk=accepted["conversation"]).user.username
    )()
    assert owner == "alice"
    assert (
        await sync_to_async(
            Message.objects.filter(conversation_id=accepted["conversation"]).count
        )()
        == 2
    )


@pytest.mark.unit
@pytest.mark.django_db
def test_reviewing_needs_its_permission_even_for_staff_who_may_edit_policies():
    """Editing policies and reviewing cached answers are separate rights."""
    user = User.objects.create_user("editor", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["change_outputpolicy", "view_outputpolicy", "view_cachedanswer"]
        )
    )
    client = Client()
    client.force_login(user)
    record = pending_answer(policy_slug="chat")
    client.post("/admin/chat/cachedanswer/", {"action": "reject", "_selected_action": [record.pk]})
    assert CachedAnswer.objects.get(pk=record.pk).status == "pending"
    assert (
        client.post(
            f"/admin/chat/cachedanswer/{record.pk}/change/", {"answer": "edited"}
        ).status_code
        == 403
    )
