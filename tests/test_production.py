"""Production settings for real: DEBUG off, static files collected and served by WhiteNoise from daphne."""

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

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
