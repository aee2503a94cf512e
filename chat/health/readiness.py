"""Readiness of the three things a chat turn needs: the model, Redis, the database; and of each
engine row this process has used (chat/infra/engines.py), one line each."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import redis
from django.conf import settings
from django.db import connection

from ..infra.ratelimit import prompt_limiter
from ..infra.runtime import runtime
from ..stores.cache import completion_cache

if TYPE_CHECKING:
    from ..engine.remote.openai_backend import OpenAIBackend

log = logging.getLogger(__name__)

# Parts whose full status carries a driver's error text, a host or the upstream server's URL.
PARTS = ("redis", "database", "cache", "rate_limit", "upstream_status")
_logged: dict[str, str] = {}


def redis_status() -> str:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        client.ping()
        client.close()
        return "ok"
    except (redis.RedisError, OSError) as exc:
        return f"unavailable: {exc}"


def database_status() -> str:
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # any driver error means "not ready", with its text
        return f"unavailable: {exc}"


def health() -> tuple[bool, dict]:
    model = "ready" if runtime.state == "ready" else runtime.state
    report = {
        "status": "ok",
        "model": model,
        "model_name": runtime.backend.model_id if runtime.backend else None,
        "backend": settings.CHAT_BACKEND,
        "detail": runtime.detail,
        "redis": redis_status(),
        "database": database_status(),
        "cache": completion_cache.status(),
        "rate_limit": prompt_limiter.status(),
    }
    if settings.CHAT_BACKEND == "openai":
        report["upstream"] = settings.CHAT_REMOTE_URL
        # CHAT_BACKEND=openai: the runtime's backend is an OpenAIBackend once loaded
        backend = cast("OpenAIBackend | None", runtime.backend)
        report["upstream_status"] = backend.probe() if backend else runtime.state
        if backend is not None:
            report["upstream_capabilities"] = backend.capabilities.summary()
    engines = runtime.engines.statuses()
    if engines:
        report["engines"] = engines
    # Without Redis the chat still answers, uncached: degraded, not down. Every process shares
    # one inference server, so its outage is reported but does not pull this one out of rotation.
    ready = model == "ready" and report["database"] == "ok" and not runtime.draining
    if runtime.draining:  # stopping: the balancer sends new users elsewhere
        report["status"] = "draining"
    elif not ready:
        report["status"] = "loading" if runtime.state in {"idle", "loading"} else "unavailable"
    elif (
        report["redis"] != "ok"
        or report["cache"] != "ok"
        or report.get("upstream_status", "ok") != "ok"
        or any(status != "ok" for status in engines.values())
    ):
        report["status"] = "degraded"
    return ready, report


def public(report: dict, *, staff: bool = False) -> dict:
    """What anyone may read: each part ok or unavailable, without the upstream's URL. The
    detail goes to the log, once per change, for the operator. Engines are counted (how many
    are ok, how many unavailable): their slugs would tell an anonymous caller which models and
    groups exist. Staff get each engine by slug with its full status, the why included."""
    shown = {key: value for key, value in report.items() if key != "upstream"}
    for part in PARTS:
        if part not in report:
            continue
        status = report[part]
        if _logged.get(part, "ok") != status:
            _logged[part] = status
            log.warning("healthz %s: %s", part, status)
        shown[part] = "ok" if status == "ok" else "unavailable"
    if "engines" in report:  # why one is down goes to the log, once per change
        counted = {"ok": 0, "unavailable": 0}
        for slug, status in report["engines"].items():
            if _logged.get(f"engine {slug}", "ok") != status:
                _logged[f"engine {slug}"] = status
                log.warning("healthz engine %s: %s", slug, status)
            counted["ok" if status == "ok" else "unavailable"] += 1
        shown["engines"] = dict(report["engines"]) if staff else counted
    return shown
