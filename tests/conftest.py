"""Shared test actors: the real model (loaded once), real Redis, WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import threading

import pytest
from channels.testing import WebsocketCommunicator

ORIGIN = (b"origin", b"http://localhost")

# The three layers (docs/development.md): every test names exactly one, in its own file.
LAYERS = ("unit", "integration", "browser")
# Fixtures that start the real model or a server: a unit test never asks for them.
MODEL_FIXTURES = {
    "runtime",
    "backend",
    "float_backend",
    "application",
    "client",
    "make_client",
    "daphne_server",
    "live_v1",
    "peer",
}
BROWSER_FIXTURES = {"browser", "page"}
# `make test-unit` sets it: anything that would load the model fails instead (the env guard).
NO_MODEL = os.environ.get("CHAT_TEST_NO_MODEL") == "1"
# `make test` sets it on its second database's pass: a test that touches no database already
# passed on the first, so only the tests that do are run again (deselected, and counted).
DATABASE_TESTS_ONLY = os.environ.get("CHAT_TEST_DATABASE_ONLY") == "1"
# A module that starts a server process (its own database connection) in a test's body.
_STARTS_A_SERVER = re.compile(
    r'LiveServer|daphne_server|live_server|liveserver|project\.serve|"manage\.py"'
)


def _unblocks_the_database(fixturedef) -> bool:
    """One of our fixtures that lifts pytest-django's block itself (pytest-django's own autouse
    fixtures ask for the blocker too, to keep it down)."""
    return "django_db_blocker" in fixturedef.argnames and not fixturedef.func.__module__.startswith(
        "pytest_django"
    )


def _starts_a_server(function, seen: dict) -> bool:
    """Whether a test or fixture function's own source starts a server process."""
    if function not in seen:
        try:
            seen[function] = bool(_STARTS_A_SERVER.search(inspect.getsource(function)))
        except (OSError, TypeError):
            seen[function] = False
    return seen[function]


def touches_a_database(item, seen: dict) -> bool:
    """pytest-django blocks the database for a test without its marker or fixtures (or a
    fixture that unblocks it), so those and the tests that start a server process (itself or
    through a fixture of ours: it opens its own connections) are all that can touch one. The
    browser layer runs once: the page does not depend on the database, and what the server
    stores under it is covered by the live tests that do run again."""
    if item.get_closest_marker("browser"):
        return False
    autouse = set(item.session._fixturemanager._getautousenames(item))
    fixturedefs = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()]
    ours = [
        d.func
        for d in fixturedefs
        if d.argname not in autouse and not d.func.__module__.startswith(("pytest_", "_pytest"))
    ]
    return bool(
        item.get_closest_marker("django_db")
        or "django_db_setup" in item.fixturenames
        or any(_unblocks_the_database(d) for d in fixturedefs)
        or any(_starts_a_server(f, seen) for f in [item.function, *ours])
    )


def pytest_collection_modifyitems(config, items):
    """The layer contract, checked on every run: one layer a test, and a unit test asks for no
    model, server or browser; a browser fixture only in the browser layer."""
    errors = []
    for item in items:
        layers = [name for name in LAYERS if item.get_closest_marker(name)]
        fixtures = set(getattr(item, "fixturenames", ()))
        if len(layers) != 1:
            errors.append(
                f"{item.nodeid}: marks {layers or 'no layer'}; mark exactly one of {LAYERS}"
            )
        elif layers == ["unit"] and fixtures & (MODEL_FIXTURES | BROWSER_FIXTURES):
            errors.append(
                f"{item.nodeid}: a unit test using {sorted(fixtures & (MODEL_FIXTURES | BROWSER_FIXTURES))}"
            )
        elif layers != ["browser"] and fixtures & BROWSER_FIXTURES:
            errors.append(f"{item.nodeid}: uses a browser but is not marked browser")
    if errors:
        raise pytest.UsageError("test layers:\n  " + "\n  ".join(errors))
    if DATABASE_TESTS_ONLY:
        seen: dict = {}
        kept = [item for item in items if touches_a_database(item, seen)]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


