"""Hostile input (docs/security.md) over the real socket and HTTP, in process: crashing frames, lone surrogates,
cookie dropping, foreign origins, oversized bodies, the Content-Security-Policy header, and one hostile
corpus (tests/hostile_inputs.py) through the socket, /api and /v1 alike."""

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from chat.infra.ratelimit import client_address
from chat.stores.selectors import Owner
from tests.conftest import ChatClient
from tests.hostile_inputs import (
    API_CANCEL_CORPUS,
    API_CORPUS,
    RAW_BODIES,
    SOCKET_CORPUS,
    V1_CORPUS,
    V1_SERVED,
)
from tests.test_consumer import LONG, new_session_key, wait_stored
from tests.test_http_api import HttpVisitor

pytestmark = pytest.mark.django_db(transaction=True)

NESTED = "[" * 1000 + "]" * 1000  # 2,000 bytes: past the JSON decoder's recursion limit
SURROGATE = '{"type": "prompt", "request_id": "s1", "text": "hi \\ud800"}'


@pytest.mark.integration
async def test_a_deeply_nested_frame_gets_bad_json_and_the_socket_stays_open(client):
    """`[[[...]]]` and a nested value inside a frame each get an `error`, not a 1011 close."""
    for frame in (NESTED, '{"type": ' + "[" * 990 + "]" * 990 + "}"):
        await client.communicator.send_to(text_data=frame)
        error = await client.receive()
        assert (error["type"], error["code"]) == ("error", "bad_json"), error
        assert "nested too deeply" in error["message"]
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


@pytest.mark.integration
async def test_a_lone_surrogate_is_a_bad_prompt_on_the_socket(client):
    """ "hi \\ud800" used to make token counting raise; now the prompt is refused, and so are such ids and slugs."""
    await client.communicator.send_to(text_data=SURROGATE)
    error = await client.receive()
    assert (error["code"], error["request_id"]) == ("bad_prompt", "s1")
    assert "surrogate" in error["message"]
    for frame, code in (
        ('{"type": "prompt", "request_id": "x\\udc00", "text": "hi"}', "bad_request_id"),
        ('{"type": "prompt", "request_id": "p", "text": "hi", "policy": "\\ud800"}', "bad_policy"),
        ('{"type": "\\ud800"}', "unknown_type"),
    ):
        await client.communicator.send_to(text_data=frame)
        error = await client.receive()
        assert error["code"] == code, error
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


@pytest.mark.integration
async def test_a_socket_that_crashes_cancels_its_running_answer(application, monkeypatch, settings):
    """Whatever ends a socket, its answer stops: a handler that raises (daphne then closes with 1011) used to
    leave the answer generating for nobody."""
    from chat.transports import consumers

    settings.CHAT_MAX_NEW_TOKENS = 512
    client = await ChatClient(application).connect()  # not closed: it crashes
    request_id = await client.prompt(LONG)
    accepted = await client.receive()
    assert accepted["type"] == "accepted"
    while (await client.receive())["type"] != "chunk":
        pass
    real_parse = consumers.parse_frame

    def crashing(text, **kwargs):
        if text == "boom":
            raise RuntimeError("a bug in a frame handler")
        return real_parse(text, **kwargs)

    monkeypatch.setattr(consumers, "parse_frame", crashing)
    await client.communicator.send_to(text_data="boom")
    with pytest.raises(RuntimeError):
        await client.communicator.wait(timeout=10)
    message = await wait_stored(accepted["message"], timeout=30)
    assert message.finish_reason == "cancelled", (request_id, message.finish_reason)


@pytest.mark.integration
async def test_http_bodies_that_crashed_the_api_get_their_error_event(application):
    """The same bodies over HTTP: 400 with the `error` event instead of a 500."""
    visitor = HttpVisitor(application, await new_session_key())
    for path in ("/api/chat", "/api/chat/stream", "/api/chat/cancel"):
        status, body, _ = await visitor.post(path, NESTED.encode())
        assert (status, body["type"], body["code"]) == (400, "error", "bad_json"), (path, body)
    status, body, _ = await visitor.post("/api/chat", b'{"text": "hi \\ud800"}')
    assert (status, body["code"]) == (400, "bad_prompt")


