"""The audit trail: who did what, when, with the values before and after (django-auditlog).

The library records create, change and delete of the models `AUDITLOG_INCLUDE_TRACKING_MODELS`
names (project/settings.py) by itself, from their save and delete signals. What is not one model
save is recorded here explicitly (`audit_record`): a cached answer's review (its row and its Redis
entry), keys revoked by one UPDATE, a sign-in throttle tripped. Each record carries its `event`
(`outputpolicy.update`, `cachedanswer.approve`, ...), which the admin filters on, and its actor's
id, which outlives the actor: erasing an account keeps the records it is in and redacts its
personal data (`audit_redact`). Records past CHAT_AUDIT_RETENTION_DAYS go with `manage.py purge`
(`audit_expire`). Docs: docs/privacy.md, docs/operations.md.
"""

from __future__ import annotations

import ipaddress
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from auditlog.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db.models import Q
from django.db.models.signals import pre_save
from django.dispatch import receiver
from django.utils import timezone

from ..models import ApiKey, Budget, CachedAnswer
from . import ratelimit

ACTIONS = {
    LogEntry.Action.CREATE: ("create", "created"),
    LogEntry.Action.UPDATE: ("update", "changed"),
    LogEntry.Action.DELETE: ("delete", "deleted"),
    LogEntry.Action.ACCESS: ("access", "accessed"),
}
# Recorded explicitly, each by the one function that does it; the admin's action filter lists
# these beside each tracked model's created/changed/deleted.
EXPLICIT_EVENTS = {
    "cachedanswer.approve": "cached answer approved",
    "cachedanswer.reject": "cached answer rejected",
    "cachedanswer.edit": "cached answer edited",
    "cachedanswer.evict": "cached answer evicted",
    "cachedanswer.reset": "cached answer reset",
    "cachedanswer.send_back": "cached answer sent back by users' thumbs-down",
    "apikey.revoke": "API key revoked",
    "user.signin_throttled": "sign-in throttled",
    "outputpolicy.try": "output policy draft tried",
}
SIGNIN_THROTTLED = "user.signin_throttled"
# The user's own fields that are personal data, blanked when the account is erased.
PERSONAL_FIELDS = ("username", "email", "first_name", "last_name")
ANSWER_ERASED = "[erased with the cached answer]"


def erased_user(user_id: int | None) -> str:
    return f"[erased user #{user_id}]"


# -- who and from where: the request's ---------------------------------------------


@dataclass(frozen=True)
class RequestContext:
    user: object  # request.user, still lazy: read only when a record is written
    address: str | None


_request: ContextVar[RequestContext | None] = ContextVar("audit_request", default=None)
# Accounts being erased right now: their own records name them by id only, never as the actor
# (the row the actor column would point to is going).
_erasing: ContextVar[frozenset[int]] = ContextVar("audit_erasing", default=frozenset())


@contextmanager
def actor_erased(user_id: int):
    """While account `user_id` is deleted, what it does is recorded without the actor column."""
    token = _erasing.set(_erasing.get() | {user_id})
    try:
        yield
    finally:
        _erasing.reset(token)


def _address(request) -> str | None:
    """The client's address as the rate limits find it (CHAT_TRUSTED_PROXIES), if it is one."""
    meta = request.META
    peer = ratelimit.client_peer(meta.get("REMOTE_ADDR"), meta.get("HTTP_X_FORWARDED_FOR"))
    try:
        return str(ipaddress.ip_address(peer or ""))
    except ValueError:
        return None  # a unix socket, or nothing: the column takes addresses only


class AuditRequestMiddleware:
    """Makes the signed-in user and the client's address the actor and address of every record
    written while the request runs. Sync and async alike, so the streaming views stay async
    (auditlog's own middleware is sync only, and reads X-Forwarded-For's client-written end)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        token = _request.set(RequestContext(getattr(request, "user", None), _address(request)))
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)

    async def _acall(self, request):
        token = _request.set(RequestContext(getattr(request, "user", None), _address(request)))
        try:
            return await self.get_response(request)
        finally:
            _request.reset(token)


@receiver(pre_save, sender=LogEntry, dispatch_uid="chat-audit-who-and-what")
def _record_filled(sender, instance: LogEntry, **kwargs) -> None:  # noqa: ARG001 (Django's signature)
    """Every new record: its actor and address from the request unless given, its event, and
    its actor's id (kept when the actor column is emptied by the actor's erasure)."""
    if instance.pk is not None:
        return  # a redaction rewriting a record
    context = _request.get()
    data = dict(instance.additional_data or {})
    if context is not None:
        user = context.user
        if instance.actor_id is None and getattr(user, "is_authenticated", False):
            instance.actor = user
        if instance.remote_addr is None:
            instance.remote_addr = context.address
    data.setdefault("event", f"{instance.content_type.model}.{ACTIONS[instance.action][0]}")
    if instance.actor_id is not None:
        data.setdefault("actor_id", instance.actor_id)
        if instance.actor_id in _erasing.get():
            instance.actor = None
    instance.actor_email = None  # the actor's id says who; an address is kept nowhere twice
    instance.additional_data = data


# -- explicit records ---------------------------------------------------------------


def audit_record(instance, event: str, *, changes: dict, actor=None, **fields) -> LogEntry:
    """One record of `event` (a name of EXPLICIT_EVENTS) on `instance`: `changes` is
    {field: [before, after]}; the actor is the request's unless given."""
    if event not in EXPLICIT_EVENTS:
        raise ValueError(f"{event!r} is not an audited event; add it to EXPLICIT_EVENTS")
    return LogEntry.objects.log_create(  # force_log: always written
        instance,
        force_log=True,
        action=LogEntry.Action.UPDATE,
        changes=changes,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        serialized_data=None,
        additional_data={"event": event},
        **fields,
    )


