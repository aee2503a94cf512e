"""A real OpenID Connect provider on loopback for the sign-in tests: django-oauth-toolkit in a
Django process of its own (settings.py, urls.py, claims.py here), with its own SQLite database
and users, signing ID tokens with an RS256 key generated when it is made.

    provider = OidcProvider(tmp_path).start()
    provider.user("ada", "pass", email="ada@example.com", groups=["chat-staff"])
    provider.client("chat", "secret", redirect_uris=[...], post_logout_uris=[...])
    CHAT_OIDC=provider.spec("chat", "secret", staff_groups="chat-staff")
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ..liveserver import ROOT, free_port


def rsa_private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class OidcProvider:
    def __init__(self, workdir: Path, *, kid: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.url}/o"
        self.log_path = workdir / f"oidc-provider-{self.port}.log"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "harness.oidc_provider.settings",
            "OIDC_PROVIDER_DB": str(workdir / f"oidc-provider-{self.port}.sqlite3"),
            "OIDC_PROVIDER_KEY": rsa_private_key_pem(),
            "OIDC_PROVIDER_ISSUER": self.issuer,
            "PYTHONUNBUFFERED": "1",
            **({} if kid else {"OIDC_PROVIDER_NO_KID": "1"}),  # ID tokens signed without one
        }
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> OidcProvider:
        self._django("migrate", "-v0")
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the OIDC provider exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.discovery_url, timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"the OIDC provider did not answer in {timeout} s:\n{self.log()}")

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def _django(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def shell(self, code: str) -> str:
        return self._django("shell", "-c", code)

    def user(self, username: str, password: str, *, email: str = "", groups=()) -> None:
        """Make the provider's user (or update it): its password, e-mail and exactly `groups`."""
        self.shell(
            "from django.contrib.auth.models import Group, User\n"
            f"user, _ = User.objects.get_or_create(username={username!r})\n"
            f"user.email = {email!r}\n"
            f"user.set_password({password!r})\n"
            "user.save()\n"
            "user.groups.set([Group.objects.get_or_create(name=name)[0] "
            f"for name in {list(groups)!r}])\n"
        )

    def client(
        self, client_id: str, secret: str, *, redirect_uris: list[str], post_logout_uris: list[str]
    ) -> None:
        """Register the chat as a confidential client (authorization code, RS256 ID tokens),
        trusted: the provider asks its users for no consent."""
        fields = {
            "client_id": client_id,
            "client_secret": secret,
            "name": client_id,
            "client_type": "confidential",
            "authorization_grant_type": "authorization-code",
            "algorithm": "RS256",
            "redirect_uris": " ".join(redirect_uris),
            "post_logout_redirect_uris": " ".join(post_logout_uris),
            "skip_authorization": True,
        }
        self.shell(
            "from oauth2_provider.models import Application\n"
            f"fields = {fields!r}\n"
            "Application.objects.filter(client_id=fields['client_id']).delete()\n"
            "Application.objects.create(**fields)\n"
        )

    def spec(self, client_id: str, secret: str, **keys: str) -> str:
        """CHAT_OIDC for a chat signing in here, groups in the `groups` claim."""
        spec = {
            "issuer": self.issuer,
            "client_id": client_id,
            "secret": secret,
            "scopes": "openid email profile groups",
            "groups_claim": "groups",
            "name": "Loopback ID",
            **keys,
        }
        return ",".join(f"{key}={value}" for key, value in spec.items())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def provider_sign_in(
    authorize_url: str, username: str, password: str, browser: requests.Session | None = None
) -> str:
    """What a browser does at the provider, over plain HTTP: follow the authorization request,
    sign in on the provider's form if asked, and return the URL the provider sends the browser
    back to (the chat's callback with `code` and `state`, or with `error`)."""
    browser = browser or requests.Session()
    response = browser.get(authorize_url, allow_redirects=False, timeout=30)
    if response.status_code == 302 and "/accounts/login/" in response.headers["Location"]:
        login_url = urljoin(authorize_url, response.headers["Location"])
        form = browser.get(login_url, timeout=30)
        form.raise_for_status()
        response = browser.post(
            login_url,
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": browser.cookies["provider_csrftoken"],
                "next": parse_qs(urlsplit(login_url).query)["next"][0],
            },
            allow_redirects=False,
            timeout=30,
        )
        if response.status_code != 302:
            raise AssertionError(f"the provider refused {username}'s password")
        response = browser.get(
            urljoin(authorize_url, response.headers["Location"]), allow_redirects=False, timeout=30
        )
    if response.status_code != 302:
        raise AssertionError(f"the provider answered {response.status_code}: {response.text[:500]}")
    return response.headers["Location"]
