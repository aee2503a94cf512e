"""HTTP: the page, the conversation API's privacy, /healthz, /metrics behind its token."""

import json

import pytest
from django.test import Client

from chat.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def visitor():
    client = Client()
    client.get("/")  # the page gives every visitor a session
    return client


def make_conversation(client, text="hello") -> Conversation:
    conversation = Conversation.objects.create(session_key=client.session.session_key, title=text)
    Message.objects.create(conversation=conversation, role="user", text=text)
    Message.objects.create(
        conversation=conversation, role="assistant", text="<b>hi</b>", finish_reason="eos"
    )
    return conversation


@pytest.mark.unit
def test_page_renders_with_the_visitors_conversations(visitor):
    """The page lists the visitor's own conversations and the config the script needs."""
    conversation = make_conversation(visitor, "about owls")
    page = visitor.get(f"/?c={conversation.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "about owls" in html and 'id="prompt"' in html and 'id="chat-config"' in html
    assert f'"conversation": {conversation.pk}' in html


@pytest.mark.unit
def test_conversation_api_returns_messages_to_their_owner(visitor):
    conversation = make_conversation(visitor)
    body = visitor.get(f"/api/conversations/{conversation.pk}/").json()
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
    assert (
        body["messages"][1]["text"] == "<b>hi</b>" and body["messages"][1]["finish_reason"] == "eos"
    )
    listing = visitor.get("/api/conversations/").json()
    assert [c["id"] for c in listing["conversations"]] == [conversation.pk]


@pytest.mark.unit
def test_another_visitor_can_neither_read_nor_list_a_conversation(visitor):
    """Someone else's conversation is a 404, and absent from their list."""
    conversation = make_conversation(visitor)
    stranger = Client()
    stranger.get("/")
    assert stranger.get(f"/api/conversations/{conversation.pk}/").status_code == 404
    assert stranger.get("/api/conversations/").json() == {"conversations": []}
    page = stranger.get(f"/?c={conversation.pk}").content.decode()
    assert '"conversation": null' in page


@pytest.mark.integration
def test_healthz_is_ok_once_the_model_is_ready(runtime):
    response = Client().get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert (
        body["status"] == "ok"
        and body["model"] == "ready"
        and body["redis"] == "ok"
        and body["database"] == "ok"
    )
    assert body["model_name"] == "SmolLM2-135M-Instruct"


@pytest.mark.integration
def test_healthz_is_503_with_the_same_shape_while_loading(runtime, monkeypatch):
    """Before the model is ready the answer is 503 and says what is not ready."""
    monkeypatch.setattr(runtime, "state", "loading")
    monkeypatch.setattr(runtime, "detail", "Converting SmolLM2 ...")
    response = Client().get("/healthz")
    body = json.loads(response.content)
    assert response.status_code == 503
    assert set(body) >= {"status", "model", "redis", "database"}
    assert (body["status"], body["model"], body["detail"]) == (
        "loading",
        "loading",
        "Converting SmolLM2 ...",
    )


@pytest.mark.integration
def test_healthz_reports_redis_unavailable_as_degraded(runtime, settings):
    """Chat answers without Redis (uncached), so a missing Redis degrades the node rather than downing it."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "degraded" and response.json()["redis"].startswith(
        "unavailable"
    )


@pytest.mark.unit
@pytest.mark.django_db
def test_public_healthz_says_unavailable_and_logs_the_detail(settings, caplog, monkeypatch):
    """A stranger learns that Redis is down, not its address, password or the driver's error:
    those go to the log for the operator (once per change: a fresh process here)."""
    from chat.health import readiness as health

    monkeypatch.setattr(health, "_logged", {})
    settings.REDIS_URL = "redis://:hunter2-redis-pass@127.0.0.1:1/0"
    with caplog.at_level("WARNING", logger="chat.health.readiness"):
        response = Client().get("/healthz")
    body = response.json()
    assert set(body) >= {"status", "model", "redis", "database"}
    assert body["redis"] == "unavailable" and body["database"] == "ok"
    assert "127.0.0.1:1" not in response.content.decode()
    assert "hunter2" not in response.content.decode()
    assert "healthz redis: unavailable" in caplog.text


@pytest.mark.unit
@pytest.mark.parametrize("debug", [True, False])
def test_metrics_are_off_without_a_token_even_with_debug(settings, debug):
    """No CHAT_METRICS_TOKEN: /metrics is a 404 that says how to turn it on, DEBUG or not (a bare
    `daphne` runs with DEBUG on, so an open /metrics under DEBUG would reach production too)."""
    settings.DEBUG, settings.CHAT_METRICS_TOKEN = debug, ""
    response = Client().get("/metrics", headers={"Authorization": "Bearer "})
    assert response.status_code == 404
    body = response.content.decode()
    assert "CHAT_METRICS_TOKEN" in body and "chat_" not in body


@pytest.mark.unit
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-token",
        "Bearer s3cret-token-and-more",
        "Bearer s3cret-tok",
        "Basic czNjcmV0LXRva2Vu",
        "s3cret-token",
        "Bearer",
        "Bearer é",
    ],
)
def test_metrics_refuse_a_missing_or_wrong_token_with_401(settings, authorization):
    """A scraper without the exact token gets 401 with `WWW-Authenticate: Bearer`, and no counts."""
    settings.CHAT_METRICS_TOKEN = "s3cret-token"
    headers = {} if authorization is None else {"Authorization": authorization}
    response = Client().get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"chat_" not in response.content


@pytest.mark.unit
def test_metrics_are_served_to_the_token(settings):
    """The right bearer token (any case of the scheme, as RFC 6750 allows) gets Prometheus's text."""
    settings.CHAT_METRICS_TOKEN = "s3cret-token"
    for scheme in ("Bearer", "bearer"):
        response = Client().get("/metrics", headers={"Authorization": f"{scheme} s3cret-token"})
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain")
        assert b"chat_coalesced_requests_total" in response.content
