"""Hostile input (docs/security.md) against a live daphne, as an attacker reproduced it: real sockets, real HTTP.

The servers run without a model (CHAT_BACKEND=none): every case here is refused before generation,
and a prompt that passes the rate limit is answered `model_loading`, cheaply.
"""

import asyncio
import http.cookiejar
import json
import re
import urllib.error
import urllib.request

import pytest
import websockets

from harness.liveserver import LiveServer

pytestmark = pytest.mark.integration

TOKEN = "t" * 32  # any well-formed CSRF secret


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory):
    """The dev settings (`make run`), a rate limit of 3 prompts a minute."""
    server = LiveServer(
        tmp_path_factory.mktemp("hostile"), CHAT_BACKEND="none", CHAT_RATE_LIMITS="prompt=3/1m"
    ).start(wait_for_model=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def production_server(tmp_path_factory):
    """Production settings behind a TLS proxy, as docs/configuration.md's example."""
    workdir = tmp_path_factory.mktemp("hostile-prod")
    server = LiveServer(
        workdir,
        DEBUG="0",
        SECRET_KEY="p" * 50,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        CSRF_TRUSTED_ORIGINS="https://chat.example.com",
        BEHIND_TLS_PROXY="1",
        CHAT_BACKEND="none",
    ).start(wait_for_model=False)
    yield server
    server.stop()


async def exchange(server, frames: list[str], **connect) -> list[dict]:
    """Send each raw frame and read one event for it; the socket must stay open throughout."""
    connect.setdefault("origin", server.url)
    async with websockets.connect(server.ws_url, **connect) as ws:
        events = []
        for frame in frames:
            await ws.send(frame)
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        await ws.send('{"type": "ping"}')
        assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "pong"}
    return events


async def test_nested_json_and_lone_surrogates_get_errors_not_a_1011_close(dev_server):
    """The frames that closed daphne's socket with 1011 ("Exception inside application") now get an `error`."""
    events = await exchange(
        dev_server,
        [
            "[" * 1000 + "]" * 1000,
            '{"type": "prompt", "request_id": "s", "text": "hi \\ud800"}',
            '{"type": "prompt", "request_id": "\\ud800", "text": "hi"}',
        ],
    )
    assert [(e["type"], e["code"]) for e in events] == [
        ("error", "bad_json"),
        ("error", "bad_prompt"),
        ("error", "bad_request_id"),
    ]
    assert "Exception inside application" not in dev_server.log()


async def test_dropping_cookies_does_not_escape_the_rate_limit(dev_server):
    """Each cookieless socket is a new visitor, but they share an address: past the limit (3 here) the
    next one is refused, and the HTTP API counts together with the socket."""
    codes = []
    for n in range(4):
        frame = json.dumps({"type": "prompt", "request_id": f"c{n}", "text": "hi"})
        codes.append((await exchange(dev_server, [frame]))[0]["code"])
    assert codes == ["model_loading"] * 3 + ["rate_limited"]
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    token = json.load(opener.open(dev_server.url + "/api/csrf", timeout=10))["csrf_token"]
    request = urllib.request.Request(
        dev_server.url + "/api/chat",
        data=b'{"text": "hi"}',
        headers={"Content-Type": "application/json", "X-CSRFToken": token},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=10)
    assert refused.value.code == 429
    assert json.load(refused.value)["code"] == "rate_limited"


async def refused(server, origin: str, **headers) -> bool:
    try:
        async with websockets.connect(server.ws_url, origin=origin, additional_headers=headers):
            return False
    except websockets.exceptions.InvalidStatus as exc:
        assert exc.response.status_code == 403
        return True


async def test_the_dev_server_refuses_another_port_or_scheme(dev_server):
    """`make run`'s settings: the page's own origin only; another port on the machine or https is refused."""
    port = dev_server.port
    assert not await refused(dev_server, dev_server.url)
    assert await refused(dev_server, "http://localhost:9999")
    assert await refused(dev_server, "http://127.0.0.1:9999")
    assert await refused(dev_server, f"https://127.0.0.1:{port}")
    assert await refused(dev_server, f"http://localhost:{port}")  # a page on another host name


async def test_production_settings_accept_their_real_origins_only(production_server):
    """Behind the TLS proxy the https page is accepted (X-Forwarded-Proto), as is CSRF_TRUSTED_ORIGINS;
    `http://chat.example.com:8081` (accepted before) and other ports or schemes are not."""
    server, port = production_server, production_server.port
    assert not await refused(server, f"https://127.0.0.1:{port}", **{"X-Forwarded-Proto": "https"})
    assert not await refused(server, "https://chat.example.com")
    assert not await refused(server, server.url)  # the proxy did not say https: the page was http
    assert await refused(server, "http://chat.example.com:8081")
    assert await refused(server, "http://chat.example.com")
    assert await refused(server, f"http://127.0.0.1:{port + 1}")
    assert await refused(server, f"https://127.0.0.1:{port}")  # https page, but no proxy said so


