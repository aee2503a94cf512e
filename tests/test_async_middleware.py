"""Django's middleware on the event loop (project/async_middleware.py), driven over ASGI as daphne
serves it (Django's AsyncClient: the whole middleware stack in async mode, real database and
Redis): a request that keeps nothing passes every hook without a thread hop, and what each hook
must still do in a thread happens: a changed session is saved, admin messages are stored and
shown, a static file is served, the CSRF check refuses a forged post, the security headers are set.
Through the whole ASGI application as daphne runs it, the CSRF check before an exempt view or a
safe method passes on the loop too, and still refuses a forged post.
"""

from __future__ import annotations

import collections
from pathlib import Path

import asgiref.sync
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.test import AsyncClient

from project import async_middleware
from tests.test_audit import policy_post
from tests.test_openai_views import request

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-pass-phrase-42"


@pytest.fixture(autouse=True, scope="module")
def installed():
    import project.asgi  # noqa: F401 (installs it, as every daphne command line does)


@pytest.fixture(autouse=True)
def close_view_connections():
    """Views run in worker threads with their own connections: closed, so the test database can
    be dropped."""
    yield
    connections.close_all()


@pytest.fixture
def hops(monkeypatch) -> collections.Counter:
    """What each `sync_to_async` call ran, by qualified name."""
    counted: collections.Counter = collections.Counter()
    call = asgiref.sync.SyncToAsync.__call__

    def counting(self, *args, **kwargs):
        counted[getattr(self.func, "__qualname__", type(self.func).__qualname__)] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(asgiref.sync.SyncToAsync, "__call__", counting)
    return counted


def middleware_hops(hops: collections.Counter) -> set[str]:
    return {name for name in hops if "Middleware" in name}


async def test_a_request_that_keeps_nothing_takes_no_thread_hop_in_the_middleware(hops):
    response = await AsyncClient().get("/v1/nowhere")  # an async view; no session, no message
    assert response.status_code == 404
    # Only Django's CSRF check before the view, which the handler itself sends to a thread.
    assert middleware_hops(hops) == {"CsrfViewMiddleware.process_view"}


async def test_the_security_headers_are_set_on_the_loop():
    response = await AsyncClient().get("/accounts/login/")
    assert response.status_code == 200
    assert response["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "csrftoken" in response.cookies  # set by the CSRF middleware's response hook


async def test_signing_in_saves_the_session_and_the_next_request_is_signed_in(hops):
    await sync_to_async(User.objects.create_user)("ada", password=PASSWORD)
    client = AsyncClient()
    signed_in = await client.post("/accounts/login/", {"username": "ada", "password": PASSWORD})
    assert signed_in.status_code == 302
    # The session changed, so its save went to a thread, as Django does it.
    assert hops["SessionMiddleware.process_response"] == 1
    page = await client.get("/")
    assert 'id="signed-in-as">ada<' in page.content.decode()
    # Read, not changed: this response stayed on the loop.
    assert hops["SessionMiddleware.process_response"] == 1


async def test_a_message_added_in_the_admin_is_stored_and_shown_on_the_next_page(hops):
    staff = await sync_to_async(User.objects.create_superuser)("staffer", "s@example.com", PASSWORD)
    client = AsyncClient()
    await client.aforce_login(staff)
    made = await client.post("/admin/chat/outputpolicy/add/", policy_post())
    assert made.status_code == 302
    assert hops["MessageMiddleware.process_response"] == 1
    listing = await client.get(made["Location"])
    assert "was added successfully" in listing.content.decode()


async def test_a_forged_post_is_refused_and_one_with_the_cookies_token_passes():
    await sync_to_async(User.objects.create_user)("ada", password=PASSWORD)
    client = AsyncClient(enforce_csrf_checks=True)
    refused = await client.post("/accounts/login/", {"username": "ada", "password": PASSWORD})
    assert refused.status_code == 403
    page = await client.get("/accounts/login/")
    token = page.cookies["csrftoken"].value
    signed_in = await client.post(
        "/accounts/login/",
        {"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert signed_in.status_code == 302


async def test_a_static_file_is_served_and_any_other_path_reaches_its_view():
    name = "chat/answers.css"
    response = await AsyncClient().get(f"/static/{name}")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)  # a file, read as Django reads it
    assert body == (Path(settings.BASE_DIR) / "static" / name).read_bytes()
    missing = await AsyncClient().get("/static/chat/no-such-file.css")
    assert missing.status_code == 404  # passed on to Django, which has no such page


async def test_over_asgi_the_check_before_an_exempt_view_or_a_safe_method_stays_on_the_loop(hops):
    """The API's views are exempt, a page is read with GET: no thread for the check. A post to a
    page, its token read from the form, takes the thread and is refused without one."""
    assert (await request("POST", "/v1/chat/completions", b"{}")).status_code == 401
    page = await request("GET", "/accounts/login/")
    assert page.status_code == 200
    assert "CsrfViewMiddleware.process_view" not in hops
    await sync_to_async(User.objects.create_user)("ada", password=PASSWORD)
    form = b"username=ada&password=" + PASSWORD.encode()
    forged = await request(
        "POST",
        "/accounts/login/",
        form,
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert forged.status_code == 403
    assert hops["CsrfViewMiddleware.process_view"] == 1


def test_the_classes_keep_their_own_paths_and_their_sync_path():
    """Django's deploy checks look for Security, CSRF and X-Frame-Options by path; a sync
    request (the test client, WSGI) goes through Django's own code."""
    for middleware in async_middleware.ON_THE_LOOP:
        path = f"{middleware.__module__}.{middleware.__qualname__}"
        assert path in settings.MIDDLEWARE
        assert "__call__" not in vars(middleware)  # MiddlewareMixin's, which picks the path