# The kernels' AVX2 build, which tests compare with the native one: a minute or more of both
# cores to compile in a fresh checkout. Started in a thread once collection says a test will
# ask for it, it compiles beside the tests before that one (which leave a core idle most of
# the time); the test's own `blockquant.build("avx2")` then waits for it (the build's flock)
# and loads it, or builds it itself, and fails, where this thread's build failed.
_AVX2_USER = 'blockquant.build("avx2")'
_avx2_builds: list[threading.Thread] = []


def pytest_collection_finish(session):
    if NO_MODEL or not any(_AVX2_USER in _module_source(item) for item in session.items):
        return
    from chat.engine.weights import blockquant

    if not blockquant.cpu_supported()[0]:
        return

    def build() -> None:
        # A failure is the test's to report: its own call builds again and raises.
        with contextlib.suppress(Exception):
            blockquant.build("avx2", progress=lambda line: None)

    thread = threading.Thread(target=build, name="avx2-kernels", daemon=True)
    thread.start()
    _avx2_builds.append(thread)


def pytest_sessionfinish(session):
    """Never leave the compiler running past the session: its lock file would stop the next."""
    for thread in _avx2_builds:
        thread.join()


def _module_source(item, seen: dict = {}) -> str:  # noqa: B006 (a cache across calls)
    module = getattr(item, "module", None)
    if module is None:
        return ""
    if module not in seen:
        try:
            seen[module] = inspect.getsource(module)
        except (OSError, TypeError):
            seen[module] = ""
    return seen[module]


@pytest.fixture(scope="session", autouse=True)
def model_guard():
    """Under CHAT_TEST_NO_MODEL=1 loading the model, starting a live daphne or the peer raises:
    a unit run (`make test-unit`) thereby proves it never loads the model."""
    if not NO_MODEL:
        yield
        return
    from chat.engine.local import loader
    from harness.liveserver import LiveServer
    from harness.peer import ServerProcess

    def refuse(*args, **kwargs):
        raise AssertionError("CHAT_TEST_NO_MODEL=1: this test needs the model; mark it integration")

    patched = [
        (loader, "load_backend"),
        (LiveServer, "start"),
        (ServerProcess, "start"),
    ]
    originals = [getattr(owner, name) for owner, name in patched]
    for owner, name in patched:
        setattr(owner, name, refuse)
    yield
    for (owner, name), original in zip(patched, originals, strict=True):
        setattr(owner, name, original)


