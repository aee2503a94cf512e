"""The OpenAI-compatible views in-process, on a scripted backend: keys, errors, policies, the
gate's verdicts in OpenAI's shape, and thousands of hostile bodies. The real model and the
official `openai` package are used in tests/test_openai_api.py."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.infra.ratelimit import prompt_limiter
from chat.models import Message, OutputPolicy
from chat.stores import selectors
from chat.stores.apikeys import apikey_create, apikey_revoke
from harness.examples import fuzz_examples
from harness.scripted import Answer

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]

URL = "/v1/chat/completions"
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}


def _user_with_key(name: str):
    user = get_user_model().objects.create_user(name)
    return user, apikey_create(user=user, name="test")[1]


@pytest.fixture
def alice():
    return _user_with_key("alice")


@pytest.fixture
def bob():
    return _user_with_key("bob")


class Response:
    """An HTTP response read whole from the ASGI application."""

    def __init__(self, status: int, headers: dict, body: bytes):
        self.status_code = status
        self.headers = headers
        self.body = body

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def json(self):
        return json.loads(self.body)


def http_scope(method: str, path: str, headers: dict | None = None) -> dict:
    """An HTTP request's ASGI scope as daphne makes it, JSON content and `headers` given."""
    return {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "query_string": b"",
        "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")]
        + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }


async def request(method: str, path: str, body: bytes = b"", headers: dict | None = None):
    """One request through the whole ASGI application (middleware included), as daphne makes it."""
    from project.asgi import application

    communicator = ApplicationCommunicator(application, http_scope(method, path, headers))
    await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await communicator.receive_output(timeout=30)
    parts = []
    while True:
        message = await communicator.receive_output(timeout=30)
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=5)
    found = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return Response(start["status"], found, b"".join(parts))


async def post(key: str | None, body, **headers):
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    # surrogatepass: a raw body with a lone surrogate goes out as the bytes no UTF-8 encoder makes.
    raw = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    response = await request("POST", URL, raw, headers)
    if response["content-type"].startswith("text/event-stream"):
        return response, sse_events(response.body.decode())
    return response, response.json()


def sse_events(text: str) -> list:
    blocks = [b for b in text.split("\n\n") if b.startswith("data: ")]
    return [b[6:] if b[6:] == "[DONE]" else json.loads(b[6:]) for b in blocks]


def ask(text: str = "Hi", **fields) -> dict:
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], **fields}


def assert_openai_error(response, body, status: int) -> dict:
    assert response.status_code == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


async def test_a_completion_is_a_chat_completion_with_usage_and_is_stored_under_the_key(
    scripted, alice
):
    """stream false: one chat.completion; the turn is stored as the key's user's, off the page list."""
    user, key = alice
    scripted(Answer(("Hello", " there.")))
    response, body = await post(key, ask("Say hello.", max_tokens=5))
    assert response.status_code == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "smollm2"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there.", "refusal": None}
    assert choice["finish_reason"] == "stop" and choice["native_finish_reason"] == "eos"
    assert body["usage"]["completion_tokens"] == 2
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2
    message = await Message.objects.select_related("conversation").aget(pk=body["message_id"])
    assert message.request_id == body["id"] and message.status == Message.Status.DONE
    assert message.conversation.user_id == user.pk and message.conversation.api_key_id
    owner = selectors.Owner(user_id=user.pk, session_key="")
    assert await sync_to_async(selectors.conversation_list)(owner) == []


async def test_the_given_messages_are_the_conversation_and_parameters_reach_the_engine(
    scripted, alice
):
    """system + earlier turns + the last user message, in order; stop/max_tokens/temperature too."""
    backend = scripted(Answer(("ok",)))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": [{"type": "text", "text": "1"}]},
        {"role": "user", "content": "Two?"},
    ]
    body = {
        "model": "smollm2",
        "messages": messages,
        "stop": "\n\n",
        "max_completion_tokens": 10**6,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
    }
    response, _ = await post(alice[1], body)
    assert response.status_code == 200
    request = backend.requests[0]
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "Two?"},
    ]
    params = request.params
    assert "\n\n" in params.stop_strings and params.temperature == 0.5 and params.top_p == 0.9
    assert params.seed == 7
    from django.conf import settings as django_settings

    assert params.max_new_tokens == django_settings.CHAT_MAX_NEW_TOKENS_CAP  # capped


