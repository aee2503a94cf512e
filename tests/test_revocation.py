"""Revoking an API key stops the answers it is generating, in this process and in the others
(through the cancel bus), and the key is refused from then on; whichever way it is revoked."""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import time
from io import StringIO
from urllib.parse import urlsplit

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from chat import turns
from chat.models import ApiKey, Message
from chat.stores import erasure
from chat.stores.apikeys import apikey_create, apikey_revoke
from chat.turns.cancel_bus import GROUP, CancelKeys
from harness.scripted import Answer
from tests.conftest import wait_for
from tests.test_consumer import LONG
from tests.test_openai_views import ask, post

pytestmark = pytest.mark.django_db(transaction=True)


def streamed(events: list) -> tuple[str, dict]:
    """(the content streamed, the final choice) of a /v1 stream's events."""
    chunks = [event for event in events if event != "[DONE]" and event["choices"]]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    return text, chunks[-1]["choices"][0]


async def running_on(key_id: int, timeout: float = 60):
    """The turn running here on API key `key_id`, once it has started."""
    for _ in range(int(timeout * 50)):
        found = [t for t in turns.running_turns.unfinished() if t.api_key_id == key_id]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no turn running on key {key_id}")


@pytest.fixture
def keys():
    """A user with two API keys: (user, (row, key), (row, key))."""
    user = get_user_model().objects.create_user("carol", password="pw-carol-1")
    return user, apikey_create(user=user, name="one"), apikey_create(user=user, name="two")


@pytest.mark.unit
async def test_revoking_a_key_on_the_account_page_stops_its_stream_and_no_other(scripted, keys):
    """The page's Revoke ends the key's running stream as cancelled and stores it so; the same
    user's other key goes on; the revoked key then gets 401."""
    user, (row_one, key_one), (row_two, key_two) = keys
    scripted(Answer(("Partial",), wait_for_cancel=True), Answer(("Other",), wait_for_cancel=True))
    first = asyncio.create_task(post(key_one, ask("one", stream=True, max_tokens=50)))
    turn_one = await running_on(row_one.pk)
    second = asyncio.create_task(post(key_two, ask("two", stream=True, max_tokens=50)))
    turn_two = await running_on(row_two.pk)

    def revoke_on_the_page():
        page = Client()
        page.force_login(user)
        return page.post("/account/api-keys/", {"revoke": "1", "key": row_one.pk})

    assert (await sync_to_async(revoke_on_the_page)()).status_code == 302
    response, events = await asyncio.wait_for(first, 10)
    text, choice = streamed(events)
    assert (choice["native_finish_reason"], choice["finish_reason"]) == ("cancelled", "stop")
    assert text == "Partial"
    stored = await Message.objects.aget(pk=turn_one.message_id)
    assert (stored.status, stored.finish_reason) == ("cancelled", "cancelled")
    await asyncio.sleep(0.2)
    assert not second.done() and not turn_two.cancel_requested
    refused, body = await post(key_one, ask("again"))
    assert refused.status_code == 401, body
    turn_two.cancel()
    await asyncio.wait_for(second, 10)


@pytest.mark.unit
async def test_deactivating_a_user_stops_their_keys_streams_and_refuses_the_keys(scripted, keys):
    """A key no longer works once its user is deactivated (no revocation needed): the save's
    notice on the bus stops the answers it runs, and the next request is refused."""
    user, (row, key), _ = keys
    scripted(Answer(("Partial",), wait_for_cancel=True))
    running = asyncio.create_task(post(key, ask("one", stream=True, max_tokens=50)))
    turn = await running_on(row.pk)
    await wait_for(lambda: turns.cancel_bus.connected)

    def deactivate():
        user.is_active = False
        user.save()

    await sync_to_async(deactivate)()
    _, choice = streamed((await asyncio.wait_for(running, 10))[1])
    assert choice["native_finish_reason"] == "cancelled" and turn.cancel_requested
    refused, body = await post(key, ask("again"))
    assert refused.status_code == 401 and "deactivated" in str(body), body


@pytest.mark.unit
async def test_a_revocation_heard_on_the_bus_stops_the_keys_stream_here(scripted, keys):
    """What another process publishes when it revokes a key (CancelKeys, over the channel layer)
    reaches this process's listener and stops the key's stream here."""
    _, (row, key), _ = keys
    scripted(Answer(("Partial",), wait_for_cancel=True))
    running = asyncio.create_task(post(key, ask("one", stream=True, max_tokens=50)))
    turn = await running_on(row.pk)
    await wait_for(lambda: turns.cancel_bus.connected)
    await turns.cancel_bus.publish(CancelKeys((row.pk,)))
    _, choice = streamed((await asyncio.wait_for(running, 10))[1])
    assert choice["native_finish_reason"] == "cancelled"
    assert turn.cancel_requested


@pytest.mark.unit
async def test_a_key_revoked_while_its_turn_is_prepared_is_stopped_at_once(
    scripted, keys, monkeypatch
):
    """A revocation that commits while the turn is being prepared, before it is registered where
    a cancel looks, is caught by the check admit makes once the turn can be stopped."""
    admit_module = importlib.import_module("chat.turns.admit")  # the package exports admit()
    _, (row, key), _ = keys
    scripted(Answer(("Partial",), wait_for_cancel=True))
    prepare = admit_module.prepare_prompt

    def revoked_meanwhile(*args, **kwargs):
        ApiKey.objects.filter(pk=row.pk).update(revoked_at="2026-01-01T00:00:00Z")
        return prepare(*args, **kwargs)

    monkeypatch.setattr(admit_module, "prepare_prompt", revoked_meanwhile)
    response, events = await asyncio.wait_for(post(key, ask("one", stream=True)), 10)
    assert streamed(events)[1]["native_finish_reason"] == "cancelled"