@pytest.fixture(scope="session")
def shared_thread_connections_closed(django_db_setup):
    """After the last test, before the test databases are dropped: the connections that async
    tests opened through `sync_to_async` closed in the one thread asgiref runs them on outside a
    request, which nothing else ever closes (PostgreSQL refuses to drop a database still in use,
    and the run ended with a warning saying so)."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


@pytest.fixture(autouse=True)
def close_shared_thread_connections_at_the_end(request):
    """Asks for the session's closing only in a test that uses the database: a static dependency
    on `django_db_setup` would set the databases up for every test (and count every test as one
    that touches a database)."""
    if request.node.get_closest_marker("django_db") or {"db", "transactional_db"} & set(
        request.fixturenames
    ):
        request.getfixturevalue("shared_thread_connections_closed")


# Tests keep their cached answers apart from anything else on the machine's Redis,
# and start every test with an empty cache so an earlier answer is never served.
# TEST_REDIS_DB moves them (to db N and N-1), and TEST_REDIS_ADDR to another server, so two
# suites can run side by side.
_TEST_REDIS_DB = int(os.environ.get("TEST_REDIS_DB", "15"))
_TEST_REDIS_ADDR = os.environ.get("TEST_REDIS_ADDR", "127.0.0.1:6379")
TEST_CACHE_URL = f"redis://{_TEST_REDIS_ADDR}/{_TEST_REDIS_DB}"
LIVE_CACHE_URL = f"redis://{_TEST_REDIS_ADDR}/{_TEST_REDIS_DB - 1}"


@pytest.fixture(autouse=True)
def empty_cache(settings):
    import redis

    settings.CHAT_CACHE_REDIS_URL = TEST_CACHE_URL
    for url in (TEST_CACHE_URL, LIVE_CACHE_URL):
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()


# What the in-process tests' Prometheus scraper sends (`scrape_metrics`); /metrics is off without it.
METRICS_TOKEN = "test-metrics-token"


@pytest.fixture
def scrape_metrics(settings):
    """/metrics as Prometheus scrapes it, in process: CHAT_METRICS_TOKEN set and sent as a bearer
    token; returns an async function giving the text."""
    from django.test import AsyncClient

    settings.CHAT_METRICS_TOKEN = METRICS_TOKEN

    async def scrape() -> str:
        response = await AsyncClient().get(
            "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
        assert response.status_code == 200, response.content
        return response.content.decode()

    return scrape


@pytest.fixture(autouse=True)
def no_resume_grace(settings):
    """In process, a closed socket's answer stops at once, as before the grace period: an answer
    a test leaves running must not run on into the next test. Tests of the grace period (and
    every live daphne, which has its own settings) set it."""
    settings.CHAT_RESUME_GRACE_S = 0


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """A cheap hasher in this process: tests that sign in 30 times measure throttling, not PBKDF2
    (live daphne processes keep the real one). PBKDF2 stays second, so a password hashed before
    this fixture ran (a module-scoped account) still verifies."""
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]


@pytest.fixture(autouse=True)
def fresh_compiled_policies():
    """Every test compiles its policies anew: a test rolled back in SQLite gives its ids back, so
    the next test's policy can have an earlier one's (id, version), the key compiled policies
    are remembered by (never reused outside tests: ids are not given back once committed)."""
    from chat.stores import policy_store

    policy_store._compiled.clear()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """Every test starts with empty rate-limit windows and visitor budgets: all test clients share
    one address."""
    from chat.infra import ratelimit
    from chat.stores import visitor_spending

    for limiter in ratelimit.ALL:
        limiter.clear()
    for spending in visitor_spending.ALL:
        spending.clear()


@pytest.fixture(scope="session")
def runtime():
    """The process's real model and scheduler, loaded once for the whole session."""
    from chat.infra.runtime import runtime as chat_runtime

    # The weights production runs (CHAT_ENGINE quant=auto: the GGUF blocks where the kernels
    # build, about twice as fast a step as fp32); tests that need the float weights ask for
    # `float_backend`.
    chat_runtime.start()
    assert chat_runtime.wait(timeout=600), chat_runtime.detail
    return chat_runtime


@pytest.fixture(scope="session")
def backend(runtime):
    return runtime.backend


@pytest.fixture(scope="session")
def float_backend(runtime):
    """A second copy of the model with its float weights (CHAT_ENGINE quant=none), for tests
    that compare quantized layers with them or swap layers in and out; loaded on first use."""
    from dataclasses import replace

    from chat.engine.local.loader import load_backend

    return load_backend(replace(runtime.engine_config(), quant="none"), progress=lambda line: None)


@pytest.fixture
def application(runtime):
    from project.asgi import application as asgi_application

    return asgi_application


class ChatClient:
    """A WebSocket client speaking the chat protocol through Channels' communicator."""

    def __init__(
        self, application, *, session_key: str | None = None, origin: bytes = b"http://localhost"
    ):
        headers = [(b"origin", origin), (b"host", b"localhost")]  # as a browser on this site sends
        if session_key:
            headers.append((b"cookie", f"sessionid={session_key}".encode()))
        self.communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
        self.counter = 0

    async def connect(self):
        connected, _ = await self.communicator.connect()
        assert connected
        return self

    async def send(self, frame: dict):
        await self.communicator.send_to(text_data=json.dumps(frame))

    async def prompt(
        self, text: str, *, request_id: str | None = None, conversation=None, **extra
    ) -> str:
        self.counter += 1
        request_id = request_id or f"r{self.counter}"
        await self.send(
            {
                "type": "prompt",
                "request_id": request_id,
                "text": text,
                "conversation": conversation,
                **extra,
            }
        )
        return request_id

    async def receive(self, timeout: float = 120) -> dict:
        return json.loads(await self.communicator.receive_from(timeout=timeout))

    async def receive_until(
        self, kind: str, request_id: str | None = None, timeout: float = 120
    ) -> list[dict]:
        """Every event up to and including the first `kind` event (for `request_id`)."""
        events = []
        while True:
            event = await self.receive(timeout)
            events.append(event)
            if event["type"] == kind and (
                request_id is None or event.get("request_id") == request_id
            ):
                return events

    async def close(self):
        await self.communicator.disconnect()


