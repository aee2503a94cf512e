"""What the operator lets a hook that calls a service reach (CHAT_HOOKS): the hosts its `url` may
name and the secrets its `api_key_env` may name (name -> value), never the rest of the
environment. Staff choose among these in a policy and never widen them: the admin's form refuses anything
else, and a call checks again, since the lists may have shrunk since the policy was saved.

project/settings.py reads both; the chat app hands them over at start-up (and again when a test
changes the settings). Until then nothing is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

__all__ = ["allow", "bearer", "host_problem", "parse_host", "problems", "secret_problem"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = re.compile(r"[a-z0-9._:-]+")  # a name, an IPv4 or an IPv6 address
# (host, port); port None: every port of that host.
_hosts: frozenset[tuple[str, int | None]] = frozenset()
_host_names: tuple[str, ...] = ()
_secrets: Mapping[str, str] = {}


def parse_host(entry: str) -> tuple[str, int | None]:
    """One allowed host as the operator writes it: `name`, `name:port`, an IP, `[v6]:port`."""
    text = entry.strip().lower()
    try:
        parts = urlsplit(f"//{text}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = None
    if not host or not _HOST.fullmatch(host) or parts.username is not None or parts.path:
        raise ValueError(f"{entry!r} is not a host name or host:port")
    return host, port


def allow(*, hosts: Iterable[str], secrets: Mapping[str, str]) -> None:
    """From now on hooks may call only `hosts` and send only the values of `secrets`."""
    global _hosts, _host_names, _secrets
    entries = [entry.strip() for entry in hosts if entry.strip()]
    _hosts = frozenset(parse_host(entry) for entry in entries)
    _host_names = tuple(entries)
    _secrets = dict(secrets)


def host_problem(url: str) -> str | None:
    """Why a hook may not call `url`, or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if "@" in parts.netloc:
        return "a hook's URL carries no user name or password (api_key_env sends the key)"
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return "the URL's port is not a port number"
    if (host, None) in _hosts or (host, port) in _hosts:
        return None
    allowed = ", ".join(_host_names) or "none"
    shown = f"{host}:{port}" if parts.port else host
    return (
        f"host {shown or '(none)'} is not one the operator allows hooks to call "
        f"(CHAT_HOOKS hosts: {allowed})"
    )


def secret_problem(api_key_env: str) -> str | None:
    """Why a hook may not send the secret named `api_key_env` ("" sends none), or None."""
    if not api_key_env or api_key_env in _secrets:
        return None
    allowed = ", ".join(sorted(_secrets)) or "none"
    return (
        f"api_key_env {api_key_env!r} is not a hook secret the operator allows "
        f"(CHAT_HOOKS secrets: {allowed}; empty sends no key)"
    )


def problems(url: str, api_key_env: str) -> list[str]:
    """Everything a hook's settings would reach that the operator does not allow."""
    return [p for p in (host_problem(url), secret_problem(api_key_env)) if p]


def bearer(api_key_env: str) -> dict[str, str]:
    """The Authorization header for an allowed secret; none when unnamed or set empty.
    Only after `secret_problem` said yes: a name not allowed finds nothing here either."""
    key = _secrets.get(api_key_env, "") if api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}
