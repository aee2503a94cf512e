"""Regenerate and Edit-and-resend: a prompt frame's `replace` over the real socket and model,
which adds a version (chat/stores/branches.py) and forks the conversation there."""

import pytest
from asgiref.sync import sync_to_async

from chat.models import Conversation, Message
from chat.stores import policy_store
from chat.stores.branches import Tree, version_select
from chat.stores.selectors import answer_history
from chat.turns.identity import answer_identity
from chat.turns.prompting import fit_prompt, request_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PROMPT = "Count from 1 to 10, separated by commas."


@pytest.fixture
def short_policy(make_policy):
    return make_policy(slug="short", mode="stream", max_new_tokens=12, stop_strings=[","])


async def messages_of(conversation: int) -> list[Message]:
    return await sync_to_async(list)(
        Message.objects.filter(conversation_id=conversation).order_by("id")
    )


async def first_turn(client) -> dict:
    request_id = await client.prompt(PROMPT, policy="short")
    return (await client.receive_until("done", request_id))[-1]


async def test_regenerate_adds_a_version_of_the_answer_to_the_same_prompt(client, short_policy):
    """Same text with `replace`: a new answer, never from the cache, beside the old one under the
    one prompt; the new one is shown, the old one kept."""
    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    assert first["finish_reason"] == "stop_string"  # cacheable, so a plain repeat is served cached
    repeat = await client.prompt(PROMPT, policy="short")
    assert (await client.receive_until("done", repeat))[-1]["cached"] is True
    request_id = await client.prompt(
        PROMPT, conversation=conversation, replace=first["message"], policy="short"
    )
    done = (await client.receive_until("done", request_id))[-1]
    assert done["cached"] is False and done["message"] != first["message"]
    asked, old, new = await messages_of(conversation)
    assert (asked.role, asked.text, asked.parent_id) == ("user", PROMPT, None)
    assert old.parent_id == new.parent_id == asked.pk
    assert (old.selected, new.selected) == (False, True)
    assert old.text == first["text"]  # nothing lost


async def test_edit_and_resend_adds_a_version_of_the_prompt_and_the_model_no_longer_sees_it(
    client, short_policy
):
    """Other text with `replace`: a new prompt beside the replaced one, asked without it."""
    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    request_id = await client.prompt(
        "Count from 5 to 9.", conversation=conversation, replace=first["message"], policy="short"
    )
    await client.receive_until("done", request_id)
    rows = await messages_of(conversation)
    assert [(m.role, m.parent_id, m.selected) for m in rows] == [
        ("user", None, False),
        ("assistant", rows[0].pk, True),
        ("user", None, True),
        ("assistant", rows[2].pk, True),
    ]
    history = await sync_to_async(
        lambda: answer_history(Conversation.objects.get(pk=conversation))
    )()
    assert [turn["content"] for turn in history][0] == "Count from 5 to 9."
    assert PROMPT not in [turn["content"] for turn in history]


async def test_editing_an_earlier_prompt_forks_there_and_the_model_reads_that_branch(
    client, short_policy, backend
):
    """Edit the first of two prompts, then go on: the model is asked with the edited exchange as
    its history, and nothing of the branch left behind (the answer's identity hashes the model's
    exact input ids)."""
    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    first_asked = (await messages_of_answer(first["message"])).parent_id
    second = await client.prompt("And backwards?", conversation=conversation, policy="short")
    second_done = (await client.receive_until("done", second))[-1]
    edit = await client.prompt(
        "Count from 5 to 9.", conversation=conversation, replace=first["message"], policy="short"
    )
    edited = (await client.receive_until("done", edit))[-1]
    third = await client.prompt("And backwards?", conversation=conversation, policy="short")
    done = (await client.receive_until("done", third))[-1]
    answer = await messages_of_answer(done["message"])
    asked = await messages_of_answer(answer.parent_id)
    assert asked.parent_id == edited["message"]  # after the edited exchange, on its branch

    def identity_with(history: list[dict]) -> str | None:
        policy = policy_store.policy_for("short")
        messages, _, input_ids = fit_prompt(backend, policy, history, "And backwards?")
        request = request_for(backend, policy, input_ids, "x", messages)
        return answer_identity(backend, policy, request, client_context=False)

    on_branch = [
        {"role": "user", "content": "Count from 5 to 9."},
        {"role": "assistant", "content": edited["text"]},
    ]
    left_behind = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": first["text"]},
        *on_branch,
    ]
    assert answer.identity == await sync_to_async(identity_with)(on_branch)
    assert answer.identity != await sync_to_async(identity_with)(left_behind)

    # A version of an answer on the branch left behind: its branch is the one shown again.
    again = await client.prompt(
        "And backwards?", conversation=conversation, replace=second_done["message"], policy="short"
    )
    regenerated = (await client.receive_until("done", again))[-1]
    shown = await sync_to_async(lambda: [m.pk for m in Tree.of(conversation).path()])()
    assert shown[-1] == regenerated["message"] and shown[0] == first_asked


async def test_replace_must_name_a_finished_answer_of_the_conversation(client, short_policy):
    """A prompt's id, another conversation's answer or an unknown id is refused with
    `bad_message`, and changes nothing; an earlier answer may be replaced (a fork)."""
    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    elsewhere = await first_turn(client)
    asked = (await messages_of(conversation))[0]
    request_id = await client.prompt("And another?", conversation=conversation, policy="short")
    await client.receive_until("done", request_id)
    before = [(m.pk, m.parent_id, m.selected) for m in await messages_of(conversation)]
    for wrong in (asked.pk, elsewhere["message"], 999_999):
        request_id = await client.prompt(
            PROMPT, conversation=conversation, replace=wrong, policy="short"
        )
        error = (await client.receive_until("error", request_id))[-1]
        assert error["code"] == "bad_message"
    assert [(m.pk, m.parent_id, m.selected) for m in await messages_of(conversation)] == before
    request_id = await client.prompt(PROMPT, replace=first["message"])  # no conversation
    assert (await client.receive_until("error", request_id))[-1]["code"] == "bad_conversation"


async def messages_of_answer(message_id: int) -> Message:
    return await sync_to_async(Message.objects.get)(pk=message_id)


async def test_continue_applies_to_the_version_shown(client, make_policy):
    """Two versions of an answer cut off at the token limit: only the one shown is continued,
    once the user has switched to it."""
    await sync_to_async(make_policy)(slug="tiny", mode="stream", max_new_tokens=4)
    story = "Write a long story about a fox in a forest."
    request_id = await client.prompt(story, policy="tiny")
    first = (await client.receive_until("done", request_id))[-1]
    conversation = (await messages_of_answer(first["message"])).conversation_id
    request_id = await client.prompt(
        story, conversation=conversation, replace=first["message"], policy="tiny"
    )
    second = (await client.receive_until("done", request_id))[-1]
    assert first["finish_reason"] == second["finish_reason"] == "length"

    await client.send({"type": "continue", "request_id": "c1", "message": first["message"]})
    assert (await client.receive_until("error", "c1"))[-1]["code"] == "bad_message"
    owner_conversations = Conversation.objects.filter(pk=conversation)  # lazy: read in the call
    await sync_to_async(version_select)(owner_conversations, conversation, first["message"])
    await client.send({"type": "continue", "request_id": "c2", "message": first["message"]})
    done = (await client.receive_until("done", "c2"))[-1]
    assert done["message"] == first["message"] and done["text"].startswith(first["text"])
    assert len(done["text"]) > len(first["text"])
