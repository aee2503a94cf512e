"""One JSON POST with a deadline, for hooks that ask a service: stdlib only, every failure one
exception type with a reason staff can read."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["ServiceError", "post_json", "check_url", "check_env_name", "bearer", "use_secrets"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Enough for any moderation or guard reply; a larger one is a misconfigured URL.
_MAX_REPLY = 1 << 20


class ServiceError(Exception):
    """The service could not give an answer: unreachable, too slow, an error status, not JSON."""


def check_url(url: object) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be an http:// or https:// URL, not {url!r}")
    return url


def check_env_name(name: object) -> str:
    """An environment variable's name ("" for none): the key itself never sits in a policy."""
    if not isinstance(name, str) or (name and not _ENV_NAME.fullmatch(name)):
        raise ValueError(f"api_key_env must name an environment variable, not {name!r}")
    return name


# Where `api_key_env` names are looked up: the settings' CHAT_HOOK_SECRETS (the process
# environment), handed over by the chat app at start-up; until then no key is found.
_secrets: Mapping[str, str] = {}


def use_secrets(secrets: Mapping[str, str]) -> None:
    """Look hooks' API keys up in `secrets` from now on."""
    global _secrets
    _secrets = secrets


def bearer(api_key_env: str) -> dict[str, str]:
    """The Authorization header from the named variable; none when unnamed or unset."""
    key = _secrets.get(api_key_env, "") if api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


def post_json(
    url: str, body: dict[str, Any], *, headers: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """POST `body`, return the JSON object replied; ServiceError for anything else."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read(_MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace").strip()
        raise ServiceError(f"HTTP {exc.code} from {url}: {detail}") from None
    except TimeoutError:
        raise ServiceError(f"no answer from {url} within {timeout_s:g} s") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError | socket.timeout):
            raise ServiceError(f"no answer from {url} within {timeout_s:g} s") from None
        raise ServiceError(f"cannot reach {url}: {reason}") from None
    if len(raw) > _MAX_REPLY:
        raise ServiceError(f"the reply from {url} is over {_MAX_REPLY} bytes")
    try:
        value = json.loads(raw)
    except ValueError:
        raise ServiceError(f"the reply from {url} is not JSON: {raw[:80]!r}") from None
    if not isinstance(value, dict):
        raise ServiceError(f"the reply from {url} is not a JSON object")
    return value