@pytest.mark.unit
async def test_every_way_to_revoke_tells_every_process(keys, admin_user):
    """The command, the admin's action and an account's deletion each publish the revoked keys'
    ids to every process (where their answers run), and only those ids."""
    user, (row_one, _), (row_two, _) = keys
    other = await sync_to_async(get_user_model().objects.create_user)("dave")
    other_row, _ = await sync_to_async(apikey_create)(user=other)
    layer = get_channel_layer()
    spy = await layer.new_channel(prefix="spy")
    await layer.group_add(GROUP, spy)

    async def heard() -> list[int]:
        while True:  # other suites on the same Redis may publish to the group too
            message = await asyncio.wait_for(layer.receive(spy), 10)
            if message["type"] == CancelKeys.kind:
                return message["api_keys"]

    def admin_revokes(key_id: int):
        admin = Client()
        admin.force_login(admin_user)
        return admin.post("/admin/chat/apikey/", {"action": "revoke", "_selected_action": [key_id]})

    try:
        await sync_to_async(call_command)("apikey", "revoke", str(row_one.pk), stdout=StringIO())
        assert await heard() == [row_one.pk]
        assert (await sync_to_async(admin_revokes)(other_row.pk)).status_code == 302
        assert await heard() == [other_row.pk]
        await sync_to_async(erasure.account_erase)(user=user)
        assert await heard() == [row_two.pk]  # row_one was revoked already
    finally:
        await layer.group_discard(GROUP, spy)


@pytest.mark.unit
def test_revoking_someone_elses_key_stops_nothing(keys, monkeypatch):
    """A revoke that changes no key (another user's, or one already revoked) cancels nothing."""
    user, (row, _), _ = keys
    stopped = []
    monkeypatch.setattr(turns, "api_keys_stop", stopped.append)
    other = get_user_model().objects.create_user("erin")
    assert not apikey_revoke(key_id=row.pk, user=other)
    assert apikey_revoke(key_id=row.pk, user=user)
    assert not apikey_revoke(key_id=row.pk, user=user)
    assert stopped == [[row.pk]]


@pytest.mark.integration
async def test_revoking_mid_answer_on_the_real_model_ends_the_stream_at_once(runtime, keys):
    """The real model generating a long answer for the key: revoked, the stream ends within a
    second or so, cancelled, with the text so far; the key then gets 401."""
    _, (row, key), _ = keys
    running = asyncio.create_task(post(key, ask(LONG, stream=True, max_tokens=1000)))
    turn = await running_on(row.pk)
    await wait_for(lambda: turn._run.first_token_at is not None, timeout=120)
    revoked_at = time.monotonic()
    assert await sync_to_async(apikey_revoke)(key_id=row.pk)
    response, events = await asyncio.wait_for(running, 30)
    ended_in = time.monotonic() - revoked_at
    text, choice = streamed(events)
    assert choice["native_finish_reason"] == "cancelled" and text
    assert ended_in < 5, ended_in
    refused, _ = await post(key, ask("again"))
    assert refused.status_code == 401


# -- live: a real daphne, the key revoked by another process ---------------------------------


@pytest.fixture(scope="module")
def live(daphne_server):
    """The session's daphne on the real model, a user of this module's and its key: (server,
    key, key id)."""
    server = daphne_server
    server.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as U; "
        "U().objects.get_or_create(username='revoked')",
    )
    key = server.manage("apikey", "create", "--user", "revoked").strip().splitlines()[-1]
    key_id = server.manage("apikey", "list", "--user", "revoked").strip().splitlines()[-1]
    return server, key, key_id.split("\t")[0]


def v1_stream(url: str, key: str, body: dict):
    """POST /v1/chat/completions with stream on; yields each `data:` payload as it arrives."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    connection.request(
        "POST",
        "/v1/chat/completions",
        json.dumps({**body, "stream": True}),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    try:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                yield data if data == "[DONE]" else json.loads(data)
    finally:
        connection.close()


@pytest.mark.integration
def test_live_a_key_revoked_by_another_process_ends_its_stream_and_is_refused(live):
    """Over a real socket: a long streamed answer on the real model; `manage.py apikey revoke`,
    another process, revokes the key mid-stream; the daphne hears it on the bus and the stream
    ends promptly, cancelled; the next request with the key is a 401."""
    server, key, key_id = live
    events = v1_stream(server.url, key, ask(LONG, max_tokens=1000))
    seen = []
    for event in events:
        seen.append(event)
        if event["choices"] and event["choices"][0]["delta"].get("content"):
            break
    started = time.monotonic()
    server.manage("apikey", "revoke", key_id)
    seen.extend(events)
    ended_in = time.monotonic() - started
    text, choice = streamed(seen)
    assert (choice["native_finish_reason"], choice["finish_reason"]) == ("cancelled", "stop")
    assert text and seen[-1] == "[DONE]"
    assert ended_in < 15, ended_in  # the command's own start-up is most of it
    connection = http.client.HTTPConnection(urlsplit(server.url).hostname, server.port, timeout=30)
    connection.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(ask("again", max_tokens=5)),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    refused = connection.getresponse()
    assert refused.status == 401
    assert json.loads(refused.read())["error"]["code"] == "invalid_api_key"
