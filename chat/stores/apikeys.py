"""Per-user API keys: made once, shown once, kept only as a sha256, checked on every API call.

A key is 43 random url-safe characters behind an `sk-` marker; its first characters are kept
in clear so a user can tell keys apart. A plain sha256 is enough (no slow password hash):
the secret has 256 bits of entropy, so nobody can guess one from its hash.

A key works while it is not revoked, not expired (`expires_at`, chosen when it is made) and its
user could still sign in (chat/stores/access.py): a deactivated account, a password-only one
once CHAT_LOCAL_ACCOUNTS=0, or one the identity provider has not signed in for
CHAT_OIDC's `key_idle_days` is refused, with a sentence saying which.

Revoking a key (the account page, the admin, `manage.py apikey revoke`, an account's deletion:
all through `apikeys_revoke`) also stops the answers it is generating, in this process and,
through the turns' cancel bus, in every other: the second arrow that runs back up the floors,
as erasure.py's does, and for the same reason (what was withdrawn must stop being used now).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .. import turns
from ..infra.audit import audit_record
from ..models import ApiKey
from .access import sign_in_refusal

KEY_MARKER = "sk-"
PREFIX_CHARS = 10  # "sk-" and 7 random characters
# last_used_at is written at most this often per key, so a busy key costs no write per call.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# What the API keys page offers: a key's lifetime in days (None: never expires).
LIFETIME_CHOICES: dict[str, int | None] = {"never": None, "30": 30, "90": 90, "365": 365}
# A key not found or revoked: the same words for both, so they tell nothing about other keys.
UNKNOWN_KEY = "Incorrect or revoked API key provided"


class KeyRefused(Exception):
    """The key was not accepted; the message says why, to the key's holder."""


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(row: ApiKey) -> str:
    """Give an unsaved `row` a fresh secret (its prefix and hash); returns the key itself."""
    key = KEY_MARKER + secrets.token_urlsafe(32)
    row.prefix = key[:PREFIX_CHARS]
    row.key_hash = key_hash(key)
    return key


def apikey_create(*, user, name: str = "", lifetime_days: int | None = None) -> tuple[ApiKey, str]:
    """A new key for `user`, expiring after `lifetime_days` (None: never): the stored row and
    the key itself, which is never shown again."""
    row = ApiKey(user=user, name=name[:100])
    if lifetime_days:
        row.expires_at = timezone.now() + timedelta(days=lifetime_days)
    key = new_key(row)
    row.save()
    return row, key


def apikeys_revoke(keys: QuerySet[ApiKey]) -> int:
    """Revoke the active keys among `keys`; how many. After the commit, the answers they are
    generating anywhere are cancelled (finish_reason cancelled, reason api_key_revoked)."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(keys.filter(revoked_at__isnull=True).values_list("pk", flat=True))
        revoked = ApiKey.objects.filter(pk__in=ids, revoked_at__isnull=True).update(revoked_at=now)
        # One UPDATE for all, so no save signal: each key's revocation recorded here.
        for row in ApiKey.objects.filter(pk__in=ids, revoked_at=now).select_related("user"):
            audit_record(row, "apikey.revoke", changes={"revoked_at": [None, now.isoformat()]})
        if ids:
            transaction.on_commit(partial(turns.api_keys_stop, ids), robust=True)
    return revoked


def apikey_revoke(*, key_id: int, user=None) -> bool:
    """Revoke a key (of `user`, when given); False if there is no such active key."""
    keys = ApiKey.objects.filter(pk=key_id)
    if user is not None:
        keys = keys.filter(user=user)
    return apikeys_revoke(keys) == 1


def apikey_check(key: str) -> ApiKey:
    """The key matching `key`, noting its use, if it still works; else KeyRefused saying why."""
    if not key.startswith(KEY_MARKER) or len(key) > 200:
        raise KeyRefused(UNKNOWN_KEY)
    row = (
        ApiKey.objects.select_related("user", "user__oidc_identity")
        .filter(key_hash=key_hash(key), revoked_at__isnull=True)
        .first()
    )
    if row is None:
        raise KeyRefused(UNKNOWN_KEY)
    now = timezone.now()
    if row.expires_at is not None and row.expires_at <= now:
        raise KeyRefused(f"This API key expired on {row.expires_at:%Y-%m-%d %H:%M} UTC")
    refusal = sign_in_refusal(row.user, now)
    if refusal:
        raise KeyRefused(f"This API key no longer works: {refusal}")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def apikey_authenticate(key: str) -> ApiKey | None:
    """`apikey_check` for a caller that needs no reason: the key, or None."""
    try:
        return apikey_check(key)
    except KeyRefused:
        return None


def keys_of(user):
    """The user's keys, newest first, revoked ones included (for the account page)."""
    return ApiKey.objects.filter(user=user)
