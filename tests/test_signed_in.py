"""A signed-in socket speaks for its user only while that sign-in holds: signing out, a flushed
session, deactivation or a new password end it (the `error` `unauthorised`, then close 4401) and
stop its running answer, at once through the cancel bus, or at the latest at its next frame that
acts on answers. Visitors chat on as before. Real model, real sessions, real Redis."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client

from chat import turns
from chat.models import Message
from tests.test_consumer import LONG, SHORT, wait_stored

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

User = get_user_model()
PASSWORD = "pw-dana-1-long"


def browser_of(user) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.fixture
def dana():
    return User.objects.create_user("dana", password=PASSWORD)


async def socket_of(make_client, browser: Client):
    """A socket with `browser`'s session cookie, once this process hears the cancel bus."""
    chat = await make_client(session_key=browser.cookies["sessionid"].value)
    for _ in range(200):
        if turns.cancel_bus.connected:
            return chat
        await asyncio.sleep(0.05)
    raise AssertionError("the cancel bus listener never connected")


async def ended(chat, timeout: float = 10) -> list[dict]:
    """The events up to the `error` `unauthorised`, which must be followed by close 4401."""
    events = await chat.receive_until("error", timeout=timeout)
    assert events[-1]["code"] == "unauthorised", events[-1]
    closed = await chat.communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4401}
    return events


async def running_answer(chat) -> int:
    """Start a long answer and wait for its first chunk; its message id."""
    request_id = await chat.prompt(LONG)
    accepted = await chat.receive()
    assert accepted["type"] == "accepted"
    await chat.receive_until("chunk", request_id)
    return accepted["message"]


async def test_signing_out_ends_that_sessions_socket_and_its_answer_at_once(make_client, dana):
    """No prompt needed: the sign-out's notice closes the socket and stops its answer (stored
    cancelled); the same user's socket in another browser stays open."""
    here, elsewhere = await sync_to_async(browser_of)(dana), await sync_to_async(browser_of)(dana)
    chat = await socket_of(make_client, here)
    other = await socket_of(make_client, elsewhere)
    message_id = await running_answer(chat)
    await sync_to_async(here.post)("/accounts/logout/")
    events = await ended(chat)
    assert "signed out" in events[-1]["message"]
    stored = await wait_stored(message_id, timeout=30)
    assert stored.status == Message.Status.CANCELLED
    await other.send({"type": "ping"})
    assert (await other.receive(timeout=10))["type"] == "pong"


async def test_deactivating_the_account_ends_its_sockets(make_client, dana):
    chat = await socket_of(make_client, await sync_to_async(browser_of)(dana))

    def deactivate():
        dana.is_active = False
        dana.save()

    await sync_to_async(deactivate)()
    events = await ended(chat)
    assert "deactivated" in events[-1]["message"]


async def test_a_new_password_ends_every_socket_even_the_changing_sessions(make_client, dana):
    """The password-change page keeps its own session signed in (Django updates its hash), yet
    the socket opened before the change speaks for the old password and is ended; a socket
    opened after it works."""
    browser = await sync_to_async(browser_of)(dana)
    chat = await socket_of(make_client, browser)
    changed = await sync_to_async(browser.post)(
        "/accounts/password_change/",
        {
            "old_password": PASSWORD,
            "new_password1": "a-new-pw-42x",
            "new_password2": "a-new-pw-42x",
        },
    )
    assert changed.status_code == 302
    events = await ended(chat)
    assert "password" in events[-1]["message"]
    again = await socket_of(make_client, browser)
    request_id = await again.prompt(SHORT)
    assert (await again.receive())["type"] == "accepted"
    await again.receive_until("done", request_id)


async def test_a_password_set_elsewhere_refuses_the_next_prompt(make_client, dana):
    """set_password and save (the admin, manage.py changepassword) ends the socket too."""
    chat = await socket_of(make_client, await sync_to_async(browser_of)(dana))

    def new_password():
        dana.set_password("another-pw-43x")
        dana.save()

    await sync_to_async(new_password)()
    await ended(chat)


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "prompt", "request_id": "p", "text": SHORT, "conversation": None},
        {"type": "resume", "message": 1, "after": 0},
        {"type": "cancel", "request_id": "c", "message": 1},
    ],
    ids=["prompt", "resume", "cancel"],
)
async def test_a_flushed_session_is_refused_at_its_next_frame(make_client, dana, frame):
    """A session removed without a signal (expired, cleared by hand) is noticed when the socket
    next acts: no answer starts, nothing is resumed or cancelled."""
    browser = await sync_to_async(browser_of)(dana)
    chat = await socket_of(make_client, browser)
    session_key = browser.cookies["sessionid"].value
    await sync_to_async(Session.objects.filter(session_key=session_key).delete)()
    await chat.send(frame)
    events = await ended(chat)
    assert [event["type"] for event in events] == ["error"]
    assert "signed out" in events[0]["message"]


async def test_a_visitor_chats_on_while_a_user_signs_out(make_client, dana):
    visitor = await make_client()
    browser = await sync_to_async(browser_of)(dana)
    chat = await socket_of(make_client, browser)
    await sync_to_async(browser.post)("/accounts/logout/")
    await ended(chat)
    request_id = await visitor.prompt(SHORT)
    events = await visitor.receive_until("done", request_id)
    assert events[0]["type"] == "accepted" and events[-1]["type"] == "done"
