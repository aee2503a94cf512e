"""What a URL or spec variable turns into: the Django settings each family of knobs sets, and
the logging. Pure functions of the values project/settings.py read; a malformed one raises
ImproperlyConfigured naming the variable."""

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from .env import env, number


def database_settings(url: str) -> dict[str, Any]:
    """DATABASE_URL as Django's database settings; SQLite tuned for a chat's small writes."""
    database: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if database["ENGINE"] == "django.db.backends.sqlite3":
        # Kept open between requests (project/request_threads.py keeps the threads that hold
        # them): opening one registers Django's SQL functions and runs the pragmas below, and
        # closing the last one checkpoints the log, together the largest cost of a request.
        database["CONN_MAX_AGE"] = None
        # WAL lets readers and the writer go on together, and NORMAL syncs at checkpoints rather than
        # every commit: each turn's few small writes stop costing a disk flush each.
        database["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            # How long a write waits for another connection's lock before "database is locked":
            # `?timeout=` on DATABASE_URL, 5 s by default.
            "timeout": number(
                "DATABASE_URL timeout",
                database.get("OPTIONS", {}).get("timeout", "5"),
                float,
            ),
        }
    elif database["ENGINE"] == "django.db.backends.postgresql":
        database["OPTIONS"] = postgres_options(database.get("OPTIONS", {}))
        # With the pool, Django checks a connection as the pool lends it: after PostgreSQL
        # restarted, a dead one is replaced, not handed to a request.
        database["CONN_HEALTH_CHECKS"] = "pool" in database["OPTIONS"]
    return database


# Connections a process's pool keeps at most (`?pool=` on DATABASE_URL; 0: no pool).
POSTGRES_POOL_SIZE = 20


def postgres_options(options: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL's OPTIONS with Django's connection pool (psycopg_pool). Django gives each ASGI
    request a thread of its own, so without a pool every request opened a connection: a server
    process forked on PostgreSQL's side and a login, several milliseconds of both machines'
    time. `?pool=N` bounds the connections one process holds (a request waits up to 10 s for
    one, then fails as the database being unavailable); `?pool=0` connects per request."""
    options = dict(options)
    size = number("DATABASE_URL pool", options.pop("pool", str(POSTGRES_POOL_SIZE)), int)
    if size:
        options["pool"] = {"min_size": 1, "max_size": size, "timeout": 10}
    return options


def logging_settings(level: str) -> dict[str, Any]:
    """One plain line a record on the console: the chat's records at `level`, Django's warnings."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "loggers": {
            "chat": {
                "handlers": ["console"],
                "level": level,
                "propagate": False,
            },
            "django": {"handlers": ["console"], "level": "WARNING"},
        },
    }


def oidc_settings(spec: dict[str, str]) -> dict[str, Any]:
    """Sign-in with an OpenID Connect provider from CHAT_OIDC's keys: the Django settings the
    mozilla-django-oidc library and chat/accounts/oidc_*.py read. An empty `issuer` turns it
    off. The provider's endpoints are discovered from the issuer at first use, not here."""
    issuer = spec["issuer"].rstrip("/")
    if not issuer:
        return {"CHAT_OIDC": None}
    parts = urlsplit(issuer)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ImproperlyConfigured(f"CHAT_OIDC issuer={issuer!r}: use the issuer's https:// URL")
    if not spec["client_id"] or not spec["secret"]:
        raise ImproperlyConfigured("CHAT_OIDC: an issuer needs client_id=... and secret=...")
    scopes = spec["scopes"].split()
    if "openid" not in scopes:
        raise ImproperlyConfigured(f"CHAT_OIDC scopes={spec['scopes']!r} must include openid")
    return {
        "CHAT_OIDC": {
            "issuer": issuer,
            "name": spec["name"] or parts.hostname,
            "groups_claim": spec["groups_claim"],
            "staff_groups": set(spec["staff_groups"].split()),
            "superuser_groups": set(spec["superuser_groups"].split()),
            "origin": f"{parts.scheme}://{parts.netloc}",
        },
        "OIDC_RP_CLIENT_ID": spec["client_id"],
        "OIDC_RP_CLIENT_SECRET": unquote(spec["secret"]),  # %2C for a comma
        "OIDC_RP_SCOPES": " ".join(scopes),
    }


