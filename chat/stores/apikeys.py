"""Per-user API keys: made once, shown once, kept only as a sha256, checked on every API call.

A key is 43 random url-safe characters behind an `sk-` marker; its first characters are kept
in clear so a user can tell keys apart. A plain sha256 is enough (no slow password hash):
the secret has 256 bits of entropy, so nobody can guess one from its hash.

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

KEY_MARKER = "sk-"
PREFIX_CHARS = 10  # "sk-" and 7 random characters
# last_used_at is written at most this often per key, so a busy key costs no write per call.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(row: ApiKey) -> str:
    """Give an unsaved `row` a fresh secret (its prefix and hash); returns the key itself."""
    key = KEY_MARKER + secrets.token_urlsafe(32)
    row.prefix = key[:PREFIX_CHARS]
    row.key_hash = key_hash(key)
    return key


def apikey_create(*, user, name: str = "") -> tuple[ApiKey, str]:
    """A new key for `user`: the stored row and the key itself, which is never shown again."""
    row = ApiKey(user=user, name=name[:100])
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


def apikey_authenticate(key: str) -> ApiKey | None:
    """The active key of an active user matching `key`, noting its use; None otherwise."""
    if not key.startswith(KEY_MARKER) or len(key) > 200:
        return None
    row = (
        ApiKey.objects.select_related("user")
        .filter(key_hash=key_hash(key), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def keys_of(user):
    """The user's keys, newest first, revoked ones included (for the account page)."""
    return ApiKey.objects.filter(user=user)
