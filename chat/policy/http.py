"""One JSON POST with a deadline, for hooks that ask a service: stdlib only, only to a host the
operator allows (chat/policy/reach.py), never following a redirect, every failure one exception
type. What a failure tells whom: a user reads that the service is unavailable, staff the status
(`ServiceError`'s text: no URL, nothing the service replied), the server log all of it."""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from . import reach
from .moderation import ALLOWED, Verdict

__all__ = [
    "Refused",
    "ServiceError",
    "check_env_name",
    "check_url",
    "post_json",
    "service_failed",
    "service_failures",
]

log = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Enough for any moderation or guard reply; a larger one is a misconfigured URL.
_MAX_REPLY = 1 << 20


class ServiceError(Exception):
    """The service could not give an answer: unreachable, too slow, an error status, not JSON.
    Its text is the status staff may read; `detail` adds the URL and what the service said, for
    the server log only."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(status)
        self.detail = detail or status


class Refused(ServiceError):
    """Not called: the operator does not allow the host or the secret (any more). Such a hook
    fails closed, fail_open or not: it is misconfigured, not a service that is down."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is here: following it would take the request,
    and its key, to a host nobody allowed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl) -> None:  # type: ignore[no-untyped-def]
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def check_url(url: object) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be an http:// or https:// URL, not {url!r}")
    return url


def check_env_name(name: object) -> str:
    """A secret's name ("" for none): the key itself never sits in a policy."""
    if not isinstance(name, str) or (name and not _ENV_NAME.fullmatch(name)):
        raise ValueError(f"api_key_env must name an environment variable, not {name!r}")
    return name


def post_json(
    url: str, body: dict[str, Any], *, api_key_env: str, timeout_s: float
) -> dict[str, Any]:
    """POST `body` with the secret `api_key_env` names, return the JSON object replied;
    ServiceError for anything else, Refused before sending anything the operator forbids."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    # The host as urllib will connect to it, so no parse of the URL can differ from the check.
    connects_to = f"{request.type}://{request.host}/"
    problem = reach.host_problem(connects_to) or reach.secret_problem(api_key_env)
    if problem:
        raise Refused(f"refused: {problem}", f"refused to call {url}: {problem}")
    for name, value in {"Content-Type": "application/json", **reach.bearer(api_key_env)}.items():
        request.add_header(name, value)
    late = f"no answer within {timeout_s:g} s"
    try:
        with _opener.open(request, timeout=timeout_s) as response:
            raw = response.read(_MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        said = exc.read(300).decode(errors="replace").strip()
        redirect = " (redirects are not followed)" if 300 <= exc.code < 400 else ""
        raise ServiceError(
            f"the service answered HTTP {exc.code}{redirect}", f"HTTP {exc.code} from {url}: {said}"
        ) from None
    except TimeoutError:
        raise ServiceError(late, f"{late} from {url}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError | socket.timeout):
            raise ServiceError(late, f"{late} from {url}") from None
        raise ServiceError("cannot connect", f"cannot reach {url}: {reason}") from None
    if len(raw) > _MAX_REPLY:
        raise ServiceError(f"the reply is over {_MAX_REPLY} bytes", f"from {url}")
    try:
        value = json.loads(raw)
    except ValueError:
        raise ServiceError("the reply is not JSON", f"from {url}: {raw[:80]!r}") from None
    if not isinstance(value, dict):
        raise ServiceError("the reply is not a JSON object", f"from {url}: {raw[:80]!r}")
    return value


# Staff trying a draft collect the failures here (chat/turns/trial.py); a turn collects none.
_failures: ContextVar[list[str] | None] = ContextVar("hook_service_failures", default=None)


@contextmanager
def service_failures() -> Iterator[list[str]]:
    """While open, each service hook's failure is added as "hook: status"."""
    failures: list[str] = []
    token = _failures.set(failures)
    try:
        yield failures
    finally:
        _failures.reset(token)


def service_failed(hook: str, service: str, exc: ServiceError, *, fail_open: bool) -> Verdict:
    """The verdict of hook `hook` whose `service` ("moderation service") failed: withdrawn
    with only "<service> unavailable" as the reason the user reads, or let through when
    `fail_open` (never a refusal); logged in full, and told to staff trying a draft."""
    let_through = fail_open and not isinstance(exc, Refused)
    outcome = "answer let through (fail_open)" if let_through else "answer withdrawn"
    log.warning("%s (%s) failed, %s: %s", service, hook, outcome, exc.detail)
    failures = _failures.get()
    if failures is not None:
        failures.append(f"{hook}: {exc}")
    if let_through:
        return ALLOWED
    return Verdict(False, f"{service} unavailable", ("unavailable",))
