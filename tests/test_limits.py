"""Prompt size limits: characters in the frame, tokens once the turn is prepared."""

import pytest
from asgiref.sync import sync_to_async

from chat.models import Conversation

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


async def test_a_prompt_over_the_token_limit_is_refused_with_both_numbers(
    client, backend, settings
):
    """Few characters but many tokens: `prompt_too_long` names the prompt's characters and tokens and both
    limits; nothing is stored and the socket stays usable."""
    settings.CHAT_MAX_PROMPT_TOKENS = 20
    text = "🦜🦩🦚 " * 10  # 40 characters, far more tokens
    tokens = backend.token_count(text)
    assert len(text) <= settings.CHAT_MAX_PROMPT_CHARS and tokens > max(20, len(text))
    await client.prompt(text, request_id="emoji")
    error = await client.receive()
    assert (error["type"], error["code"], error["request_id"]) == (
        "error",
        "prompt_too_long",
        "emoji",
    )
    assert f"{len(text)} characters and {tokens} tokens" in error["message"]
    assert f"{settings.CHAT_MAX_PROMPT_CHARS} characters and 20 tokens" in error["message"]
    assert await sync_to_async(Conversation.objects.count)() == 0
    request_id = await client.prompt("Say hi.", request_id="fine")
    assert (await client.receive_until("done", request_id))[-1]["type"] == "done"


async def test_a_token_limit_of_zero_turns_the_check_off(client, settings):
    """CHAT_MAX_PROMPT_TOKENS=0: only the character limit and the model's context apply."""
    settings.CHAT_MAX_PROMPT_TOKENS = 0
    settings.CHAT_MAX_NEW_TOKENS = 4
    request_id = await client.prompt("🦜🦩🦚 " * 10)
    assert (await client.receive_until("done", request_id))[-1]["type"] == "done"
