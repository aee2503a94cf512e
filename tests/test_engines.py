"""Two engines in one process: the bundled local model (the default engine) and a real remote one
(`transformers serve`, the `peer` fixture, reached through a cuttable TCP relay), each answering
its own policy. Who may use an engine, which engine an answer names, what a cached answer and a
budget know of it, and an engine that stops mid-answer beside one that goes on."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from chat.infra.runtime import runtime as chat_runtime
from chat.models import Engine, Usage
from chat.stores.apikeys import apikey_create
from tests.test_consumer import LONG
from tests.test_http_api import HttpVisitor
from tests.test_openai_views import post, request

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

QUESTION = "Count from 1 to 10, separated by commas."
REMOTE_WEIGHT = 3.0


class Relay:
    """A TCP relay on loopback in front of the peer; `cut()` drops every connection and stops
    listening, as a server that died would."""

    def __init__(self, port: int):
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.accepted = 0  # connections relayed so far
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        # Shut down first: a close alone leaves the thread blocked in accept() still accepting.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for end in self.open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


@pytest.fixture
def relay(peer):
    relay = Relay(int(peer.base_url.split(":")[-1].split("/")[0]))
    yield relay
    relay.cut()


@pytest.fixture
def engines(runtime, peer, relay, make_policy):
    """`near` (the default engine, everyone's), `far` (the peer, for the `remote` group only,
    weighing three), `far-or-near` (the peer, falling back to a local row on the default
    model) and `far-or-default` (the peer, falling back to the default engine itself). The
    runtime forgets the rows' stacks afterwards: a flushed table gives ids back."""
    group = Group.objects.create(name="remote")
    remote = Engine.objects.create(
        name="Peer engine",
        slug="peer",
        kind=Engine.Kind.REMOTE,
        api_root=f"http://127.0.0.1:{relay.port}/v1",
        served_model=peer.model,
        cost_weight=REMOTE_WEIGHT,
        timeout_seconds=30,
    )
    remote.groups.add(group)
    local = Engine.objects.create(name="Local engine", slug="local", kind=Engine.Kind.LOCAL)
    # Greedy and cached: every answer ends at its first comma, space or line break (a stop, so
    # it is cached), within a few tokens whatever the wording.
    common = dict(
        mode="stream", max_new_tokens=12, stop_strings=[",", " ", "\n"], cache_enabled=True
    )
    make_policy(slug="near", **common)
    make_policy(slug="far", engine=remote, **common)
    make_policy(slug="far-or-near", engine=remote, fallback_engine=local, **common)
    make_policy(slug="far-or-default", engine=remote, fallback_to_default=True, **common)
    make_policy(slug="far-long", engine=remote, mode="stream", max_new_tokens=200)
    make_policy(slug="near-long", mode="stream", max_new_tokens=48)
    # Shows nothing before the end (held back whole), falling back to the local row.
    make_policy(
        slug="far-quiet",
        engine=remote,
        fallback_engine=local,
        mode="stream",
        max_new_tokens=48,
        holdback_chars=5000,
    )
    User = get_user_model()
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    alice.groups.add(group)
    yield {"alice": alice, "bob": bob, "remote": remote}
    chat_runtime.engines.close()


def session_of(user) -> str:
    browser = Client()
    browser.force_login(user)
    return browser.cookies["sessionid"].value


async def cached(done: dict, timeout: float = 10) -> None:
    """Wait until the answer `done` ended is in the completion cache under its identity."""
    from chat.models import Message
    from chat.stores.cache import completion_cache

    identity = (await Message.objects.aget(pk=done["message"])).identity
    assert identity
    deadline = time.monotonic() + timeout
    while await sync_to_async(completion_cache.get)(identity) is None:
        assert time.monotonic() < deadline, "the answer was never cached"
        await asyncio.sleep(0.05)


async def ask(chat, text: str, policy: str, until: str = "done") -> dict:
    request_id = await chat.prompt(text, policy=policy)
    return (await chat.receive_until(until, request_id, timeout=180))[-1]


