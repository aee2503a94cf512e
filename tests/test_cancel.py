"""Cancelling an answer from another connection, and the channel-layer cancel every process
hears, which names the owner by a keyed digest, never by a session key."""

import asyncio
import hashlib
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from chat import turns
from chat.models import Conversation, Message
from chat.stores.selectors import Owner
from chat.turns.cancel_bus import GROUP, CancelAnswer, CancelBus
from tests.conftest import wait_for
from tests.test_cache import RedisServer
from tests.test_consumer import LONG, SHORT, new_session_key, wait_stored

pytestmark = pytest.mark.django_db(transaction=True)


async def started(chat, text: str) -> tuple[str, dict]:
    """Send a prompt and wait for its first chunk; (request_id, accepted event)."""
    request_id = await chat.prompt(text)
    accepted = await chat.receive()
    assert accepted["type"] == "accepted"
    await chat.receive_until("chunk", request_id)
    return request_id, accepted


@pytest.mark.integration
async def test_a_second_connection_of_the_same_visitor_stops_the_first_ones_answer(make_client):
    """A cancel frame with `message` from another tab stops that answer; the tab that asked gets `cancel_ack`."""
    session_key = await new_session_key()
    first = await make_client(session_key=session_key)
    second = await make_client(session_key=session_key)
    request_id, accepted = await started(first, LONG)
    await second.send({"type": "cancel", "message": accepted["message"]})
    assert await second.receive() == {
        "type": "cancel_ack",
        "request_id": None,
        "message": accepted["message"],
        "result": "cancelled",
    }
    done = (await first.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "cancelled"
    assert (await wait_stored(accepted["message"])).status == "cancelled"
    # Stopping it again is harmless, and says so.
    await second.send({"type": "cancel", "request_id": "again", "message": accepted["message"]})
    assert (await second.receive())["result"] == "finished"


@pytest.mark.integration
async def test_another_visitor_cannot_cancel_an_answer_and_it_goes_on(make_client):
    """A cancel frame naming someone else's answer gets `unknown_request`; that answer ends normally."""
    owner = await make_client()
    stranger = await make_client()
    request_id, accepted = await started(owner, SHORT)
    await stranger.send({"type": "cancel", "request_id": "x", "message": accepted["message"]})
    error = await stranger.receive()
    assert (error["type"], error["code"], error["request_id"]) == ("error", "unknown_request", "x")
    assert (await owner.receive_until("done", request_id))[-1]["finish_reason"] in ("eos", "length")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"message": "7"}, "bad_message"),
        ({"message": 0}, "bad_message"),
        ({"message": 5, "request_id": ""}, "bad_request_id"),
    ],
)
async def test_a_malformed_cancel_by_message_is_a_clear_error(client, frame, code):
    """A cancel whose `message` is not an answer id is refused with a code, the socket stays open."""
    await client.send({"type": "cancel", **frame})
    assert (await client.receive())["code"] == code
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


