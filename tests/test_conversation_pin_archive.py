"""Pinning and archiving conversations: the fields, the list's order and sections, the PATCH."""

import pytest

from chat.models import Conversation
from chat.stores.conversations import BadChange, conversation_mark
from chat.stores.selectors import Owner

from .test_conversations import make_conversation, patch, visitor

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


def listed(client, **params) -> list[int]:
    return [c["id"] for c in client.get("/api/conversations/", params).json()["conversations"]]


def test_a_new_conversation_is_neither_pinned_nor_archived():
    conversation = Conversation.objects.create(session_key="s", title="t")
    conversation.refresh_from_db()
    assert conversation.pinned is False and conversation.archived_at is None


def test_pinned_chats_come_first_and_pinning_does_not_move_a_chat_by_day():
    client = visitor()
    older = make_conversation(client, "older")
    newer = make_conversation(client, "newer")
    assert listed(client) == [newer.pk, older.pk]
    before = Conversation.objects.get(pk=older.pk).updated_at
    response = patch(client, older.pk, {"pinned": True})
    assert response.status_code == 200 and response.json()["pinned"] is True
    assert listed(client) == [older.pk, newer.pk]
    first = client.get("/api/conversations/").json()["conversations"][0]
    assert first["pinned"] is True and first["archived_at"] is None
    assert Conversation.objects.get(pk=older.pk).updated_at == before
    assert patch(client, older.pk, {"pinned": False}).json()["pinned"] is False
    assert listed(client) == [newer.pk, older.pk]


def test_an_archived_chat_leaves_the_list_for_the_archived_one_and_comes_back():
    client = visitor()
    kept = make_conversation(client, "kept")
    gone = make_conversation(client, "gone", "Owls archived")
    response = patch(client, gone.pk, {"archived": True})
    assert response.status_code == 200 and response.json()["archived_at"]
    assert listed(client) == [kept.pk]
    assert listed(client, archived=1) == [gone.pk]
    assert listed(client, q="archived") == []  # search covers the list it is in
    assert listed(client, q="archived", archived=1) == [gone.pk]
    first = Conversation.objects.get(pk=gone.pk).archived_at
    patch(client, gone.pk, {"archived": True})  # again: keeps when it was archived
    assert Conversation.objects.get(pk=gone.pk).archived_at == first
    assert client.get(f"/api/conversations/{gone.pk}/").status_code == 200  # still readable
    response = patch(client, gone.pk, {"archived": False})
    assert response.status_code == 200 and response.json()["archived_at"] is None
    assert set(listed(client)) == {kept.pk, gone.pk} and listed(client, archived=1) == []


def test_the_page_lists_no_archived_chat():
    client = visitor()
    gone = make_conversation(client, "archived owls")
    make_conversation(client, "visible owls")
    patch(client, gone.pk, {"archived": True})
    page = client.get("/").content.decode()
    assert "visible owls" in page and "archived owls" not in page


def test_a_bad_change_is_refused_and_changes_nothing():
    client = visitor()
    conversation = make_conversation(client)
    for body in ({"pinned": "yes"}, {"archived": 1}, {"pinned": None}, {"title": "x", "pinned": 0}):
        response = patch(client, conversation.pk, body)
        assert response.status_code == 400 and response.json()["code"] == "bad_change", body
    response = patch(client, conversation.pk, {"pinned": True, "title": ""})
    assert response.status_code == 400 and response.json()["code"] == "bad_title"
    assert patch(client, conversation.pk, {}).json()["code"] == "bad_title"
    conversation.refresh_from_db()
    assert (conversation.title, conversation.pinned, conversation.archived_at) == (
        "about owls",
        False,
        None,
    )
    with pytest.raises(BadChange):
        conversation_mark(
            owner=Owner(user_id=None, session_key=conversation.session_key),
            conversation_id=conversation.pk,
            pinned="true",
        )


def test_nobody_else_can_pin_or_archive_a_conversation():
    owner, stranger = visitor(), visitor()
    conversation = make_conversation(owner)
    assert patch(stranger, conversation.pk, {"pinned": True}).status_code == 404
    assert patch(stranger, conversation.pk, {"archived": True}).status_code == 404
    conversation.refresh_from_db()
    assert conversation.pinned is False and conversation.archived_at is None


def test_rename_pin_and_archive_in_one_change():
    client = visitor()
    conversation = make_conversation(client)
    response = patch(client, conversation.pk, {"title": "Owls", "pinned": True, "archived": True})
    data = response.json()
    assert (data["title"], data["pinned"], bool(data["archived_at"])) == ("Owls", True, True)
