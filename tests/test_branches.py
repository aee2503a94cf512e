"""Conversations as trees of messages (chat/stores/branches.py): the branch shown, versions,
switching between them over HTTP, and what follows the branch (history, /api, export, erasure);
and migration 0022, which turns superseded messages into versions. Real database, no model."""

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from chat.models import Conversation, Message
from chat.stores.branches import Busy, Tree, UnknownMessage, message_add, version_select
from chat.stores.conversations import conversation_delete, export_all_json, export_markdown
from chat.stores.selectors import Owner, answer_history, conversation_detail, conversations_for

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


def visitor() -> Client:
    client = Client()
    client.get("/")
    return client


def turn(conversation, parent, prompt: str, answer: str) -> tuple[Message, Message]:
    asked = message_add(conversation, parent, role="user", text=prompt)
    return asked, message_add(conversation, asked, role="assistant", text=answer)


def forked(session_key: str) -> dict[str, Message]:
    """Q1 A1, Q2 A2, then A2 regenerated (A2b), then Q1 edited (Q1b A1b) and one more turn there."""
    conversation = Conversation.objects.create(session_key=session_key, title="forks")
    q1, a1 = turn(conversation, None, "Name a bird.", "An owl.")
    q2, a2 = turn(conversation, a1, "Where does it live?", "In a forest.")
    a2b = message_add(conversation, q2, role="assistant", text="In a barn.")
    q1b, a1b = turn(conversation, None, "Name a fish.", "A trout.")
    q3, a3 = turn(conversation, a1b, "Where does it live?", "In a river.")
    return dict(q1=q1, a1=a1, q2=q2, a2=a2, a2b=a2b, q1b=q1b, a1b=a1b, q3=q3, a3=a3)


def texts(messages) -> list[str]:
    return [(m.get("text", m.get("content")) if isinstance(m, dict) else m.text) for m in messages]


def test_the_newest_version_is_shown_and_the_history_follows_its_branch():
    m = forked("s1")
    conversation = m["q1"].conversation
    tree = Tree.of(conversation)
    assert texts(tree.path()) == ["Name a fish.", "A trout.", "Where does it live?", "In a river."]
    assert tree.siblings(m["q1b"]) == [m["q1"], m["q1b"]]
    assert tree.siblings(m["a2b"]) == [m["a2"], m["a2b"]]
    assert tree.leaf() == m["a3"]
    assert texts(answer_history(conversation)) == texts(tree.path())
    # Up to a message of another branch: its own turns, none of the branch shown.
    assert texts(answer_history(conversation, upto=m["a2b"].pk)) == [
        "Name a bird.",
        "An owl.",
        "Where does it live?",
        "In a barn.",
    ]
    assert answer_history(conversation, upto=None) == []


def test_switching_shows_a_version_and_below_it_what_was_chosen_there_before():
    m = forked("s2")
    conversation = m["q1"].conversation
    owners = conversations_for(Owner(user_id=None, session_key="s2"))
    version_select(owners, conversation.pk, m["a2"].pk)  # deep in a branch not shown: shown
    assert texts(Tree.of(conversation).path()) == [
        "Name a bird.",
        "An owl.",
        "Where does it live?",
        "In a forest.",
    ]
    assert texts(answer_history(conversation))[-1] == "In a forest."
    version_select(owners, conversation.pk, m["q1b"].pk)
    assert texts(Tree.of(conversation).path())[-1] == "In a river."
    version_select(owners, conversation.pk, m["q1"].pk)  # what was chosen below it, again
    assert texts(Tree.of(conversation).path())[-1] == "In a forest."
    # A new message goes after the branch shown, and is what it shows from then on.
    version_select(owners, conversation.pk, m["q1"].pk)
    asked, answered = turn(conversation, Tree.of(conversation).leaf(), "And its size?", "Small.")
    assert asked.parent == m["a2"] and Tree.of(conversation).leaf() == answered