@pytest.fixture
async def client(application):
    chat = await ChatClient(application).connect()
    yield chat
    await chat.close()


@pytest.fixture
async def make_client(application):
    """Factory for further clients (other visitors, or the same one via session_key)."""
    made: list[ChatClient] = []

    async def factory(**kwargs) -> ChatClient:
        chat = await ChatClient(application, **kwargs).connect()
        made.append(chat)
        return chat

    yield factory
    for chat in made:
        await chat.close()


async def wait_for(condition, timeout: float = 30) -> None:
    """Poll `condition` every 50 ms on the event loop until it holds; AssertionError after
    `timeout` seconds."""
    for _ in range(int(timeout * 20)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


def chunks_text(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "chunk")


@pytest.fixture(scope="session")
def daphne_server(tmp_path_factory):
    """One real daphne for the session (its own database, the already converted model)."""
    from harness.liveserver import LiveServer

    server = LiveServer(
        tmp_path_factory.mktemp("live"),
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
        # Every browser test signs up from 127.0.0.1, and tests/test_client_libraries.py asks
        # many times a minute; the throttles have tests/test_accounts.py and test_shared_limits.py.
        CHAT_RATE_LIMITS="signup_address=0,prompt=0",
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def peer(tmp_path_factory):
    """The real engine: `transformers serve --continuous-batching` on loopback with the bundled
    model folder (harness/peer.py), started once for the session and always stopped."""
    from harness.peer import TransformersServe

    with TransformersServe(log_path=tmp_path_factory.mktemp("peer") / "peer.log") as server:
        yield server


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright (the driver ships in the wheel; no browser download).

    Module-scoped: Playwright's sync API keeps an event loop running while it is open,
    which would stop pytest-asyncio's tests in later modules from starting theirs.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def axe_page(browser):
    """A page that accepts the injected axe-core script (tests/a11y.py), with the clipboard
    allowed (Copy buttons)."""
    from tests.a11y import axe_context

    context = axe_context(browser, permissions=["clipboard-read", "clipboard-write"])
    yield context.new_page()
    context.close()


@pytest.fixture
def example_policies(django_db_blocker):
    """The `chat` and `json` policies as the migrations install them (transactional tests flush
    them)."""
    import importlib

    from django.apps import apps

    from chat.models import OutputPolicy

    importlib.import_module("chat.migrations.0003_example_policies").create(apps, None)
    importlib.import_module("chat.migrations.0009_chat_policy_decoding").forward(apps, None)
    return {p.slug: p for p in OutputPolicy.objects.all()}


@pytest.fixture
def make_policy(db):
    """A stored policy with the given fields (validated as the admin would)."""
    from chat.infra.runtime import runtime
    from chat.models import OutputPolicy
    from chat.stores.policy_store import policy_errors

    def factory(**fields):
        fields.setdefault("name", fields["slug"])
        policy = OutputPolicy(**fields)
        policy.full_clean()
        assert policy_errors(policy, tokenizer=runtime.tokenizer()) == {}
        policy.save()
        return policy

    return factory


@pytest.fixture
def scripted(monkeypatch):
    """A scripted backend (harness/scripted.py) behind the process's runtime, for unit tests of
    what the turn (chat/turns/) does around generation; returns a function taking the answers to play."""
    from chat.engine.stack import StackConfig, build_stack
    from chat.infra.runtime import runtime
    from harness.scripted import ScriptedBackend

    made = []

    def install(*answers) -> ScriptedBackend:
        backend = ScriptedBackend(list(answers))
        stack = build_stack(backend, StackConfig(max_running=2))
        made.append(stack)
        monkeypatch.setattr(runtime, "backend", backend)
        monkeypatch.setattr(runtime, "stack", stack)
        monkeypatch.setattr(runtime, "state", "ready")
        return backend

    yield install
    for stack in made:
        stack.close()