def audit_signin_throttled(*, username: str, address: str, limits: list[str]) -> LogEntry:
    """A failed sign-in that tripped `limits` (account, address): about the account, if there
    is one by that name. A name that is no account's is not kept: people type their password in
    the name field, and the trail is read by staff and kept for a year."""
    user_model = get_user_model()
    user = (
        user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
        if username
        else None
    )
    named = user.get_username() if user else ""
    return LogEntry.objects.create(
        content_type=ContentType.objects.get_for_model(user_model),
        object_pk=str(user.pk) if user else "",
        object_id=user.pk if user else None,
        object_repr=named or ("(no such account)" if username else "(no username)"),
        action=LogEntry.Action.ACCESS,
        changes={},
        additional_data={
            "event": SIGNIN_THROTTLED,
            "limits": limits,
            "username": named,
            "address": address,  # the limit's key: an IPv6 client's /64
        },
    )


# -- erasure and retention ----------------------------------------------------------


def _names_pattern(names: list[str]) -> re.Pattern | None:
    """`names` where they stand alone (not inside a longer name or word), in any case."""
    names = [name for name in names if name]
    if not names:
        return None
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w.@+-])(?:{alternatives})(?![\w.@+-])", re.IGNORECASE)


def _scrubbed(value, pattern: re.Pattern | None, replacement: str):
    if isinstance(value, str):
        return pattern.sub(replacement, value) if pattern else value
    if isinstance(value, list):
        return [_scrubbed(item, pattern, replacement) for item in value]
    if isinstance(value, dict):
        return {key: _scrubbed(item, pattern, replacement) for key, item in value.items()}
    return value


def audit_redact(
    *, user_id: int, username: str, email: str, key_ids: list[int], budget_ids: list[int]
) -> int:
    """After account `user_id` is erased: every record it made, or that is about it, its keys
    or its budgets, is kept with its personal data redacted (its name and e-mail address wherever
    they stand, its own personal fields' values, the client addresses); how many records."""
    user_type = ContentType.objects.get_for_model(get_user_model())
    key_type = ContentType.objects.get_for_model(ApiKey)
    budget_type = ContentType.objects.get_for_model(Budget)
    about_user = Q(content_type=user_type, object_pk=str(user_id))
    entries = LogEntry.objects.filter(
        Q(actor_id=user_id)
        | Q(additional_data__actor_id=user_id)
        | about_user
        | Q(content_type=key_type, object_pk__in=[str(pk) for pk in key_ids])
        | Q(content_type=budget_type, object_pk__in=[str(pk) for pk in budget_ids])
        | Q(additional_data__event=SIGNIN_THROTTLED, additional_data__username__iexact=username)
    )
    pattern, replacement = _names_pattern([username, email]), erased_user(user_id)
    redacted = 0
    for entry in entries.iterator():
        own = entry.content_type_id == user_type.pk and entry.object_pk in {str(user_id), ""}
        changes = _scrubbed(entry.changes or {}, pattern, replacement)
        if own:
            for field in PERSONAL_FIELDS:
                if field in changes:
                    changes[field] = [None if v is None else replacement for v in changes[field]]
        data = _scrubbed(entry.additional_data or {}, pattern, replacement)
        data.pop("address", None)
        data["redacted_at"] = timezone.now().isoformat()
        entry.changes, entry.additional_data = changes, data
        entry.object_repr = (
            replacement if own else _scrubbed(entry.object_repr, pattern, replacement)
        )
        entry.remote_addr = entry.actor_email = entry.serialized_data = None
        entry.save(
            update_fields=[
                "changes",
                "additional_data",
                "object_repr",
                "remote_addr",
                "actor_email",
                "serialized_data",
            ]
        )
        redacted += 1
    return redacted


def audit_answer_forget(*, record_id: int) -> None:
    """A cached answer erased with the conversations that held its prompt: its records stay,
    the texts they kept go (an answer may repeat what its prompt said)."""
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(CachedAnswer), object_pk=str(record_id)
    )
    for entry in entries.iterator():
        if "answer" in (entry.changes or {}):
            entry.changes = {**entry.changes, "answer": [ANSWER_ERASED, ANSWER_ERASED]}
            entry.save(update_fields=["changes"])


def audit_expire(*, days: int) -> int:
    """Delete the records older than `days` days (0: keep all); how many."""
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = LogEntry.objects.filter(timestamp__lt=cutoff).delete()
    return deleted


def event_label(entry: LogEntry) -> str:
    """The event in words: "cached answer approved", "output policy changed"."""
    event = (entry.additional_data or {}).get("event", "")
    if event in EXPLICIT_EVENTS:
        return EXPLICIT_EVENTS[event]
    model = entry.content_type.model_class()
    name = model._meta.verbose_name if model else entry.content_type.model
    return f"{name} {ACTIONS[entry.action][1]}"
