"""Database connections around a request: a streamed answer gives its request's connection back
once the turn is admitted, and on PostgreSQL requests borrow connections from Django's pool
instead of opening one each (Django gives every ASGI request a thread of its own). `DATABASE_URL`
parses into the pool's settings.

Real database (SQLite, or PostgreSQL in the suite's second pass), real Redis, the whole ASGI
application; a scripted backend for the answer.
"""

from __future__ import annotations

import asyncio
import json
import threading

import psycopg
import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from chat.stores import apikeys
from harness.scripted import Answer
from project.settings_parsers import POSTGRES_POOL_SIZE, database_settings
from tests.test_openai_views import _user_with_key, http_scope, request

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def open_connections(monkeypatch) -> dict:
    """The threads holding an open connection right now: thread id -> its connection wrapper."""
    held: dict[int, BaseDatabaseWrapper] = {}

    def opened(sender, connection, **kwargs):  # noqa: ARG001 (Django's signature)
        held[threading.get_ident()] = connection

    # The backend's own close: SQLite's keeps a test's in-memory database open, by design.
    wrapper = type(connections["default"])
    close = wrapper.close

    def closing(self):
        close(self)
        if held.get(threading.get_ident()) is self:
            del held[threading.get_ident()]

    connection_created.connect(opened)
    monkeypatch.setattr(wrapper, "close", closing)
    yield held
    connection_created.disconnect(opened)


@pytest.fixture
def key_checks(monkeypatch) -> list[int]:
    """The thread of each API key check, the first thing a `/v1` request does in its thread."""
    threads: list[int] = []
    check = apikeys.apikey_check

    def checking(raw_key):
        threads.append(threading.get_ident())
        return check(raw_key)

    monkeypatch.setattr(apikeys, "apikey_check", checking)
    return threads


async def test_a_streamed_answer_holds_no_connection_of_its_request_while_it_streams(
    scripted, key_checks, open_connections
):
    """The request's thread checked the key, stored the turn; while the answer streams, that
    thread holds no connection (on PostgreSQL it is back in the pool for the next request)."""
    _user, key = await sync_to_async(_user_with_key)("ada")
    scripted(Answer(("Hel", "lo"), wait_for_cancel=True))
    from project.asgi import application

    communicator = ApplicationCommunicator(
        application,
        http_scope("POST", "/v1/chat/completions", {"Authorization": f"Bearer {key}"}),
    )
    body = {"model": "smollm2", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    await communicator.send_input(
        {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
    )
    start = await communicator.receive_output(timeout=30)
    assert start["status"] == 200
    received = b""
    # Its text (the two chunks may arrive as one delta); the answer then goes on generating.
    while b'"content": "Hel' not in received:
        received += (await communicator.receive_output(timeout=30))["body"]
    (request_thread,) = key_checks
    if connection.settings_dict["CONN_MAX_AGE"] == 0:  # SQLite keeps it (request_threads.py)
        assert request_thread not in open_connections
    await communicator.send_input({"type": "http.disconnect"})  # Stop: the answer ends
    await communicator.wait(timeout=10)


@pytest.mark.skipif(
    connection.vendor != "postgresql" or "pool" not in connection.settings_dict["OPTIONS"],
    reason="the pool is PostgreSQL's (psycopg_pool), on unless DATABASE_URL says ?pool=0",
)
async def test_on_postgresql_requests_borrow_pooled_connections_instead_of_connecting(
    monkeypatch,
):
    _user, key = await sync_to_async(_user_with_key)("ada")
    await request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})  # warm
    connects = []
    connect = psycopg.Connection.connect.__func__

    def counting(cls, *args, **kwargs):
        connects.append(1)
        return connect(cls, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(counting))
    for _ in range(8):  # each a request thread of its own, each reading the key
        listed = await request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert listed.status_code == 200
    await asyncio.sleep(0)
    assert len(connects) <= 1  # the pool may grow by one; a connection a request would be 8


def test_database_url_sets_the_pool_on_postgresql_only():
    pooled = database_settings("postgres://chat@db:5432/chat")
    pool = pooled["OPTIONS"]["pool"]
    assert pool["max_size"] == POSTGRES_POOL_SIZE and pool["min_size"] == 1
    assert pooled["CONN_HEALTH_CHECKS"]  # the pool checks a connection as it lends it
    assert database_settings("postgres://chat@db/chat?pool=5")["OPTIONS"]["pool"]["max_size"] == 5
    assert "pool" not in database_settings("postgres://chat@db/chat?pool=0")["OPTIONS"]
    assert "pool" not in database_settings("sqlite:///tmp/x.sqlite3")["OPTIONS"]
    kept = database_settings("postgres://chat@db/chat?sslmode=require&pool=3")["OPTIONS"]
    assert kept["sslmode"] == "require" and kept["pool"]["max_size"] == 3
    for bad in ("x", "-1"):
        with pytest.raises(ImproperlyConfigured, match="DATABASE_URL pool"):
            database_settings(f"postgres://chat@db/chat?pool={bad}")