@pytest.mark.integration
async def test_an_oversized_http_body_gets_frame_too_large_as_json(application, settings):
    """Past DATA_UPLOAD_MAX_MEMORY_SIZE Django raised RequestDataTooBig (its HTML 400 page); now 413 and the
    `error` event; a body over the frame limit but under Django's is the same 413."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100_000
    visitor = HttpVisitor(application, await new_session_key())
    base = visitor.scope

    def with_length(path):
        scope = base(path)
        scope["headers"].append((b"content-length", b"200000"))
        return scope

    visitor.scope = with_length
    big = json.dumps({"text": "x" * 199_988}).encode()
    status, body, headers = await visitor.post("/api/chat", big)
    assert (status, body["code"]) == (413, "frame_too_large"), body
    assert headers["content-type"] == "application/json"
    visitor.scope = base
    status, body, _ = await visitor.post("/api/chat", json.dumps({"text": "x" * 70_000}).encode())
    assert (status, body["code"]) == (413, "frame_too_large")


@pytest.mark.integration
async def test_anonymous_visitors_are_also_limited_per_address(application, monkeypatch):
    """35 cookieless sockets from one address used to be served 35 prompts; now the address's limit refuses
    the rest, on the socket and over HTTP alike, while another address is still served."""
    from chat.infra import ratelimit

    monkeypatch.setattr(ratelimit.prompt_limiter, "limit", 3)
    monkeypatch.setattr(ratelimit.address_limiter, "limit", 3)

    async def prompt_from(address: str) -> dict:
        chat = ChatClient(application)  # no session cookie: a new visitor each time
        chat.communicator.scope["client"] = (address, 40000)
        await chat.connect()
        try:
            await chat.prompt("hi", policy="no-such-policy")  # counted, then refused cheaply
            return await chat.receive()
        finally:
            await chat.close()

    codes = [(await prompt_from("203.0.113.7"))["code"] for _ in range(4)]
    assert codes == ["unknown_policy"] * 3 + ["rate_limited"]
    refused = await prompt_from("203.0.113.7")
    assert "from this address" in refused["message"]
    assert (await prompt_from("198.51.100.1"))["code"] == "unknown_policy"
    visitor = HttpVisitor(application, await new_session_key())  # HTTP comes from 127.0.0.1
    for _ in range(3):
        status, _, _ = await visitor.post("/api/chat", {"text": "hi", "policy": "no-such-policy"})
        visitor.session_key = await new_session_key()
    status, body, headers = await visitor.post("/api/chat", {"text": "hi"})
    assert (status, body["code"], headers["retry-after"]) == (429, "rate_limited", "60")


@pytest.mark.unit
def test_the_client_address_trusts_x_forwarded_for_only_when_told(settings):
    """By default X-Forwarded-For is ignored (a client can write anything there); with N trusted proxies
    the N-th address from the right counts; IPv6 counts by /64."""
    settings.CHAT_TRUSTED_PROXIES = 0
    assert client_address("10.0.0.2", "1.2.3.4") == "10.0.0.2"
    settings.CHAT_TRUSTED_PROXIES = 1
    assert client_address("10.0.0.2", "6.6.6.6, 1.2.3.4") == "1.2.3.4"
    assert client_address("10.0.0.2", None) == "10.0.0.2"
    settings.CHAT_TRUSTED_PROXIES = 2
    assert client_address("10.0.0.2", "6.6.6.6, 1.2.3.4, 10.0.0.1") == "1.2.3.4"
    assert client_address("10.0.0.2", "1.2.3.4") == "10.0.0.2"  # fewer hops than proxies: spoofed
    assert client_address("2001:db8::1", None) == client_address("2001:db8::ffff", None)
    assert client_address("2001:db8::1", None) == "2001:db8::/64"
    assert client_address("::ffff:192.0.2.1", None) == "192.0.2.1"
    assert client_address(None, None) is None


@pytest.mark.unit
def test_signed_in_users_are_limited_per_user_not_per_address(monkeypatch):
    """An office behind one address: its signed-in users are not counted against the address."""
    from chat import turns
    from chat.infra import ratelimit

    monkeypatch.setattr(ratelimit.address_limiter, "limit", 1)
    for user_id in (1, 2, 3):
        turns.turn_rate_check(owner=Owner(user_id=user_id, session_key="s"), address="192.0.2.9")
    turns.turn_rate_check(owner=Owner(None, "visitor-1"), address="192.0.2.9")
    with pytest.raises(turns.TurnError) as refused:
        turns.turn_rate_check(owner=Owner(None, "visitor-2"), address="192.0.2.9")
    assert refused.value.code == "rate_limited"
    assert ratelimit.prompt_limiter.wait("session:visitor-2") == 0  # a refusal counts nothing


@pytest.mark.integration
@pytest.mark.parametrize(
    ("origin", "host", "extra", "accepted"),
    [
        (b"http://localhost:8000", b"localhost:8000", [], True),
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", [], True),
        (b"http://localhost:9999", b"localhost:8000", [], False),  # another port on the machine
        (b"https://localhost:8000", b"localhost:8000", [], False),  # another scheme
        (b"http://localhost", b"localhost:8000", [], False),
        (b"http://evil.example", b"evil.example", [], False),  # DNS rebinding: host not allowed
        (b"http://localhost:8000", None, [], False),  # no Host: no browser
        (None, b"localhost:8000", [], False),
    ],
)
async def test_the_socket_accepts_only_its_own_origin(application, origin, host, extra, accepted):
    """Scheme, host and port of the page must be the socket's own (ALLOWED_HOSTS for the host)."""
    headers = [(b"origin", origin)] if origin else []
    headers += [(b"host", host)] if host else []
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers + extra)
    connected, _ = await communicator.connect()
    assert connected is accepted
    await communicator.disconnect()


