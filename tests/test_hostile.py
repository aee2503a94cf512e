"""Hostile input (docs/security.md) over the real socket and HTTP, in process: crashing frames, lone surrogates,
cookie dropping, foreign origins, oversized bodies, and the Content-Security-Policy header."""

import json

import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from chat.ratelimit import client_address
from chat.selectors import Owner
from tests.conftest import ChatClient
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
    from chat import consumers

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
    from chat import ratelimit

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
    from chat import ratelimit, services

    monkeypatch.setattr(ratelimit.address_limiter, "limit", 1)
    for user_id in (1, 2, 3):
        services.turn_rate_check(owner=Owner(user_id=user_id, session_key="s"), address="192.0.2.9")
    services.turn_rate_check(owner=Owner(None, "visitor-1"), address="192.0.2.9")
    with pytest.raises(services.TurnError) as refused:
        services.turn_rate_check(owner=Owner(None, "visitor-2"), address="192.0.2.9")
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

    from chat.origin import SameOriginValidator
    from chat.routing import websocket_urlpatterns

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