async def test_a_user_outside_the_engines_group_can_neither_see_nor_use_its_policies(
    engines, make_client, application
):
    """bob is not in `remote`: the page's picker, the socket, /api, /v1 and /v1/models all
    answer as if `far` did not exist; alice, in the group, is answered by the peer."""
    alice, bob = engines["alice"], engines["bob"]
    bob_session, alice_session = (
        await sync_to_async(session_of)(bob),
        await sync_to_async(session_of)(alice),
    )
    bob_key = (await sync_to_async(apikey_create)(user=bob, name="t"))[1]
    alice_key = (await sync_to_async(apikey_create)(user=alice, name="t"))[1]

    page = await request("GET", "/", headers={"Cookie": f"sessionid={bob_session}"})
    assert b'value="near"' in page.body and b'value="far"' not in page.body
    page = await request("GET", "/", headers={"Cookie": f"sessionid={alice_session}"})
    assert b'value="far"' in page.body and b"Peer engine" in page.body

    chat = await make_client(session_key=bob_session)
    refused = await ask(chat, QUESTION, "far", until="error")
    assert refused["code"] == "unknown_policy"
    status, error, _ = await HttpVisitor(application, bob_session).post(
        "/api/chat", {"text": QUESTION, "policy": "far"}
    )
    assert status == 404 and error["code"] == "unknown_policy"
    response, body = await post(
        bob_key,
        {"model": "smollm2:far", "messages": [{"role": "user", "content": QUESTION}]},
    )
    assert response.status_code == 404 and body["error"]["code"] == "model_not_found"

    listed = {
        name: {m["id"] for m in (await request("GET", "/v1/models", headers=h)).json()["data"]}
        for name, h in (
            ("bob", {"Authorization": f"Bearer {bob_key}"}),
            ("alice", {"Authorization": f"Bearer {alice_key}"}),
        )
    }
    assert "smollm2:far" not in listed["bob"] and "smollm2:near" in listed["bob"]
    assert {"smollm2", "smollm2:far", "smollm2:near"} <= listed["alice"]

    done = await ask(await make_client(session_key=alice_session), QUESTION, "far")
    assert done["metrics"]["engine"] == "Peer engine" and done["metrics"]["fallback"] is False


async def test_each_engine_answers_its_policy_caches_its_own_and_charges_by_weight(
    engines, make_client, peer
):
    """One process, two engines: `near` by the local model, `far` by the peer, each cached under
    its own identity (a repeat is its own engine's hit), each charged its engine's weight."""
    alice = engines["alice"]
    chat = await make_client(session_key=await sync_to_async(session_of)(alice))
    near = await ask(chat, QUESTION, "near")
    far = await ask(chat, QUESTION, "far")
    assert (near["cached"], far["cached"]) == (False, False)
    assert near["metrics"]["engine"] == "default"
    assert far["metrics"]["engine"] == "Peer engine" and far["metrics"]["model"] == peer.model
    assert near["metrics"]["model"] != peer.model

    # The answer is cached just after its `done`. A repeat sent the moment that `done` arrives
    # is answered by the same engine with the same text (shared, generated anew or cached);
    # once the answer is cached, the next repeat is its own engine's hit.
    again = await ask(chat, QUESTION, "far")
    assert again["text"] == far["text"] and again["metrics"]["engine"] == "Peer engine"
    await cached(far)
    hit = await ask(chat, QUESTION, "far")
    assert hit["cached"] is True and hit["text"] == far["text"]
    assert hit["metrics"]["engine"] == "Peer engine"

    usage = {
        (row.policy, row.engine): row.tokens
        async for row in Usage.objects.filter(user=alice, policy__in=["near", "far"])
    }
    assert usage[("near", "")] == near["metrics"]["new_tokens"] > 0
    generated = far["metrics"]["new_tokens"] + again["metrics"]["new_tokens"]
    assert usage[("far", "Peer engine")] == REMOTE_WEIGHT * generated > 0


