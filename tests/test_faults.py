"""Faults against a real daphne: the database locked at the end of a turn, Redis stopped, a stopped server."""

import asyncio
import json
import sqlite3

import pytest
import websockets
from asgiref.sync import sync_to_async

from chat.models import Conversation, Message
from chat.stores.recovery import INTERRUPTED
from harness.liveserver import LiveServer
from tests.conftest import LIVE_CACHE_URL, wait_for
from tests.test_cache import RedisServer

LONG = "Write a very long story about a dragon who learns to bake bread."
SHORT = "Count from 1 to 5, separated by commas."


async def events_until(ws, kind: str, request_id: str) -> list[dict]:
    """Every event up to the first `kind` (or `error`) for `request_id`; bounded so a hang fails, not blocks."""
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        events.append(event)
        if event.get("request_id") == request_id and event["type"] in {kind, "error"}:
            return events


def row(db_path, message_id: int) -> dict:
    with sqlite3.connect(db_path) as db:
        db.row_factory = sqlite3.Row
        found = db.execute(
            "SELECT m.status, m.text, m.finish_reason, m.error, c.updated_at FROM chat_message m "
            "JOIN chat_conversation c ON c.id = m.conversation_id WHERE m.id = ?",
            (message_id,),
        ).fetchone()
    return dict(found)


@pytest.fixture(scope="module")
def locked_db_server(tmp_path_factory):
    """A daphne whose SQLite writes give up after 0.2 s of waiting for a lock (the default is 5 s).

    Its cache is the one emptied before every test: a cache hit is stored after its `done`, by design.
    Shared by the module's tests (a daphne start each saved): each releases its lock and leaves the
    chat answering, which is what the next one starts from.
    """
    workdir = tmp_path_factory.mktemp("locked")
    server = LiveServer(
        workdir,
        database_url=f"sqlite:///{workdir / 'live.sqlite3'}?timeout=0.2",
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
    ).start()
    yield server, workdir / "live.sqlite3"
    server.stop()


@pytest.mark.integration
async def test_a_database_locked_at_the_end_of_a_turn_is_a_clear_error_and_nothing_half_written(
    locked_db_server,
):
    """Another connection holds SQLite's write lock as the answer ends: the client gets `storage_failed`
    and its `done`, a new prompt gets `storage_failed` at once, the message and its conversation stay
    untouched together; once the lock goes, the answer is stored late, whole, and chat goes on."""
    server, db_path = locked_db_server
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "a", "text": LONG}))
        events = await events_until(ws, "chunk", "a")
        message_id = events[0]["message"]
        before = row(db_path, message_id)
        locker = sqlite3.connect(db_path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # holds the one writer's lock; readers go on (WAL)
        try:
            await ws.send(json.dumps({"type": "cancel", "request_id": "a"}))
            events += await events_until(ws, "error", "a")
            assert events[-1]["code"] == "storage_failed" and "database" in events[-1]["message"]
            done = (await events_until(ws, "done", "a"))[-1]
            assert done["type"] == "done" and done["finish_reason"] == "cancelled"
            shown = "".join(e["text"] for e in events if e["type"] == "chunk")
            assert done["text"] == shown and shown
            # Nothing half-written: neither the message nor its conversation moved.
            assert row(db_path, message_id) == before and before["status"] == "streaming"
            await ws.send(json.dumps({"type": "prompt", "request_id": "b", "text": SHORT}))
            refused = (await events_until(ws, "accepted", "b"))[-1]
            assert (refused["type"], refused["code"]) == ("error", "storage_failed")
            assert "try again" in refused["message"]
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        for _ in range(600):  # the background write retries every few seconds; bounded
            stored = row(db_path, message_id)
            if stored["status"] != "streaming":
                break
            await asyncio.sleep(0.1)
        assert (stored["status"], stored["finish_reason"], stored["text"]) == (
            "cancelled",
            "cancelled",
            shown,
        )
        assert stored["updated_at"] > before["updated_at"]  # the conversation moved with it
        await ws.send(json.dumps({"type": "prompt", "request_id": "c", "text": SHORT}))
        assert (await events_until(ws, "done", "c"))[-1]["type"] == "done"
    with sqlite3.connect(db_path) as db:
        assert (
            db.execute(
                "SELECT id, role, status, request_id FROM chat_message WHERE status = 'streaming'"
            ).fetchall()
            == []
        )
    assert (
        "Traceback" not in server.log_path.read_text()
    )  # refused cleanly, never an exception in the consumer


@pytest.mark.integration
async def test_a_new_socket_while_the_database_is_locked_is_told_why_and_closed_then_works(
    locked_db_server,
):
    """A visitor without a session needs one written; while SQLite is locked the socket gets a
    `storage_failed` error and a close (4503), no traceback; once the lock goes it connects and chats."""
    server, db_path = locked_db_server
    locker = sqlite3.connect(db_path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        async with websockets.connect(server.ws_url, origin=server.url) as ws:
            refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert (refused["type"], refused["code"]) == ("error", "storage_failed")
            with pytest.raises(websockets.exceptions.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)
            assert ws.close_code == 4503
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "a", "text": SHORT}))
        assert (await events_until(ws, "done", "a"))[-1]["type"] == "done"
    assert "Traceback" not in server.log_path.read_text()


