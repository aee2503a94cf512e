"""The threads Django runs each request's sync code in are kept for the next request
(project/request_threads.py): a request that follows another runs in the same thread and, on
SQLite, on the same connection; requests at once each have a thread of their own; threads
beyond the kept stock end with their connections closed. An answer's admission is one trip to
its thread, and where connections are kept a streamed answer has none to give back.

Real database (SQLite, or PostgreSQL in the suite's second pass), the whole ASGI application.
"""

from __future__ import annotations

import asyncio
import importlib
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created

from chat import turns
from chat.infra.runtime import runtime
from chat.protocol import Prompt
from chat.stores import apikeys
from chat.stores.selectors import Owner
from harness.scripted import Answer
from project.request_threads import RequestThreads
from tests.conftest import wait_for
from tests.test_async_middleware import hops  # noqa: F401 (the fixture)
from tests.test_database_connections import key_checks, open_connections  # noqa: F401 (fixtures)
from tests.test_openai_views import _user_with_key, ask, post, request
from tests.test_revocation import streamed

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]


async def test_a_request_after_another_runs_in_its_thread_on_its_connection(
    key_checks,  # noqa: F811 (the fixture imported above)
):
    _user, key = await sync_to_async(_user_with_key)("ada")
    auth = {"Authorization": f"Bearer {key}"}
    assert (await request("GET", "/v1/models", headers=auth)).status_code == 200
    opened: list[int] = []

    def counting(sender, connection, **kwargs):  # noqa: ARG001 (Django's signature)
        opened.append(threading.get_ident())

    connection_created.connect(counting)
    try:
        for _ in range(5):
            assert (await request("GET", "/v1/models", headers=auth)).status_code == 200
    finally:
        connection_created.disconnect(counting)
    assert len(key_checks) == 6 and len(set(key_checks)) == 1
    if connection.settings_dict["CONN_MAX_AGE"] is None:  # SQLite: the connection stays open
        assert opened == []


async def test_requests_at_once_each_have_a_thread_of_their_own(
    monkeypatch,
    key_checks,  # noqa: F811 (the fixture imported above)
):
    """Three requests whose sync code waits for the other two: with a thread shared between
    them it would never go on."""
    _user, key = await sync_to_async(_user_with_key)("ada")
    auth = {"Authorization": f"Bearer {key}"}
    # Its use noted first, so the three only read it (the suite's SQLite is an in-memory
    # database in shared-cache mode, where writers at once fail at once rather than wait).
    assert (await request("GET", "/v1/models", headers=auth)).status_code == 200
    together = threading.Barrier(3, timeout=10)
    check = apikeys.apikey_check

    def meeting(raw_key):
        together.wait()
        return check(raw_key)

    monkeypatch.setattr(apikeys, "apikey_check", meeting)
    answers = await asyncio.gather(*(request("GET", "/v1/models", headers=auth) for _ in range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert len(key_checks) == 4 and len(set(key_checks[1:])) == 3


async def test_an_answers_admission_is_one_trip_to_its_thread(
    scripted,
    monkeypatch,
    hops,  # noqa: F811 (the fixture imported above)
):
    """The rate and budget checks, the route, the stored prompt and the cache lookup of one
    answer run in one call on the request's thread, not a hand-off each (nor, for the rate
    check's Redis, on the event loop); on kept connections (SQLite) the stream gives none back
    before it waits."""
    _user, key = await sync_to_async(_user_with_key)("ada")
    scripted(Answer(("Hello", " there")))
    admit_module = importlib.import_module("chat.turns.admit")  # the package exports admit()
    rate_checked_in: list[int] = []
    rate_check = admit_module.turn_rate_check

    def noting(**kwargs):
        rate_checked_in.append(threading.get_ident())
        return rate_check(**kwargs)

    monkeypatch.setattr(admit_module, "turn_rate_check", noting)
    hops.clear()
    response, events = await post(key, ask("one", stream=True))
    assert response.status_code == 200
    assert streamed(events)[0] == "Hello there"
    assert hops["_admission"] == 1
    assert len(rate_checked_in) == 1 and rate_checked_in[0] != threading.get_ident()
    for separate in (
        "budget_check",
        "_routed",
        "closing_on_error",
        "CompletionCache.get",
        "entry_servable",
    ):
        assert separate not in hops
    if connection.settings_dict["CONN_MAX_AGE"] is None:
        assert "close_old_connections" not in hops


async def test_a_cancel_while_the_admission_runs_leaves_the_engine_expecting_nothing(
    scripted, monkeypatch
):
    """The engine is told to expect the prompt during the admission's trip to the thread; a
    prompt cancelled meanwhile (its client gone) withdraws that once the trip has returned, or
    the engine would wait for it before every step it starts alone."""
    user, _key = await sync_to_async(_user_with_key)("ada")
    scripted(Answer(("Hello",)))
    stack = runtime.stack
    told: list[int] = []
    monkeypatch.setattr(stack, "expect", lambda: told.append(1))
    monkeypatch.setattr(stack, "unexpect", lambda: told.append(-1))
    admit_module = importlib.import_module("chat.turns.admit")  # the package exports admit()
    entered, release = threading.Event(), threading.Event()
    prepare = admit_module.prepare_prompt

    def held(*args, **kwargs):
        entered.set()
        release.wait(10)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(admit_module, "prepare_prompt", held)

    async def sent(_event) -> None:
        pass

    admitting = asyncio.create_task(
        turns.admit(
            owner=Owner(user.pk, ""),
            prompt=Prompt(request_id="r1", text="one", conversation=None, policy=None),
            send=sent,
        )
    )
    assert await asyncio.to_thread(entered.wait, 10)
    admitting.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await admitting
    await wait_for(lambda: len(told) == 2, timeout=5)  # the thread goes on after the cancel
    assert told == [1, -1]


def test_threads_beyond_the_kept_stock_end_with_their_connections_closed(
    open_connections,  # noqa: F811 (the fixture imported above)
):
    threads = RequestThreads(keep_idle=1)
    first, second = threads.take(), threads.take()
    ran_in = {}
    for executor in (first, second):
        ran_in[executor] = executor.submit(_query_here).result(timeout=10)
    assert set(ran_in.values()) <= set(open_connections)
    threads.give_back(first)
    threads.give_back(second)  # one more than the stock keeps: it ends
    second.shutdown(wait=True)
    assert ran_in[second] not in open_connections  # closed in its own thread before it ended
    assert ran_in[first] in open_connections  # kept, with its connection, for the next request
    assert threads.take() is first and threads.made == 2
    first.submit(_close_here).result(timeout=10)
    first.shutdown(wait=True)


def _query_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return threading.get_ident()


def _close_here() -> None:
    connection.close()
