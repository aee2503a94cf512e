"""The environment variables: read in project/settings.py only, every one documented in
docs/configuration.md and nothing documented there that is not read, 30 at most; the spec and URL
variables parse as documented and a malformed one stops start-up."""

import ast
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from harness.layout_check import variables_read
from project import settings as product

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
# Read or set outside settings, and not a setting of this product: Django's own pointer to the
# settings module (the launcher and the ASGI entry point set it).
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE"}


def read_in_settings() -> set[str]:
    """The variables settings.py reads, counted as `make lint`'s layout check counts them."""
    return variables_read(ROOT)


def documented() -> set[str]:
    """The first column of the table in docs/configuration.md (one name a row)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", text, re.MULTILINE))


def environ_names(path: Path) -> set[str]:
    """Names this module reads from or writes to os.environ by a literal name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        key: ast.expr | None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in {
            "os.environ.get",
            "os.environ.setdefault",
            "os.getenv",
        }:
            key = node.args[0] if node.args else None
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    """A variable added to settings without a row in the table fails, and so does a row left
    behind for a variable settings no longer reads."""
    read, listed = read_in_settings(), documented()
    assert read - listed == set(), "read in project/settings.py but not in docs/configuration.md"
    assert listed - read == set(), "in docs/configuration.md but not read in project/settings.py"


def test_thirty_one_variables_at_most():
    """The product keeps to 31 variables; a 32nd means folding a family first."""
    assert len(read_in_settings()) <= 31


def test_the_product_reads_the_environment_in_settings_only():
    """chat/ and project/ read no variable by name outside settings, except the launcher, which
    reads only what settings documents. (A policy hook's API key variable is named by staff in
    the hook's own settings, a documented pattern for a secret: no fixed name to list.)"""
    allowed = read_in_settings() | NOT_SETTINGS
    for path in [*(ROOT / "chat").rglob("*.py"), *(ROOT / "project").glob("*.py")]:
        if path.name == "settings.py" and path.parent.name == "project":
            continue
        stray = environ_names(path) - allowed
        assert stray == set(), f"{path.relative_to(ROOT)} reads {sorted(stray)}"


def test_chat_touches_no_environment_at_all():
    """Not even by a name chosen at run time: a hook's API key comes from the settings'
    CHAT_HOOK_SECRETS, OpenMP's wait policy and the venv's PATH are set in settings."""
    for path in (ROOT / "chat").rglob("*.py"):
        source = path.read_text()
        assert "os.environ" not in source and "getenv" not in source, path.relative_to(ROOT)


def test_hooks_find_only_the_secrets_and_hosts_the_operator_names(monkeypatch):
    """CHAT_HOOKS: the listed variables, read once, are a hook's only secrets (never the rest of
    the environment, nor the server's own even when listed); its hosts, the only ones a hook
    may call."""
    monkeypatch.setenv("HOOK_TEST_KEY", "sk-test")
    monkeypatch.setenv("SECRET_KEY", "server-secret")
    hosts, secrets = product.hook_settings(
        {"hosts": "api.openai.com guard.internal:8000", "secrets": "HOOK_TEST_KEY HOOK_UNSET"}
    )
    assert hosts == ["api.openai.com", "guard.internal:8000"]
    assert secrets == {"HOOK_TEST_KEY": "sk-test", "HOOK_UNSET": ""}
    assert product.hook_settings({"hosts": "", "secrets": ""}) == ([], {})
    for listed in ("SECRET_KEY", "DATABASE_URL", "CHAT_OIDC", "not-a-name"):
        with pytest.raises(ImproperlyConfigured, match="CHAT_HOOKS: secrets="):
            product.hook_settings({"hosts": "", "secrets": listed})
    assert product.CHAT_HOOK_SECRETS == {} and product.CHAT_HOOK_HOSTS == []  # unset: none


def test_a_hook_sends_only_an_allowed_secret(settings, monkeypatch):
    from chat.policy import reach

    monkeypatch.setenv("SECRET_KEY", "server-secret")
    settings.CHAT_HOOK_SECRETS = {"HOOK_TEST_KEY": "sk-test", "HOOK_TEST_UNSET": ""}
    assert reach.bearer("HOOK_TEST_KEY") == {"Authorization": "Bearer sk-test"}
    assert reach.bearer("") == {} and reach.bearer("HOOK_TEST_UNSET") == {}
    assert reach.bearer("SECRET_KEY") == {} and reach.secret_problem("SECRET_KEY")
    assert reach.secret_problem("HOOK_TEST_UNSET") is None