def post(url: str, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("which", ["dev", "production"])
def test_an_oversized_body_gets_the_json_error_event(which, dev_server, production_server):
    """3 MB (over DATA_UPLOAD_MAX_MEMORY_SIZE): 413 and the `error` event, not Django's HTML 400 page.
    With DEBUG off that holds even for a form-encoded body, which the CSRF check reads first."""
    server = dev_server if which == "dev" else production_server
    cookie = {"Cookie": f"csrftoken={TOKEN}", "X-CSRFToken": TOKEN}
    big = json.dumps({"text": "x" * 3_000_000}).encode()
    status, headers, body = post(
        server.url + "/api/chat", big, {"Content-Type": "application/json", **cookie}
    )
    assert status == 413 and headers["Content-Type"] == "application/json", body[:200]
    assert json.loads(body)["code"] == "frame_too_large"
    if which == "production":
        status, headers, body = post(
            server.url + "/api/chat",
            b"text=" + b"x" * 3_000_000,
            {"Content-Type": "application/x-www-form-urlencoded", **cookie},
        )
        assert (status, json.loads(body)["code"]) == (413, "frame_too_large"), body[:200]


def test_production_pages_carry_the_content_security_policy(production_server):
    """The header is on every response with DEBUG off too."""
    with pytest.raises(urllib.error.HTTPError) as loading:  # 503: no model in this server
        urllib.request.urlopen(production_server.url + "/healthz", timeout=10)
    assert "default-src 'self'" in loading.value.headers["Content-Security-Policy"]


async def test_a_frame_past_daphnes_limit_gets_frame_too_large_and_1009_not_a_drop(dev_server):
    """1,048,630 bytes (past daphne's 1 MiB message limit) used to drop the connection without a
    close frame; now the `error` event frame_too_large comes first, then the close code 1009.
    A frame past the chat's own 64 KiB limit but under daphne's gets the event and stays open."""
    async with websockets.connect(dev_server.ws_url, origin=dev_server.url) as ws:
        await ws.send(json.dumps({"type": "prompt", "request_id": "big", "text": "x" * 100_000}))
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (event["type"], event["code"]) == ("error", "frame_too_large")
        await ws.send('{"type": "ping"}')
        assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "pong"}
        await ws.send("x" * 1_048_630)
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (event["type"], event["code"]) == ("error", "frame_too_large")
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.parametrize("which", ["dev", "production"])
def test_a_10_mb_body_to_v1_is_a_413_in_openais_shape(which, dev_server, production_server):
    """It was Django's HTML debug page (RequestDataTooBig, 400); the key is not even looked at."""
    server = dev_server if which == "dev" else production_server
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "x" * 10**7}]})
    status, headers, raw = post(
        server.url + "/v1/chat/completions",
        body.encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer sk-none"},
    )
    assert status == 413 and headers["Content-Type"] == "application/json", raw[:200]
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def make_run_server(tmp_path_factory):
    """`make run` as a newcomer runs it (`python -m project.serve`, no DEBUG, no SECRET_KEY),
    on this test's Redis and a data directory of its own."""
    from harness.liveserver import ROOT

    workdir = tmp_path_factory.mktemp("make-run")
    server = LiveServer(
        workdir,
        serve=True,
        DATA_DIR=str(workdir / "data"),
        CHAT_MODEL_PATH=str(ROOT / "var" / "models" / "SmolLM2-135M-Instruct"),
        CHAT_BACKEND="none",
    )
    for name in ("DEBUG", "SECRET_KEY"):
        server.env.pop(name, None)
    server.start(wait_for_model=False)
    yield server, workdir / "data"
    server.stop()


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_make_run_serves_with_debug_off_its_own_error_pages_and_static_files(make_run_server):
    """No traceback for strangers: a secret key is made once (owner-only) under var/; the page and
    its static files are served; errors are the product's page, or JSON on /api/ and /v1/;
    `?c=²`, once a 500, is the page."""
    server, data = make_run_server
    key = data / "secret_key"
    assert key.exists() and oct(key.stat().st_mode & 0o777) == "0o600"
    status, _, page = get(server.url + "/?c=%C2%B2")
    assert status == 200
    for asset in re.findall(rb'(?:src|href)="(/static/[^"]+)"', page):
        assert get(server.url + asset.decode())[0] == 200, asset
    status, headers, body = get(server.url + "/no-such-page")
    assert status == 404 and headers["Content-Type"].startswith("text/html")
    assert b"Not found" in body and b"Traceback" not in body and b"DEBUG" not in body
    status, headers, body = get(server.url + "/api/conversations/%C2%B2/")
    assert (status, json.loads(body)["code"]) == (404, "not_found")
    status, _, body = get(server.url + "/v1/nothing")
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown_url"
