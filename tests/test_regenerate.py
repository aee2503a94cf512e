"""Regenerate and Edit-and-resend: a prompt frame's `replace` over the real socket and model."""

import pytest
from asgiref.sync import sync_to_async

from chat.models import Conversation, Message

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


async def test_regenerate_keeps_the_old_answer_as_an_earlier_version(client, short_policy):
    """Same text with `replace`: a new answer, never from the cache; the old pair is kept, superseded."""
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
    rows = await messages_of(conversation)
    assert [(m.role, m.superseded) for m in rows] == [
        ("user", True),
        ("assistant", True),
        ("user", False),
        ("assistant", False),
    ]
    assert rows[0].text == rows[2].text == PROMPT
    assert rows[1].text == first["text"]  # nothing lost


async def test_edit_and_resend_replaces_the_prompt_and_the_model_no_longer_sees_it(
    client, short_policy
):
    """Other text with `replace`: the edited prompt is asked without the replaced exchange as context."""
    from chat.stores.selectors import answer_history

    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    request_id = await client.prompt(
        "Count from 5 to 9.", conversation=conversation, replace=first["message"], policy="short"
    )
    await client.receive_until("done", request_id)
    rows = await messages_of(conversation)
    assert [m.text for m in rows if not m.superseded][0] == "Count from 5 to 9."
    history = await sync_to_async(
        lambda: answer_history(Conversation.objects.get(pk=conversation))
    )()
    assert PROMPT not in [turn["content"] for turn in history]


async def test_replace_must_name_the_last_answer_and_changes_nothing_otherwise(
    client, short_policy
):
    """An older or unknown answer id is refused with `bad_message`; nothing is superseded."""
    first = await first_turn(client)
    conversation = (await messages_of_answer(first["message"])).conversation_id
    request_id = await client.prompt("And another?", conversation=conversation, policy="short")
    await client.receive_until("done", request_id)
    for wrong in (first["message"], 999_999):
        request_id = await client.prompt(
            PROMPT, conversation=conversation, replace=wrong, policy="short"
        )
        error = (await client.receive_until("error", request_id))[-1]
        assert error["code"] == "bad_message"
    assert not any(m.superseded for m in await messages_of(conversation))
    request_id = await client.prompt(PROMPT, replace=first["message"])  # no conversation
    assert (await client.receive_until("error", request_id))[-1]["code"] == "bad_conversation"


async def messages_of_answer(message_id: int) -> Message:
    return await sync_to_async(Message.objects.get)(pk=message_id)