@pytest.mark.unit
@pytest.mark.django_db
def test_answers_left_streaming_are_marked_interrupted_when_the_server_starts(settings):
    """A process that died mid-answer leaves `streaming` rows; its start-up (which migrates) closes
    them, and only them: another live process's answers on the same database keep streaming."""
    from django.core.management.sql import emit_post_migrate_signal

    settings.CHAT_INSTANCE = "web-1:8001"
    conversation = Conversation.objects.create(session_key="s", title="t")
    stuck = Message.objects.create(
        conversation=conversation,
        role="assistant",
        status="streaming",
        text="Once",
        instance="web-1:8001",
    )
    older = Message.objects.create(
        conversation=conversation, role="assistant", status="streaming", text="Old"
    )
    elsewhere = Message.objects.create(
        conversation=conversation,
        role="assistant",
        status="streaming",
        text="Going",
        instance="web-1:8002",
    )
    finished = Message.objects.create(
        conversation=conversation, role="assistant", status="done", text="Hi", instance="web-1:8001"
    )
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
    for message in (stuck, older, elsewhere, finished):
        message.refresh_from_db()
    # Interrupted, with the text saved as it grew (chat/stores/partial.py): Continue may finish it.
    assert (stuck.status, stuck.finish_reason, stuck.error, stuck.text) == (
        "interrupted",
        "interrupted",
        INTERRUPTED,
        "Once",
    )
    assert (older.status, older.error) == (
        "interrupted",
        INTERRUPTED,
    )  # from before answers named their process
    assert (elsewhere.status, elsewhere.error) == ("streaming", "")
    assert finished.status == "done"


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    if server.process.poll() is None:
        server.stop()