def test_a_spec_takes_known_keys_only_and_a_rate_its_documented_forms():
    """`count/span` with s, m, h or d (the span's number optional), `0` for off; anything else
    stops start-up rather than being read as some other limit."""
    assert product.rate("r", "30/1m") == (30, 60.0)
    assert product.rate("r", "5/h") == (5, 3600.0)
    assert product.rate("r", "20/15m") == (20, 900.0)
    assert product.rate("r", "0") == (0, 60.0)
    with pytest.raises(ImproperlyConfigured, match="count/span"):
        product.rate("r", "30 a minute")


def test_a_spec_rejects_an_unknown_key(monkeypatch):
    """A misspelt key (`thread=`) stops start-up instead of being ignored; spaces are allowed."""
    monkeypatch.setenv("CHAT_ENGINE", "threads=2,thread=4")
    with pytest.raises(ImproperlyConfigured, match="'thread=4' is not one of"):
        product.envspec("CHAT_ENGINE", product.ENGINE_DEFAULTS)
    monkeypatch.setenv("CHAT_ENGINE", "threads=2, batch = 4")
    assert product.envspec("CHAT_ENGINE", product.ENGINE_DEFAULTS)["batch"] == "4"


def test_email_url_gives_djangos_mail_settings():
    """EMAIL_URL sets what the seven EMAIL_* variables and DEFAULT_FROM_EMAIL did: STARTTLS on
    smtp://, implicit TLS and port 465 on smtps://, a percent-encoded password decoded, the
    console without one."""
    smtp = product.email_settings(
        "smtp://mailer:p%40ss@mail.example.com:2525?from=chat@example.com"
    )
    assert smtp["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert (smtp["EMAIL_HOST"], smtp["EMAIL_PORT"]) == ("mail.example.com", 2525)
    assert (smtp["EMAIL_HOST_USER"], smtp["EMAIL_HOST_PASSWORD"]) == ("mailer", "p@ss")
    assert (smtp["EMAIL_USE_TLS"], smtp["EMAIL_USE_SSL"]) == (True, False)
    assert smtp["DEFAULT_FROM_EMAIL"] == "chat@example.com"
    implicit = product.email_settings("smtps://mail.example.com")
    assert (implicit["EMAIL_PORT"], implicit["EMAIL_USE_TLS"], implicit["EMAIL_USE_SSL"]) == (
        465,
        False,
        True,
    )
    console = product.email_settings("")
    assert console["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    with pytest.raises(ImproperlyConfigured, match="EMAIL_URL"):
        product.email_settings("mail.example.com")


def test_chat_remote_gives_the_url_key_and_options():
    """CHAT_REMOTE's password is the Bearer key and never stays in the URL sent to; its query
    gives the remote tier's options, each checked as its own variable was."""
    remote = product.remote_settings("http://:s3cret@10.0.0.5:8000/v1/?model=qwen&concurrency=3")
    assert remote["url"] == "http://10.0.0.5:8000/v1"  # the key never travels in the URL
    assert (remote["api_key"], remote["model"], remote["concurrency"]) == ("s3cret", "qwen", 3)
    assert (remote["global"], remote["timeout"], remote["context"]) == (0, 60.0, 0)
    with pytest.raises(
        ImproperlyConfigured, match="CHAT_REMOTE concurrency='0' must be at least 1"
    ):
        product.remote_settings("http://h/v1?model=m&concurrency=0")


def test_the_pinned_ninja_runs_the_kernels_build_even_beside_another(tmp_path):
    """Settings put the venv's own ninja first on PATH when another ninja is found there (a
    system one): a build of the kernels made by one version is rebuilt whole by the other."""
    import os
    import subprocess
    import sys

    pinned = Path(sys.executable).parent / "ninja"
    if not pinned.exists():
        pytest.skip("no ninja beside this interpreter (requirements-dev.txt installs one)")
    other = tmp_path / "ninja"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import project.settings_bench, shutil; print(shutil.which('ninja'))",
        ],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == str(pinned)