async def relayed(relay: Relay, count: int) -> None:
    """Wait until the relay has passed `count` connections on to the peer."""
    deadline = time.monotonic() + 60
    while relay.accepted < count:
        assert time.monotonic() < deadline, "the stream never reached the peer"
        await asyncio.sleep(0.02)


async def test_an_engine_that_stops_mid_answer_fails_alone(engines, make_client, relay):
    """The peer dies while it answers `far-long` and `far-quiet`, and the local model answers
    `near-long` beside them: the remote answer that had shown text ends in `engine_unavailable`
    (what it wrote kept), the one that had shown nothing is answered by its fallback from the
    start, saying so, the local one finishes untouched, the peer's policies are then refused at
    once, and `far-or-near` and `far-or-default` are answered by their fallbacks, saying so."""
    session = await sync_to_async(session_of)(engines["alice"])
    local_chat, remote_chat, quiet_chat = (
        await make_client(session_key=session),
        await make_client(session_key=session),
        await make_client(session_key=session),
    )
    remote_id = await remote_chat.prompt(LONG, policy="far-long")
    await remote_chat.receive_until("chunk", remote_id, timeout=180)
    local_id = await local_chat.prompt(LONG, policy="near-long")
    await local_chat.receive_until("chunk", local_id, timeout=180)
    before = relay.accepted
    quiet_id = await quiet_chat.prompt(LONG, policy="far-quiet")
    await quiet_chat.receive_until("accepted", quiet_id, timeout=180)
    await relayed(relay, before + 1)  # its stream is open at the peer, nothing of it shown

    relay.cut()
    failed = (await remote_chat.receive_until("error", remote_id, timeout=60))[-1]
    assert failed["code"] == "engine_unavailable"
    quiet = [await quiet_chat.receive(timeout=180)]
    while quiet[-1]["type"] not in ("done", "error"):
        quiet.append(await quiet_chat.receive(timeout=180))
    assert quiet[-1]["type"] == "done" and quiet[-1]["request_id"] == quiet_id, quiet[-1]
    assert quiet[-1]["metrics"]["engine"] == "Local engine" and quiet[-1]["text"]
    assert quiet[-1]["metrics"]["fallback"] is True
    local_done = (await local_chat.receive_until("done", local_id, timeout=180))[-1]
    assert local_done["finish_reason"] in ("length", "eos") and local_done["text"]
    assert local_done["metrics"]["engine"] == "default"

    refused = await ask(remote_chat, QUESTION, "far", until="error")
    assert refused["code"] == "engine_unavailable"
    stood_in = await ask(remote_chat, QUESTION, "far-or-near")
    assert stood_in["metrics"]["engine"] == "Local engine"
    assert stood_in["metrics"]["fallback"] is True and stood_in["text"]
    by_default = await ask(remote_chat, QUESTION, "far-or-default")
    assert by_default["metrics"]["engine"] == "default"
    assert by_default["metrics"]["fallback"] is True and by_default["text"]


def test_the_workbench_runs_a_draft_on_both_engines_side_by_side(engines, peer, runtime):
    """Staff try a draft of `far` on its own engine (the peer) and on the default engine at once:
    one column each, each answered by its own model."""
    from chat.models import OutputPolicy
    from tests.test_workbench import form_data

    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("staff", "s@example.com", "pw"))
    policy = OutputPolicy.objects.get(slug="far")
    data = {
        **form_data(policy),
        "engine": str(engines["remote"].pk),
        "trial_prompt": QUESTION,
        "trial_engines": ["default"],
    }
    response = staff.post(f"/admin/chat/outputpolicy/{policy.pk}/try/", data)
    html = response.content.decode()
    assert response.status_code == 200, html[:2000]
    columns = re.findall(r'class="trial-engine" data-engine="([^"]+)"', html)
    assert columns == ["Peer engine", "default"]
    side = html[html.index('id="trial-side-by-side"') :]
    assert "errornote" not in side
    assert peer.model in side and runtime.backend.model_id in side
