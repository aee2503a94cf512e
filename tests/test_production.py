"""Production settings for real: DEBUG off, static files collected and served by WhiteNoise from daphne."""

import re
import shlex
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import requests

from harness.liveserver import LiveServer

pytestmark = pytest.mark.integration

STATIC = Path(__file__).resolve().parent.parent / "static"


@pytest.fixture
def production_server(tmp_path):
    env = {
        "DEBUG": "0",
        "SECRET_KEY": "p" * 50,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    server = LiveServer(tmp_path, **env)
    server.manage("collectstatic", "--noinput", "-v0")  # what `make run` does when DEBUG is off
    server.start()
    yield server
    server.stop()


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_with_debug_off_the_page_links_hashed_static_files_that_daphne_serves(production_server):
    """The page refers to content-hashed static files; they are served with a long cache lifetime and the
    source's bytes; the page's modules import each other by hashed name too; unknown paths are
    plain 404s, never Django's debug page."""
    server = production_server
    status, _, page = get(server.url + "/")
    assert status == 200
    script = re.search(rb'src="(/static/chat/markdown\.[0-9a-f]{12}\.js)"', page)
    assert script, page[:600]
    status, headers, body = get(server.url + script.group(1).decode())
    assert status == 200 and body == (STATIC / "chat" / "markdown.js").read_bytes()
    assert "max-age=315360000" in headers.get("Cache-Control", "")

    main = re.search(rb'type="module" src="(/static/chat/page/main\.[0-9a-f]{12}\.js)"', page)
    assert main, page[-800:]
    seen, todo = set(), [main.group(1).decode()]
    while todo:  # every module the page loads, through its imports
        path = todo.pop()
        seen.add(path)
        status, headers, body = get(server.url + path)
        assert status == 200 and "max-age=315360000" in headers.get("Cache-Control", ""), path
        imports = re.findall(rb'from "\./([^"]+)"', body)
        assert imports or b"import " not in body, path
        for name in imports:
            assert re.fullmatch(rb"[a-z]+\.[0-9a-f]{12}\.js", name), (path, name)
            todo += [p for p in [path.rsplit("/", 1)[0] + "/" + name.decode()] if p not in seen]
    sources = {p.stem for p in (STATIC / "chat" / "page").glob("*.js")}
    assert {p.rsplit("/", 1)[1].split(".")[0] for p in seen} == sources
    for path in ("/static/chat/missing.js", "/no-such-page/"):
        status, _, body = get(server.url + path)
        assert status == 404 and b"DEBUG = True" not in body and b"Traceback" not in body


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def deployed_daphne_flags(command: str) -> tuple[str, ...]:
    """The flags a deploy file's command line gives daphne, its address and port left out (the
    test serves on a free loopback port)."""
    words = shlex.split(command)
    start = next(i for i, word in enumerate(words) if word.endswith("daphne")) + 1
    end = words.index("project.asgi:application")
    flags, words = [], words[start:end]
    while words:
        word = words.pop(0)
        if word in {"-b", "--bind", "-p", "--port"}:
            words.pop(0)
        else:
            flags.append(word)
    return tuple(flags)


def deploy_commands() -> dict[str, str]:
    procfile = (DEPLOY / "Procfile").read_text()
    unit = (DEPLOY / "systemd" / "chat-web@.service").read_text()
    return {
        "Procfile": re.search(r"^web:(.*)$", procfile, re.MULTILINE).group(1),
        "chat-web@.service": re.search(r"^ExecStart=(.*)$", unit, re.MULTILINE).group(1),
    }


@pytest.mark.parametrize("deploy_file", ["Procfile", "chat-web@.service"])
def test_the_deployed_daphne_does_not_take_the_clients_forwarded_for(tmp_path, deploy_file):
    """daphne started as the deploy file starts it: an X-Forwarded-For the client writes does
    not become its address, for the rate limits or the audit trail (CHAT_TRUSTED_PROXIES, 0 by
    default, is the only way to trust the header)."""
    flags = deployed_daphne_flags(deploy_commands()[deploy_file])
    server = LiveServer(tmp_path, daphne_flags=flags, CHAT_BACKEND="none")
    server.start(wait_for_model=False)
    try:
        browser = requests.Session()
        forged = {"X-Forwarded-For": "203.0.113.9"}
        browser.get(server.url + "/accounts/signup/", headers=forged, timeout=30)
        password = "a-long-pass-phrase-42"
        signed_up = browser.post(
            server.url + "/accounts/signup/",
            data={
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
                "username": "forger",
                "password1": password,
                "password2": password,
            },
            headers=forged,
            allow_redirects=False,
            timeout=30,
        )
        assert signed_up.status_code == 302, signed_up.text[:2000]
        rows = server.query(
            "SELECT remote_addr FROM auditlog_logentry WHERE object_repr = ?", ("forger",)
        )
        assert rows and {str(row["remote_addr"]) for row in rows} == {"127.0.0.1"}, rows
    finally:
        server.stop()