def test_a_switch_is_refused_while_an_answer_is_written_or_for_a_message_not_there():
    m = forked("s3")
    conversation = m["q1"].conversation
    owners = conversations_for(Owner(user_id=None, session_key="s3"))
    others = conversations_for(Owner(user_id=None, session_key="someone else"))
    assert version_select(others, conversation.pk, m["q1"].pk) is None
    other = Conversation.objects.create(session_key="s3")
    with pytest.raises(UnknownMessage):
        version_select(owners, other.pk, m["q1"].pk)
    message_add(conversation, m["a3"], role="user", text="More?")
    Message.objects.filter(pk=m["a3"].pk).update(status=Message.Status.STREAMING)
    with pytest.raises(Busy):
        version_select(owners, conversation.pk, m["q1"].pk)
    assert Tree.of(conversation).path()[0] == m["q1b"]  # nothing changed


def test_the_api_reads_and_switches_the_branch_and_the_export_follows_it():
    client = visitor()
    m = forked(client.session.session_key)
    conversation = m["q1"].conversation
    url = f"/api/conversations/{conversation.pk}/"
    detail = client.get(url).json()
    assert texts(detail["messages"]) == texts(Tree.of(conversation).path())
    first = detail["messages"][0]
    assert first["versions"] == [m["q1"].pk, m["q1b"].pk] and first["parent"] is None
    assert first["superseded"] is False  # kept for older clients; never true on the branch shown

    switched = client.post(url + "branch", {"message": m["q1"].pk}, content_type="application/json")
    assert switched.status_code == 200
    assert texts(switched.json()["messages"]) == [
        "Name a bird.",
        "An owl.",
        "Where does it live?",
        "In a barn.",
    ]
    assert switched.json()["messages"][3]["versions"] == [m["a2"].pk, m["a2b"].pk]
    assert client.get(url).json() == switched.json()  # remembered, for a reload or another tab
    markdown = client.get(url + "export?format=markdown").content.decode()
    assert "In a barn." in markdown and "A trout." not in markdown
    assert "## You (version 1 of 2)" in markdown
    assert "Assistant (version 2 of 2)" in markdown

    for bad in ({"message": "x"}, {}, ["nope"], {"message": m["q1"].pk + 10_000}):
        response = client.post(url + "branch", bad, content_type="application/json")
        assert response.status_code == 400 and response.json()["code"] == "bad_message"
    stranger = visitor()
    response = stranger.post(
        url + "branch", {"message": m["q1b"].pk}, content_type="application/json"
    )
    assert response.status_code == 404 and response.json()["code"] == "unknown_conversation"
    assert client.get(url).json() == switched.json()  # nothing changed by bad input


