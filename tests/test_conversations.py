"""The conversation API: rename, delete, search, export; only ever the caller's own."""

import json

import pytest
from django.test import Client

from chat.models import CachedAnswer, CachedAnswerSource, Conversation, Message

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


def visitor() -> Client:
    client = Client()
    client.get("/")
    return client


def make_conversation(
    client, title="about owls", answer="Owls hunt at **night**.", prompt="Tell me about owls"
) -> Conversation:
    conversation = Conversation.objects.create(session_key=client.session.session_key, title=title)
    Message.objects.create(conversation=conversation, role="user", text=prompt)
    Message.objects.create(conversation=conversation, role="assistant", text=answer)
    return conversation


def patch(client, conversation_id, body):
    return client.patch(
        f"/api/conversations/{conversation_id}/", json.dumps(body), content_type="application/json"
    )


def test_rename_changes_the_title_and_refuses_a_bad_one():
    client = visitor()
    conversation = make_conversation(client)
    response = patch(client, conversation.pk, {"title": "  Night   birds "})
    assert response.status_code == 200 and response.json()["title"] == "Night birds"
    conversation.refresh_from_db()
    assert conversation.title == "Night birds"
    for bad in ({"title": ""}, {"title": "x" * 121}, {"title": 5}, ["nope"]):
        response = patch(client, conversation.pk, bad)
        assert response.status_code == 400 and response.json()["code"] == "bad_title"
    assert client.patch(f"/api/conversations/{conversation.pk}/", b"{not json").status_code == 400
    conversation.refresh_from_db()
    assert conversation.title == "Night birds"  # nothing lost by bad input


def cached_answer(key: str, prompt: str, *holders: Conversation) -> CachedAnswer:
    record = CachedAnswer.objects.create(
        key=key * 64,
        prompt=prompt,
        rendered_prompt="...",
        answer="Owls",
        finish_reason="eos",
        policy_slug="chat",
        policy_version=1,
        model_id="m",
    )
    for conversation in holders:
        CachedAnswerSource.objects.create(cached_answer=record, conversation=conversation)
    return record


def test_delete_removes_the_conversation_its_messages_and_the_cached_answers_only_it_held(
    django_capture_on_commit_callbacks,
):
    """Cached answers go with the last conversation holding their prompt (docs/privacy.md)."""
    client, other = visitor(), visitor()
    conversation = make_conversation(client)
    elsewhere = make_conversation(other)
    only_here = cached_answer("k", "Tell me about owls", conversation)
    shared = cached_answer("s", "Tell me about owls, again", conversation, elsewhere)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/api/conversations/{conversation.pk}/").status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    assert not CachedAnswer.objects.filter(pk=only_here.pk).exists()
    assert list(shared.sources.values_list("conversation_id", flat=True)) == [elsewhere.pk]
    assert client.get(f"/api/conversations/{conversation.pk}/").status_code == 404
    assert client.delete(f"/api/conversations/{conversation.pk}/").status_code == 404


def test_search_finds_titles_and_message_text_of_ones_own_conversations_only():
    client, stranger = visitor(), visitor()
    owls = make_conversation(client, "about owls", "They hunt mice.")
    bread = make_conversation(client, "baking", "Knead the DOUGH well.", prompt="How?")
    make_conversation(stranger, "owls too", "dough and owls")

    def search(q):
        return [
            c["id"] for c in client.get("/api/conversations/", {"q": q}).json()["conversations"]
        ]

    assert search("owl") == [owls.pk]
    assert search("dough") == [bread.pk]  # message text, any case
    assert search("nothing like this") == []
    assert set(search("")) == {owls.pk, bread.pk}
    listed = client.get("/api/conversations/").json()["conversations"]
    assert all(c["day"] == c["updated_at"][:10] for c in listed)


def test_export_as_markdown_and_as_json():
    client = visitor()
    conversation = make_conversation(client)
    md = client.get(f"/api/conversations/{conversation.pk}/export", {"format": "markdown"})
    assert md.status_code == 200 and md["Content-Type"].startswith("text/markdown")
    assert f'filename="conversation-{conversation.pk}.md"' in md["Content-Disposition"]
    text = md.content.decode()
    assert text.startswith("# about owls") and "Tell me about owls" in text
    assert "Owls hunt at **night**." in text
    exported = client.get(f"/api/conversations/{conversation.pk}/export", {"format": "json"})
    data = json.loads(exported.content)
    assert data["id"] == conversation.pk and [m["role"] for m in data["messages"]] == [
        "user",
        "assistant",
    ]
    bad = client.get(f"/api/conversations/{conversation.pk}/export", {"format": "pdf"})
    assert bad.status_code == 400


def test_nobody_else_can_read_rename_delete_or_export_a_conversation():
    owner, stranger = visitor(), visitor()
    conversation = make_conversation(owner)
    base = f"/api/conversations/{conversation.pk}/"
    assert stranger.get(base).status_code == 404
    assert patch(stranger, conversation.pk, {"title": "mine now"}).status_code == 404
    assert stranger.delete(base).status_code == 404
    assert stranger.get(base + "export").status_code == 404
    conversation.refresh_from_db()
    assert conversation.title == "about owls"


def test_changes_need_the_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.get("/")
    conversation = make_conversation(client)
    assert client.delete(f"/api/conversations/{conversation.pk}/").status_code == 403
    token = client.cookies["csrftoken"].value
    response = client.delete(
        f"/api/conversations/{conversation.pk}/", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 204