async def test_a_stream_is_chunks_ending_with_finish_reason_usage_and_done(scripted, alice):
    """SSE: a role delta, content deltas, the finish chunk, the usage chunk, then [DONE]."""
    scripted(Answer(("Hel", "lo.")))
    response, events = await post(
        alice[1], ask(stream=True, stream_options={"include_usage": True})
    )
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


async def test_a_streams_body_goes_straight_to_the_servers_send(scripted, alice, monkeypatch):
    """Each piece is one `send` of the server's, not a trip through Django's response
    iteration (chat/transports/sse.py): Django chunks only the bodies it sends itself."""
    from django.core.handlers.asgi import ASGIHandler

    chunked: list[bytes] = []
    chunk_bytes = ASGIHandler.chunk_bytes

    def counting(data):
        chunked.append(data)
        return chunk_bytes(data)

    monkeypatch.setattr(ASGIHandler, "chunk_bytes", staticmethod(counting))
    scripted(Answer(("Hel", "lo.")))
    response, events = await post(alice[1], ask(stream=True))
    assert response.status_code == 200 and events[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1]) == "Hello."
    assert chunked == []


async def test_a_json_schema_answer_is_held_validated_reasked_and_sent_as_one_delta(
    scripted, alice
):
    """response_format json_schema: the invalid first answer is never streamed; the valid one
    arrives as a single content delta holding the JSON."""
    await OutputPolicy.objects.acreate(name="c", slug="chat", is_default=True, max_retries=1)
    backend = scripted(Answer(('{"answer": ', '""}')), Answer(('```json\n{"answer": "Paris"}```',)))
    response, events = await post(
        alice[1], ask("Capital of France?", stream=True, response_format=JSON_FORMAT)
    )
    contents = [
        c["choices"][0]["delta"]["content"]
        for c in events[:-1]
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert contents == ['{"answer": "Paris"}']
    assert len(backend.requests) == 2  # re-asked once
    assert "JSON Schema" in backend.requests[0].messages[0]["content"]  # the schema was asked for
    assert backend.requests[0].params.json_schema == ANSWER_SCHEMA  # strict or not, a schema binds


async def test_a_json_schema_answer_that_stays_invalid_is_a_refusal(scripted, alice):
    """After the policy's re-asks the answer is refused: no content, a refusal, nothing streamed."""
    await OutputPolicy.objects.acreate(name="s", slug="strict", max_retries=1)
    scripted(Answer(("nope",)), Answer(("still nope",)))
    response, body = await post(alice[1], ask(model="smollm2:strict", response_format=JSON_FORMAT))
    choice = body["choices"][0]
    assert (
        choice["message"]["content"] is None
        and "no valid structured answer" in (choice["message"]["refusal"])
    )
    assert choice["native_finish_reason"] == "invalid" and choice["finish_reason"] == "stop"
    message = await Message.objects.aget(pk=body["message_id"])
    assert message.finish_reason == "invalid" and message.retries == 1


async def test_strict_json_schema_constrains_decoding(scripted, alice):
    """`strict: true` is OpenAI's structured outputs: the engine gets the schema to constrain to."""
    backend = scripted(Answer(('{"answer": "x"}',)))
    strict = {"type": "json_schema", "json_schema": {**JSON_FORMAT["json_schema"], "strict": True}}
    response, body = await post(alice[1], ask(response_format=strict))
    assert json.loads(body["choices"][0]["message"]["content"]) == {"answer": "x"}
    assert backend.requests[0].params.json_schema == ANSWER_SCHEMA


async def test_a_moderated_stream_ends_with_content_filter(scripted, alice):
    """What streamed before a retraction cannot be unsent: the stream ends with content_filter."""
    await OutputPolicy.objects.acreate(name="c", slug="clean", blocklist_terms="forbidden")
    retracted = Answer(
        ("This is fine. " * 6, "Now a forbidden word. ", "More. " * 12), wait_for_cancel=True
    )
    backend = scripted(retracted, retracted)
    _, events = await post(alice[1], ask(model="smollm2:clean", stream=True))
    finish = [c["choices"][0] for c in events[:-1] if c["choices"]][-1]
    assert finish["finish_reason"] == "content_filter" and finish["delta"] == {}
    assert backend.requests[0].cancel.is_set()
    _, body = await post(alice[1], ask(model="smollm2:clean"))  # the same, not streamed
    assert body["choices"][0]["message"]["content"] == ""
    assert body["choices"][0]["finish_reason"] == "content_filter"


async def test_a_cache_hit_is_served_as_one_delta(scripted, alice):
    """A repeated request is answered from the cache, streamed as a single delta."""
    await OutputPolicy.objects.acreate(name="c", slug="cached", cache_enabled=True)
    backend = scripted(Answer(("Hello", ", world.")))
    _, first = await post(alice[1], ask(model="smollm2:cached"))
    _, events = await post(alice[1], ask(model="smollm2:cached", stream=True))
    contents = [c["choices"][0]["delta"].get("content") for c in events[:-1] if c["choices"]]
    assert [c for c in contents if c] == ["Hello, world."] and len(backend.requests) == 1
    assert first["cached"] is False
    _, again = await post(alice[1], ask(model="smollm2:cached"))
    assert again["cached"] is True and again["usage"]["completion_tokens"] == 2


async def test_a_request_override_has_its_own_cache_key(scripted, alice):
    """A changed stop or max_tokens is a different answer, never the cached one of the policy."""
    await OutputPolicy.objects.acreate(name="c", slug="cached", cache_enabled=True)
    backend = scripted(Answer(("A.",)), Answer(("B.",)))
    await post(alice[1], ask(model="smollm2:cached"))
    _, body = await post(alice[1], ask(model="smollm2:cached", max_tokens=3))
    assert body["choices"][0]["message"]["content"] == "B." and len(backend.requests) == 2


@pytest.mark.parametrize(
    "header", [None, "Bearer", "Bearer sk-wrong", "Basic c2stYWJj", "Bearer not-a-key"]
)
async def test_a_missing_or_wrong_key_is_a_401(scripted, alice, header):
    headers = {} if header is None else {"Authorization": header}
    response = await request("POST", URL, json.dumps(ask()).encode(), headers)
    error = assert_openai_error(response, response.json(), 401)
    assert error["code"] == "invalid_api_key"
    models = await request("GET", "/v1/models", headers=headers)
    assert_openai_error(models, models.json(), 401)


async def test_a_revoked_key_is_a_401_and_only_its_owner_may_revoke_it(scripted, alice, bob):
    user, key = alice
    key_id = (await user.api_keys.afirst()).pk
    assert not await sync_to_async(apikey_revoke)(key_id=key_id, user=bob[0])
    assert await sync_to_async(apikey_revoke)(key_id=key_id, user=user)
    response, body = await post(key, ask())
    assert_openai_error(response, body, 401)


async def test_models_lists_the_default_and_each_policy(scripted, alice):
    await OutputPolicy.objects.acreate(name="J", slug="json", mode="buffer")
    response = await request("GET", "/v1/models", headers={"Authorization": f"Bearer {alice[1]}"})
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["smollm2", "smollm2:json"]
    assert all(m["object"] == "model" for m in body["data"])


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (ask(model="gpt-4"), 404, "model"),
        (ask(model="smollm2:nope"), 404, "model"),
        (ask(n=2), 400, "n"),
        (ask(functions=[{"name": "f"}]), 400, "functions"),  # the legacy form of tools
        (ask(logprobs=True), 400, "logprobs"),
        (ask(max_tokens=0), 400, "max_tokens"),
        (ask(temperature=3), 400, "temperature"),
        (ask(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
        (ask(response_format={"type": "xml"}), 400, "response_format.type"),
        (
            {"model": "smollm2", "messages": [{"role": "assistant", "content": "x"}]},
            400,
            "messages",
        ),
        (
            {"model": "smollm2", "messages": [{"role": "tool", "content": "x"}]},
            400,
            "messages[0].tool_call_id",
        ),
    ],
)
async def test_unsupported_or_bad_parameters_get_an_openai_shaped_error(
    scripted, alice, body, status, param
):
    scripted()
    response, payload = await post(alice[1], body)
    assert assert_openai_error(response, payload, status)["param"] == param


async def test_the_keys_user_shares_the_rate_limit(scripted, alice, monkeypatch):
    """Keys count against their user's per-minute limit: over it, a 429 with Retry-After."""
    monkeypatch.setattr(prompt_limiter, "limit", 1)
    scripted(Answer(("ok",)))
    first, _ = await post(alice[1], ask())
    response, body = await post(alice[1], ask())
    assert first.status_code == 200
    assert assert_openai_error(response, body, 429)["code"] == "rate_limit_exceeded"
    assert response["Retry-After"] == "60"


async def test_a_model_still_loading_is_a_503(alice, monkeypatch):
    from chat.infra.runtime import runtime

    monkeypatch.setattr(runtime, "state", "loading")
    response, body = await post(alice[1], ask())
    assert assert_openai_error(response, body, 503)["type"] == "server_error"


async def test_csrf_does_not_apply_to_bearer_calls(scripted, alice):
    """No session, no CSRF token, a foreign Origin: a Bearer call still goes through."""
    scripted(Answer(("ok",)))
    response, _ = await post(alice[1], ask(), Origin="https://elsewhere.example")
    assert response.status_code == 200


# -- hostile bodies ---------------------------------------------------------------------

# Strings with lone surrogates (valid JSON as "\\ud800", not Unicode) and NULs, beside plain ones.
texts = st.text(max_size=20) | st.text(
    st.characters(categories=["Cs"]) | st.characters(codec="utf-8") | st.just("\x00"),
    min_size=1,
    max_size=8,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
messages = (
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])
                | json_values,
                "content": texts
                | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": json_values}))
                | json_values,
                "tool_calls": json_values,
            },
        ),
        max_size=4,
    )
    | json_values
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["smollm2", "smollm2:", "smollm2:x", "gpt-4"]) | json_values,
        "messages": messages,
        "stream": json_values,
        "stream_options": json_values,
        "n": json_values,
        "max_tokens": st.integers(-3, 10**9) | json_values,
        "max_completion_tokens": json_values,
        "temperature": st.floats() | json_values,
        "top_p": st.floats() | json_values,
        "seed": json_values,
        "stop": json_values | st.lists(texts, max_size=6),
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_schema", "json_object", "text", "x"])},
            optional={
                "json_schema": st.fixed_dictionaries(
                    {}, optional={"name": json_values, "schema": json_values, "strict": json_values}
                )
            },
        )
        | json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "logprobs": json_values,
        "policy": json_values,
    },
)
# Nesting past any decoder's recursion limit, whole or as one field's value, closed or not.
_CLOSER = {"[": "]", '{"a":': "}"}
deep = st.builds(
    lambda depth, opener, closed: (
        opener * depth + ("1" + _CLOSER[opener] * depth if closed else "")
    ),
    st.integers(1, 6000),
    st.sampled_from(list(_CLOSER)),
    st.booleans(),
)
_MARK = "\x00deep"
deep_field = st.builds(
    lambda body, field, inner: json.dumps({**body, field: _MARK}).replace(json.dumps(_MARK), inner),
    bodies,
    st.sampled_from(["messages", "stop", "model", "response_format", "n", "policy"]),
    deep,
)
raw_bodies = (
    bodies.map(lambda b: json.dumps(b, allow_nan=True))
    | deep
    | deep_field
    | st.text(max_size=200)
    | (json_values.map(json.dumps))
)
# CHAT_FUZZ_EXAMPLES: how many bodies (1,200 by default; raise it for a long run), scaled down
# by CHAT_TEST_FUZZ_SCALE in the fast unit run (harness/examples.py).
settings.register_profile(
    "hostile_v1",
    max_examples=fuzz_examples(int(os.environ.get("CHAT_FUZZ_EXAMPLES", "1200"))),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


async def _fire(key: str, raw: str) -> tuple[int, object]:
    response, payload = await post(key, raw)
    return response.status_code, payload


@pytest.fixture
def fuzz_key(scripted, monkeypatch):
    """A key, a backend that answers anything briefly, and no rate limit to trip over."""
    monkeypatch.setattr(prompt_limiter, "limit", 0)
    scripted(*[Answer(("ok",)) for _ in range(3000)])
    user = get_user_model().objects.create_user("fuzz")
    return apikey_create(user=user)[1]


@settings(settings.get_profile("hostile_v1"))
@given(raw=raw_bodies)
def test_hostile_bodies_get_an_openai_shaped_4xx_never_a_traceback(fuzz_key, raw):
    """Every body (lone surrogates and NULs in any string, nesting up to 6,000 deep whole or in
    a field, closed or not) is a 4xx in OpenAI's error shape, or (rarely, when it happens to be
    a valid request) a completion; never a 5xx or an HTML page."""
    status, payload = asyncio.run(_fire(fuzz_key, raw))
    if status == 200:
        assert (
            isinstance(payload, list)
            and payload[-1] == "[DONE]"
            or (payload["object"] == "chat.completion")
        )
        return
    assert 400 <= status < 500, (status, payload)
    assert set(payload) == {"error"} and payload["error"]["message"]
    assert set(payload["error"]) == {"message", "type", "param", "code"}


async def test_another_user_can_neither_cancel_nor_read_an_api_answer(scripted, alice, bob):
    """bob, signed in on the page, gets 404 for alice's running API answer and its conversation;
    alice's own cancel stops it, and her client sees it end."""
    from django.contrib.sessions.backends.db import SessionStore

    from chat import turns

    scripted(Answer(("Partial",), wait_for_cancel=True))
    running = asyncio.create_task(post(alice[1], ask(max_tokens=50)))
    for _ in range(200):
        message = (
            await Message.objects.filter(role="assistant").select_related("conversation").afirst()
        )
        if message is not None:
            break
        await asyncio.sleep(0.02)
    session = SessionStore()
    session["_auth_user_id"] = str(bob[0].pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = bob[0].get_session_auth_hash()
    await sync_to_async(session.create)()
    cookie = f"sessionid={session.session_key}; csrftoken=t" + "x" * 31
    headers = {"Cookie": cookie, "X-CSRFToken": "t" + "x" * 31}
    body = json.dumps({"message": message.pk}).encode()
    cancel = await request("POST", "/api/chat/cancel", body, headers)
    assert cancel.status_code == 404 and cancel.json()["code"] == "unknown_request"
    read = await request(
        "GET", f"/api/conversations/{message.conversation_id}/", headers={"Cookie": cookie}
    )
    assert read.status_code == 404
    assert not running.done()
    owner = selectors.Owner(user_id=alice[0].pk, session_key="")
    assert await turns.turn_cancel(owner=owner, message_id=message.pk) == "cancelled"
    response, answer = await running
    choice = answer["choices"][0]
    assert choice["native_finish_reason"] == "cancelled" and choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Partial"


async def test_api_answers_are_counted_in_metrics(scripted, alice, scrape_metrics):
    from chat.infra.metrics import REQUESTS

    scripted(Answer(("ok",)))
    before = REQUESTS.labels("eos")._value.get()
    await post(alice[1], ask())
    assert REQUESTS.labels("eos")._value.get() == before + 1
    assert 'chat_request_success_total{finish_reason="eos"}' in await scrape_metrics()


async def test_a_signed_in_browser_session_alone_is_refused(scripted, bob):
    """The API is exempt from CSRF because it reads no cookie: a page session without a key is 401."""
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session["_auth_user_id"] = str(bob[0].pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = bob[0].get_session_auth_hash()
    await sync_to_async(session.create)()
    response = await request(
        "POST",
        "/v1/chat/completions",
        json.dumps(ask(max_tokens=5)).encode(),
        headers={"Cookie": f"sessionid={session.session_key}"},
    )
    assert_openai_error(response, response.json(), 401)