def test_a_running_answer_keeps_its_branch_over_http():
    client = visitor()
    m = forked(client.session.session_key)
    Message.objects.filter(pk=m["a3"].pk).update(status=Message.Status.STREAMING, request_id="r9")
    url = f"/api/conversations/{m['q1'].conversation_id}/"
    response = client.post(url + "branch", {"message": m["q1"].pk}, content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "busy"
    # A reload finds it where it runs, with what the page resumes it by.
    running = client.get(url).json()["messages"][-1]
    assert (running["id"], running["status"], running["request_id"]) == (
        m["a3"].pk,
        "streaming",
        "r9",
    )


def test_the_account_export_keeps_every_version_and_deleting_removes_every_branch(
    django_user_model,
):
    user = django_user_model.objects.create_user("brancher", password="pw")
    m = forked("unused")
    Conversation.objects.filter(pk=m["q1"].conversation_id).update(user=user, session_key="")
    exported = json.loads(export_all_json(user=user))["conversations"][0]["messages"]
    assert len(exported) == len(m) == Message.objects.count()
    assert {e["id"] for e in exported if e["shown"]} == {
        x.pk for x in (m["q1b"], m["a1b"], m["q3"], m["a3"])
    }
    owner = Owner(user_id=user.pk, session_key="")
    assert conversation_detail(owner, m["q1"].conversation_id) is not None
    assert export_markdown(owner, m["q1"].conversation_id) is not None
    assert conversation_delete(owner=owner, conversation_id=m["q1"].conversation_id)
    assert not Message.objects.exists()


def test_a_message_stored_without_a_parent_follows_the_branch_shown():
    """What every writer did before branches: the thread goes on at its end."""
    conversation = Conversation.objects.create(session_key="s4")
    asked = Message.objects.create(conversation=conversation, role="user", text="Hi")
    answer = Message.objects.create(conversation=conversation, role="assistant", text="Hello")
    assert asked.parent is None and answer.parent == asked
    assert Tree.of(conversation).path() == [asked, answer]


# -- migration 0022: superseded messages become versions --------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_superseded_messages_into_versions_and_keeps_every_answer():
    executor = MigrationExecutor(connection)
    before = [("chat", "0021_policy_explanations")]
    executor.migrate(before)
    apps = executor.loader.project_state(before).apps
    OldConversation = apps.get_model("chat", "Conversation")
    OldMessage = apps.get_model("chat", "Message")
    conversation = OldConversation.objects.create(session_key="legacy", title="legacy")

    def add(role, text, superseded=False):
        return OldMessage.objects.create(
            conversation=conversation, role=role, text=text, superseded=superseded
        ).pk

    # Q1 A1, then Q2 A2 regenerated twice (A2 -> A2b -> A2c, each with Regenerate's copy of Q2),
    # then edited to Q2x (answered X), the edit current.
    q1, a1 = add("user", "Q1"), add("assistant", "A1")
    q2, a2 = add("user", "Q2", True), add("assistant", "A2", True)
    q2_copy, a2b = add("user", "Q2", True), add("assistant", "A2b", True)
    q2_copy2, a2c = add("user", "Q2", True), add("assistant", "A2c", True)
    q2x, x = add("user", "Q2x"), add("assistant", "X")
    # Another conversation whose last answer was regenerated once, the regeneration current.
    other = OldConversation.objects.create(session_key="legacy", title="other")
    p = OldMessage.objects.create(conversation=other, role="user", text="P", superseded=True).pk
    old = OldMessage.objects.create(
        conversation=other, role="assistant", text="old", superseded=True
    ).pk
    p_copy = OldMessage.objects.create(conversation=other, role="user", text="P").pk
    new = OldMessage.objects.create(conversation=other, role="assistant", text="new").pk

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("chat", "0022_message_branches")])
    try:
        rows = {m.pk: m for m in Message.objects.all()}
        # Every answer and every prompt that differs survives; Regenerate's copies of a prompt
        # are folded into the first.
        assert set(rows) == {q1, a1, q2, a2, a2b, a2c, q2x, x, p, old, new}
        assert q2_copy not in rows and q2_copy2 not in rows and p_copy not in rows
        parents = {pk: m.parent_id for pk, m in rows.items()}
        assert parents == {
            q1: None, a1: q1, q2: a1, a2: q2, a2b: q2, a2c: q2, q2x: a1, x: q2x,
            p: None, old: p, new: p,
        }  # fmt: skip
        tree = Tree.of(conversation.pk)
        assert [m.pk for m in tree.path()] == [q1, a1, q2x, x]
        assert [m.pk for m in tree.siblings(rows[q2x])] == [q2, q2x]
        # Below the edited-away prompt, its last answer is the one chosen there.
        assert rows[a2c].selected and not rows[a2].selected and not rows[a2b].selected
        assert [m.pk for m in Tree.of(other.pk).path()] == [p, new]
        assert [m.text for m in Tree.of(other.pk).siblings(rows[new])] == ["old", "new"]
    finally:
        MigrationExecutor(connection).loader.build_graph()
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_admin_shows_a_message_parent_without_offering_every_message(admin_client):
    m = forked("s5")
    page = admin_client.get(f"/admin/chat/message/{m['a3'].pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="parent"' not in html and 'name="selected"' not in html
    assert str(m["q3"]) in html  # the parent, named