@pytest.mark.integration
async def test_a_published_cancel_stops_the_owners_turn_in_this_process(make_client):
    """What another process sends over the channel layer reaches the turn through this process's listener."""
    session_key = await new_session_key()
    chat = await make_client(session_key=session_key)
    request_id, accepted = await started(chat, LONG)
    owner = Owner(user_id=None, session_key=session_key)
    await turns.cancel_bus.publish(CancelAnswer(accepted["message"], owner.digest))
    done = (await chat.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "cancelled"


@pytest.mark.integration
async def test_a_published_cancel_of_another_owner_is_ignored(make_client):
    """The listener checks the owner too: a cancel naming the right message but another session does nothing."""
    chat = await make_client()
    request_id, accepted = await started(chat, SHORT)
    turn = turns.running_turns.get(accepted["message"])
    stranger = Owner(user_id=None, session_key=await new_session_key())
    turns.running_turns.cancel_heard(accepted["message"], stranger.digest)
    assert not turn.cancel_requested
    assert (await chat.receive_until("done", request_id))[-1]["finish_reason"] in ("eos", "length")


@pytest.mark.integration
async def test_a_cancel_naming_a_raw_session_key_is_not_honoured(make_client):
    """A bus message in the old shape, carrying the visitor's session key instead of the digest,
    stops nothing: a session key read off the channel layer is worth nothing there."""
    session_key = await new_session_key()
    chat = await make_client(session_key=session_key)
    request_id, accepted = await started(chat, SHORT)
    turn = turns.running_turns.get(accepted["message"])
    old_shape = {"type": "turn.cancel", "message": accepted["message"], "user_id": None}
    turns.cancel_bus._hand_over({**old_shape, "session_key": session_key})
    turns.cancel_bus._hand_over({**old_shape, "owner": session_key})
    assert not turn.cancel_requested
    assert (await chat.receive_until("done", request_id))[-1]["finish_reason"] in ("eos", "length")


@pytest.mark.unit
def test_an_owners_digest_is_keyed_with_the_secret_and_names_a_user_across_sessions(settings):
    """One user from two sessions has one digest, visitors one each; it is not the session key,
    nor its plain sha256, and another SECRET_KEY gives another digest."""
    phone, laptop = Owner(user_id=1, session_key="phone"), Owner(user_id=1, session_key="laptop")
    visitor = Owner(user_id=None, session_key="phone")
    assert phone.digest == laptop.digest
    assert len({phone.digest, visitor.digest, Owner(user_id=None, session_key="b").digest}) == 3
    assert visitor.digest not in ("phone", hashlib.sha256(b"phone").hexdigest())
    before = visitor.digest
    settings.SECRET_KEY = "another-secret"
    assert visitor.digest != before


@pytest.mark.unit
async def test_what_a_cancel_puts_on_the_channel_layer_names_no_session(settings):
    """Whoever listens to the cancel group (any process, anyone reading that Redis) sees the
    message id and the owner's digest, and nothing a session could be taken over with."""
    layer = get_channel_layer()
    spy = await layer.new_channel(prefix="spy")
    await layer.group_add(GROUP, spy)
    try:
        session_key = await new_session_key()
        message_id = await streaming_answer(session_key)
        owner = Owner(user_id=None, session_key=session_key)
        assert await turns.turn_cancel(owner=owner, message_id=message_id) == "sent"
        while True:  # other suites on the same Redis may publish to the group too
            message = await asyncio.wait_for(layer.receive(spy), 10)
            if message.get("message") == message_id:
                break
        assert message == {"type": "turn.cancel", "message": message_id, "owner": owner.digest}
        assert session_key not in json.dumps(message)
    finally:
        await layer.group_discard(GROUP, spy)


@pytest.mark.unit
def test_the_same_user_from_another_session_is_the_same_owner():
    """A signed-in user's cancel from another device counts as theirs; a visitor is known by the session alone."""
    assert Owner(user_id=1, session_key="phone").is_same(Owner(user_id=1, session_key="laptop"))
    assert not Owner(user_id=1, session_key="s").is_same(Owner(user_id=2, session_key="s"))
    assert not Owner(user_id=None, session_key="s").is_same(Owner(user_id=1, session_key="s"))
    assert not Owner(user_id=None, session_key="a").is_same(Owner(user_id=None, session_key="b"))


async def streaming_answer(session_key: str) -> int:
    """An answer stored as still generating, as if another process were running it."""

    def create():
        conversation = Conversation.objects.create(session_key=session_key, title="elsewhere")
        return Message.objects.create(
            conversation=conversation, role="assistant", status="streaming"
        ).pk

    return await sync_to_async(create)()


@pytest.mark.unit
async def test_cancelling_an_answer_running_elsewhere_publishes_it(settings):
    """Not running here but still generating: turn_cancel publishes to the group and answers `sent`."""
    session_key = await new_session_key()
    message_id = await streaming_answer(session_key)
    heard = []
    bus = CancelBus(heard.append)
    bus.ensure_listening()
    try:
        await wait_for(lambda: bus.connected)
        owner = Owner(user_id=None, session_key=session_key)
        assert await turns.turn_cancel(owner=owner, message_id=message_id) == "sent"
        await wait_for(lambda: heard)
        assert heard == [CancelAnswer(message_id, owner.digest)]
    finally:
        await bus.stop()


@pytest.mark.unit
async def test_the_listener_survives_redis_going_away_and_rejoins(settings):
    """Redis stopped: cancels to other processes fail clearly, the listener retries; restarted, they arrive again."""
    server = RedisServer()
    server.start()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [server.url]},
        }
    }
    session_key = await new_session_key()
    owner = Owner(user_id=None, session_key=session_key)
    message_id = await streaming_answer(session_key)
    heard = []
    bus = CancelBus(heard.append)
    bus.min_backoff = 0.05
    bus.ensure_listening()
    try:
        await wait_for(lambda: bus.connected)
        server.stop()
        with pytest.raises(turns.TurnError) as refused:
            await turns.turn_cancel(owner=owner, message_id=message_id)
        assert refused.value.code == "cancel_unavailable"
        await wait_for(lambda: not bus.connected)
        server.start()
        await wait_for(lambda: bus.connected)
        assert await turns.turn_cancel(owner=owner, message_id=message_id) == "sent"
        await wait_for(lambda: heard)
        assert heard == [CancelAnswer(message_id, owner.digest)]
    finally:
        await bus.stop()
        server.stop()