def email_settings(url: str) -> dict[str, object]:
    """Django's EMAIL_* settings from one URL: `smtp://user:password@host:587` (STARTTLS;
    `?tls=0` for none), `smtps://...:465` (implicit TLS); `?from=` is the sender. Empty prints
    mail to the console."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - {"from", "tls"}
    if parts.scheme not in {"", "smtp", "smtps"} or unknown or (url and not parts.hostname):
        raise ImproperlyConfigured(
            f"EMAIL_URL: use smtp://user:password@host:587 or smtps://...:465 "
            f"(options ?from=, ?tls=0), not {parts.scheme or url!r}"
        )
    ssl = parts.scheme == "smtps"
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"
        if url
        else "django.core.mail.backends.console.EmailBackend",
        "EMAIL_HOST": parts.hostname or "",
        "EMAIL_PORT": parts.port or (465 if ssl else 587),
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_SSL": ssl,
        "EMAIL_USE_TLS": not ssl and query.get("tls", "1") not in {"0", "false", "off", "no"},
        "DEFAULT_FROM_EMAIL": query.get("from", "chat@localhost"),
    }


# The product's own secrets are never a hook's, even when listed by mistake.
SERVER_SECRETS = frozenset(
    {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "CHAT_CACHE_REDIS_URL",
        "EMAIL_URL",
        "CHAT_OIDC",
        "CHAT_REMOTE",
        "CHAT_METRICS_TOKEN",
    }
)


def hook_settings(spec: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """CHAT_HOOKS as (hosts a hook may call, {secret's name: value}): only the variables it
    lists, read once; one that is unset is allowed and sends no key."""
    names = spec["secrets"].split()
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in SERVER_SECRETS:
            raise ImproperlyConfigured(
                f"CHAT_HOOKS: secrets={name} is not a variable a hook may read (a name, and "
                f"none of the server's own: {', '.join(sorted(SERVER_SECRETS))})"
            )
    return spec["hosts"].split(), {name: env(name) for name in names}


def remote_settings(url: str, used: bool = False) -> dict[str, object]:
    """The inference server from one URL: its API root, with the key as the password and the
    knobs as the query, e.g. `http://:KEY@10.0.0.5:8000/v1?model=qwen&concurrency=8`. `used`
    (CHAT_BACKEND=openai): a server, a model and a readable tokenizer folder are required."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    known = {"model", "concurrency", "global", "timeout", "context", "tokenizer"}
    if unknown := set(query) - known:
        raise ImproperlyConfigured(
            f"CHAT_REMOTE: unknown option(s) {', '.join(sorted(unknown))}; "
            f"use {', '.join(sorted(known))}"
        )
    netloc = parts.netloc.rpartition("@")[2]
    remote = {
        "url": urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/"),
        "api_key": unquote(parts.password or ""),
        "model": query.get("model", ""),
        # Open upstream streams per process, and (above 0) in all, through one FIFO in Redis.
        "concurrency": number("CHAT_REMOTE concurrency", query.get("concurrency", "8"), int, 1),
        "global": number("CHAT_REMOTE global", query.get("global", "0"), int),
        # Connect, and longest wait for the next token.
        "timeout": number("CHAT_REMOTE timeout", query.get("timeout", "60"), float, 0.001),
        # The served model's context; 0: from the tokenizer folder's config, else unknown.
        "context": number("CHAT_REMOTE context", query.get("context", "0"), int),
        # A local tokenizer folder for token counts; empty: the local model's; "none": none.
        "tokenizer": query.get("tokenizer", ""),
    }
    if used:
        if not remote["url"].startswith(("http://", "https://")):
            raise ImproperlyConfigured(
                "CHAT_BACKEND=openai needs CHAT_REMOTE, the server's API root such as "
                f"http://host:8000/v1?model=NAME (got {remote['url']!r})"
            )
        if not remote["model"]:
            raise ImproperlyConfigured(
                "CHAT_BACKEND=openai needs the served model's name: CHAT_REMOTE=...?model=NAME"
            )
        if (
            remote["tokenizer"] not in {"", "none"}
            and not (Path(str(remote["tokenizer"])) / "tokenizer_config.json").is_file()
        ):
            raise ImproperlyConfigured(
                f"CHAT_REMOTE tokenizer={remote['tokenizer']}: no tokenizer_config.json there "
                "(use 'none' to count nothing)"
            )
    return remote