@pytest.mark.integration
async def test_behind_a_tls_proxy_the_https_page_and_trusted_origins_are_accepted(
    application, settings
):
    """BEHIND_TLS_PROXY (SECURE_PROXY_SSL_HEADER): an https page reaches the ws:// socket the proxy opens;
    an origin in CSRF_TRUSTED_ORIGINS is accepted as is; http on the same host is not."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from chat.transports.origin import SameOriginValidator
    from chat.transports.routing import websocket_urlpatterns

    settings.ALLOWED_HOSTS = ["chat.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    cases = [
        (b"https://chat.example.com", [(b"x-forwarded-proto", b"https")], True),
        (b"https://chat.example.com", [], False),
        (b"http://chat.example.com", [(b"x-forwarded-proto", b"https")], False),
        (b"http://chat.example.com:8081", [], False),
    ]
    for origin, extra, accepted in cases:
        headers = [(b"origin", origin), (b"host", b"chat.example.com"), *extra]
        communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected is accepted, origin
        await communicator.disconnect()
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.example.org"]
    # The validator reads CSRF_TRUSTED_ORIGINS when built, at start-up.
    validator = SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
    headers = [(b"origin", b"https://app.example.org"), (b"host", b"chat.example.com")]
    communicator = WebsocketCommunicator(validator, "/ws/chat/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.disconnect()


@pytest.mark.unit
async def test_every_page_carries_a_strict_content_security_policy():
    """The chat page, the admin and the API answer with a CSP allowing no inline script or style."""
    client = AsyncClient()
    for path in ("/", "/admin/login/", "/api/csrf", "/healthz"):
        response = await client.get(path)
        policy = response.headers.get("Content-Security-Policy", "")
        assert "script-src 'self'" in policy and "style-src 'self'" in policy, path
        assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy


# -- one hostile corpus through every transport (tests/hostile_inputs.py) ---------------------


@pytest.mark.integration
async def test_the_hostile_corpus_gets_an_error_event_on_the_socket(client):
    """Surrogates and NULs in every string, deep values, Unicode digits and wrong types in every
    id, 10 MB, 100,000 unclosed brackets: each frame gets an `error` event, the socket stays open."""
    codes = {}
    for what, frame in SOCKET_CORPUS:
        await client.communicator.send_to(text_data=frame)
        event = await client.receive(timeout=30)
        assert event["type"] == "error" and event["code"] and event["message"], (what, event)
        codes[what] = event["code"]
    assert codes["lone high surrogate in ('text',)"] == "bad_prompt"
    assert codes["NUL in ('request_id',)"] == "bad_request_id"
    assert codes["superscript two as ('conversation',)"] == "bad_conversation"
    assert codes["past a bigint as ('replace',)"] == "bad_message"
    assert codes["nested 5,000 deep"] == codes["objects nested 5,000 deep"] == "bad_json"
    assert codes["10 MB"] == codes["100,000 unclosed ["] == "frame_too_large"  # past 64 KiB
    await client.send({"type": "ping"})
    assert await client.receive() == {"type": "pong"}


@pytest.mark.integration
async def test_the_hostile_corpus_gets_a_json_error_event_over_http(application):
    """The same corpus (and a body that is not UTF-8) to /api/chat, /api/chat/stream and
    /api/chat/cancel: a 4xx whose JSON body is the `error` event, never a 5xx."""
    visitor = HttpVisitor(application, await new_session_key())
    not_utf8 = [("not UTF-8", b'{"text": "\xff\xfe"}')]
    cases = [
        *(
            (path, what, body.encode())
            for path in ("/api/chat", "/api/chat/stream")
            for what, body in API_CORPUS
        ),
        *(("/api/chat/cancel", what, body.encode()) for what, body in API_CANCEL_CORPUS),
        *(("/api/chat", what, body) for what, body in not_utf8),
    ]
    for path, what, body in cases:
        status, payload, headers = await visitor.post(path, body)
        assert 400 <= status < 500 and headers["content-type"] == "application/json", (
            path,
            what,
            status,
            str(payload)[:200],
        )
        assert payload["type"] == "error" and payload["code"] and payload["message"], (path, what)
        if what == "10 MB":
            assert (status, payload["code"]) == (413, "frame_too_large")


@pytest.mark.unit
async def test_the_hostile_corpus_gets_an_openai_error_on_v1(scripted, example_policies):
    """The same corpus for /v1/chat/completions (system, history, text parts, stop, model and
    policy names, the schema's name; numbers for n and max_tokens): each a 4xx in OpenAI's
    shape with the `param` it is about, never a 5xx; 10 MB is a 413 JSON, not Django's page."""
    from harness.scripted import Answer
    from tests.test_openai_views import _user_with_key, assert_openai_error, post

    scripted(*[Answer(("ok",)) for _ in V1_CORPUS])
    _, key = await sync_to_async(_user_with_key)("hostile")
    served = set()
    for what, body in V1_CORPUS:
        response, payload = await post(key, body.encode())
        if response.status_code == 200:  # a valid request after all (a seed may be any integer)
            served.add(what)
            continue
        error = assert_openai_error(response, payload, response.status_code)
        assert 400 <= response.status_code < 500, (what, payload)
        if "in ('" in what and "deep" not in what and "number" not in what:
            path = what.split(" in ")[1]
            assert error["param"] and error["param"].split(".")[0].split("[")[0] in path, (
                what,
                error,
            )
    assert served == V1_SERVED
    response, payload = await post(key, RAW_BODIES["10 MB"].encode())
    assert response.status_code == 413 and payload["error"]["type"] == "invalid_request_error"


@pytest.mark.unit
@pytest.mark.parametrize(
    "url",
    [
        "/?c=%C2%B2",
        "/?c=%D9%A3",
        "/?c=99999999999999999999999",
        "/?c=-1",
        "/?c=%00",
    ],
)
def test_unicode_digits_and_huge_numbers_in_the_query_are_no_conversation(url):
    """`GET /?c=²` was a 500: str.isdigit() takes "²" and int() refuses it."""
    from django.test import Client

    response = Client().get(url)
    assert response.status_code == 200
    assert b'"conversation": null' in response.content


@pytest.mark.unit
@pytest.mark.parametrize(
    ("method", "url", "body", "status", "code"),
    [
        ("get", "/api/conversations/%C2%B2/", None, 404, "not_found"),
        ("get", "/api/conversations/99999999999999999999999/", None, 404, "unknown_conversation"),
        ("get", "/api/conversations/0/export?format=%C2%B2", None, 400, "bad_format"),
        ("get", "/api/conversations/?q=%00", None, 400, "bad_query"),
        ("patch", "/api/conversations/1/", '{"title": "\\ud800"}', 400, "bad_title"),
        ("patch", "/api/conversations/1/", "[" * 4000, 400, "bad_title"),
        ("patch", "/api/conversations/1/", '{"title": "' + "x" * 10_000 + '"}', 413, None),
        ("get", "/api/nothing-here", None, 404, "not_found"),
    ],
)
def test_the_conversation_api_answers_json_errors_to_hostile_ids_and_bodies(
    method, url, body, status, code
):
    from django.test import Client

    client = Client()
    client.get("/")
    kwargs = {"data": body, "content_type": "application/json"} if body is not None else {}
    response = getattr(client, method)(url, **kwargs)
    assert response.status_code == status and response["Content-Type"] == "application/json"
    payload = response.json()
    assert payload["type"] == "error" and payload["message"]
    if code:
        assert payload["code"] == code


@pytest.mark.unit
def test_revoking_a_key_named_by_unicode_digits_is_a_400_not_a_500(django_user_model):
    """`key=²` was a 500 (isdigit() then int()); now the page says the key is not one of yours."""
    from django.test import Client

    user = django_user_model.objects.create_user("keyholder")
    client = Client()
    client.force_login(user)
    for key in ("²", "٣", "99999999999999999999999", "", "-1"):
        response = client.post("/account/api-keys/", {"revoke": "1", "key": key})
        assert response.status_code == 400, key
        assert b"not one of your active keys" in response.content


@pytest.mark.unit
def test_error_pages_are_the_products_and_leak_nothing():
    """404 and 500 with DEBUG off (as in `make run`): the product's page for the browser, the
    API's error shape on /api/ and /v1/; no traceback, no settings, no path echoed."""
    from django.test import Client, RequestFactory

    from chat.pages.error_pages import server_error

    page = Client().get("/no-such-page-<script>")
    assert page.status_code == 404 and b"Not found" in page.content
    assert b"<script>" not in page.content and b"Traceback" not in page.content
    v1 = Client().get("/v1/nothing")
    assert v1.status_code == 404 and set(v1.json()["error"]) == {"message", "type", "param", "code"}
    for path, shape in (("/", "html"), ("/api/chat", "api"), ("/v1/chat/completions", "v1")):
        response = server_error(RequestFactory().get(path))
        assert response.status_code == 500
        if shape == "html":
            assert b"Something went wrong" in response.content
        elif shape == "api":
            assert json.loads(response.content)["code"] == "server_error"
        else:
            assert json.loads(response.content)["error"]["type"] == "server_error"
