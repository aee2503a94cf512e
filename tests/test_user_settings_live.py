"""Custom instructions on the real socket and the real model: the model's input holds them for
their user's turns only, and an instructed answer is never another user's (its identity
differs). Asserts on what the engine was given, never on the model's wording."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import ChatSettings, Message
from chat.turns.run import TurnRun

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NOTE = "Always answer in French, and sign every answer as Captain Settings."
PROMPT = "Say hello."


@pytest.fixture
def requests_seen(monkeypatch):
    """Every GenerationRequest a turn hands the engine, in order."""
    seen = []
    original = TurnRun.submit

    def spy(self, request, **options):
        seen.append(request)
        return original(self, request, **options)

    monkeypatch.setattr(TurnRun, "submit", spy)
    return seen


def signed_in_session(username: str, note: str) -> str:
    user = get_user_model().objects.create_user(username, password="pw-long-enough-42")
    if note:
        ChatSettings.objects.create(user=user, instructions=note)
    browser = Client()
    browser.force_login(user)
    return browser.cookies["sessionid"].value


async def asked(chat) -> tuple[dict, Message]:
    request_id = await chat.prompt(PROMPT)
    done = (await chat.receive_until("done", request_id))[-1]
    return done, await sync_to_async(Message.objects.get)(pk=done["message"])


async def test_custom_instructions_reach_the_models_input_and_keep_answers_apart(
    make_client, requests_seen, backend, settings
):
    settings.CHAT_MAX_NEW_TOKENS = 6  # the wording is not under test
    instructed = await make_client(session_key=await sync_to_async(signed_in_session)("ina", NOTE))
    done, answer = await asked(instructed)
    request = requests_seen[-1]
    assert request.messages[0] == {"role": "system", "content": NOTE}
    assert request.messages[-1] == {"role": "user", "content": PROMPT}
    model_input = backend.tokenizer.decode(request.input_ids)
    assert NOTE in model_input and model_input.index(NOTE) < model_input.index(PROMPT)
    assert answer.identity and done["cached"] is False

    # Another user without instructions: the same prompt, none of the note, another identity,
    # so the instructed answer is not served to them (nor theirs to the instructed user).
    plain = await make_client(session_key=await sync_to_async(signed_in_session)("pia", ""))
    done, other = await asked(plain)
    assert all(NOTE not in m["content"] for m in requests_seen[-1].messages)
    assert NOTE not in backend.tokenizer.decode(requests_seen[-1].input_ids)
    assert done["cached"] is False and other.identity and other.identity != answer.identity
    # A visitor asks as that user did, and may share their answer: the same identity.
    done, visitors = await asked(await make_client())
    assert visitors.identity == other.identity