async def ask(server, text: str, request_id: str) -> list[dict]:
    async with websockets.connect(server.ws_url, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": request_id, "text": text}))
        return await events_until(ws, "done", request_id)


@pytest.mark.integration
async def test_the_whole_chat_keeps_answering_while_redis_is_stopped(tmp_path, redis_server):
    """Channel layer and cache both on a Redis that is stopped mid-run: new sockets connect and are answered
    (uncached), /healthz says degraded; Redis back: still answering, health ok again."""
    server = await sync_to_async(
        LiveServer(
            tmp_path, REDIS_URL=redis_server.url, CHAT_CACHE_REDIS_URL=redis_server.url
        ).start
    )()
    try:
        assert (await ask(server, SHORT, "before"))[-1]["type"] == "done"
        redis_server.stop()
        down = await ask(server, "Count from 1 to 6, separated by commas.", "down")
        assert down[-1]["type"] == "done" and [e["type"] for e in down].count("chunk") > 1
        assert down[-1]["finish_reason"] in ("eos", "length") and not down[-1]["cached"]
        status, health = server.health()
        assert (
            status == 200
            and health["status"] == "degraded"
            and health["redis"].startswith("unavailable")
        )
        redis_server.start()
        await asyncio.sleep(
            2.5
        )  # past the cache's back-off (chat.stores.cache.CompletionCache.backoff_seconds)
        assert (await ask(server, "Count from 1 to 7, separated by commas.", "after"))[-1][
            "type"
        ] == "done"
        assert server.health()[1]["status"] == "ok"
    finally:
        server.stop()
    assert "Traceback" not in server.log_path.read_text()


def on_postgresql() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


@pytest.mark.integration
@pytest.mark.skipif(
    not on_postgresql(),
    reason="terminates a PostgreSQL backend; the SQLite lock test covers SQLite",
)
@pytest.mark.django_db(transaction=True)
async def test_a_terminated_database_connection_at_the_end_of_a_turn_is_retried_on_a_fresh_one(
    client,
):
    """PostgreSQL kills the server's connection while the answer streams: the final write fails once,
    is retried on a new connection, and the client gets its `done` with no error; the answer is stored whole."""
    import psycopg
    from django.db import connection

    def server_backend() -> tuple[int, dict]:
        with connection.cursor() as cursor:  # the thread the turn's database work runs in
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0], connection.settings_dict

    request_id = await client.prompt(LONG)
    events = await client.receive_until("chunk", request_id)
    pid, db = await sync_to_async(server_backend)()
    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        dbname=db["NAME"],
        password=db["PASSWORD"] or None,
        autocommit=True,
    ) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    await client.send({"type": "cancel", "request_id": request_id})
    events += await client.receive_until("done", request_id)
    assert "error" not in [e["type"] for e in events]
    message = await sync_to_async(Message.objects.get)(pk=events[0]["message"])
    assert (message.status, message.text) == (
        "cancelled",
        "".join(e["text"] for e in events if e["type"] == "chunk"),
    )


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_a_running_answers_saves_share_one_connection_closed_once_it_ends():
    """The text saved as it grows goes through one connection of the writer thread while answers
    run (one opened for every save was a large part of a relayed answer's cost), and it is
    closed once the last answer ends."""
    import threading

    from django.db import connection
    from django.db.backends.signals import connection_created

    from chat.stores import partial

    def in_writer(call):
        return asyncio.wrap_future(partial._writer.submit(call))

    conversation = await Conversation.objects.acreate(session_key="s", title="t")
    message = await Message.objects.acreate(
        conversation=conversation, role="assistant", status="streaming", text=""
    )
    writer = await in_writer(threading.get_ident)
    opened: list[int] = []

    def note(sender, **kwargs):
        opened.append(threading.get_ident())

    connection_created.connect(note)
    try:
        saver = partial.PartialSaver(message.pk, every_s=0.01)
        for n in range(1, 6):
            saver.note("x" * n)
            await asyncio.sleep(0.1)  # a save for each
        await saver.close()
        open_after = await in_writer(lambda: connection.connection is not None)
        # Django never closes an in-memory SQLite database (the suite's SQLite pass).
        closable = await in_writer(
            lambda: connection.vendor != "sqlite" or not connection.is_in_memory_db()
        )
    finally:
        connection_created.disconnect(note)
    assert saver.writes >= 3
    if closable:
        assert opened.count(writer) == 1
    else:  # an in-memory SQLite connection opened by an earlier test is still the writer's
        assert opened.count(writer) <= 1
    assert not (open_after and closable)
    await message.arefresh_from_db()
    assert message.text == "xxxxx"


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_running_answers_are_saved_together_in_one_write(monkeypatch):
    """Every running answer's new text goes to the database in one write (one trip to the
    writer thread, one transaction), not one each: with answers relayed at a reading pace, a
    save of its own per answer was about a quarter of the web process's CPU per token. An answer
    whose text did not change is not written again, and one whose saver closed (its final store
    follows) is not written after that."""
    from chat.stores import partial

    writes: list[list[tuple[int, str]]] = []
    real = partial.partial_writes

    def counted(texts):
        writes.append(list(texts))
        return real(texts)

    monkeypatch.setattr(partial, "partial_writes", counted)
    conversation = await Conversation.objects.acreate(session_key="s", title="t")
    messages = [
        await Message.objects.acreate(
            conversation=conversation, role="assistant", status="streaming", text=""
        )
        for _ in range(3)
    ]
    savers = [partial.PartialSaver(m.pk, every_s=0.05) for m in messages]
    for n, saver in enumerate(savers):
        saver.note(f"answer {n}")
    await wait_for(lambda: all(s.writes for s in savers))
    assert len(writes) == 1
    assert sorted(writes[0]) == [(m.pk, f"answer {n}") for n, m in enumerate(messages)]

    await savers[2].close()
    await Message.objects.filter(pk=messages[2].pk).aupdate(status="done", text="final")
    savers[0].note("answer 0 grew")
    savers[2].note("too late")  # after its close: never written
    await wait_for(lambda: savers[0].writes == 2)
    assert [text for _, text in writes[-1]] == ["answer 0 grew"]
    for saver in savers[:2]:
        await saver.close()
    texts = {m.pk: m.text async for m in Message.objects.filter(conversation=conversation)}
    assert texts == {
        messages[0].pk: "answer 0 grew",
        messages[1].pk: "answer 1",
        messages[2].pk: "final",
    }


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_an_answer_ending_as_its_text_falls_due_for_a_save_still_ends():
    """The chunk that makes a save due and the answer's end in one loop turn. The saves'
    wait ends as the answer leaves: with a task per answer, Python 3.11's wait_for returned the
    wait's result as the task was cancelled and swallowed the cancel, so the saver went on and the
    turn waited on it for ever (an answer of 64 tokens, one chunk a token, hung at its end)."""
    from chat.stores import partial

    conversation = await Conversation.objects.acreate(session_key="s", title="t")
    message = await Message.objects.acreate(
        conversation=conversation, role="assistant", status="streaming", text=""
    )
    saver = partial.PartialSaver(message.pk, every_s=30, every_chunks=3)
    saver.note("a")
    for _ in range(3):
        await asyncio.sleep(0)  # the saves now wait for the next to fall due
    saver.note("ab")
    saver.note("abc")  # due: the wait ends in the next loop turn ...
    closing = asyncio.ensure_future(saver.close())  # ... as the answer leaves
    try:
        done, _ = await asyncio.wait({closing}, timeout=10)
        assert closing in done, "close() still waits for saves that never stopped"
    finally:
        closing.cancel()
    await message.arefresh_from_db()
    assert message.text in {"", "abc"}
