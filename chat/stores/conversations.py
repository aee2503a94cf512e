"""Managing one's conversations: rename, pin, archive, delete, export. Always through the owner's own queryset.

Deleting a conversation deletes its messages, cancels an answer still generating in it, and
reaches the completion cache: a cached answer that no other conversation holds goes from Redis
and from the review list (chat/stores/erasure.py; docs/privacy.md).
"""

from __future__ import annotations

import json

from django.utils import timezone

from ..models import Feedback
from .apikeys import keys_of
from .branches import Tree
from .erasure import conversations_erase
from .selectors import Owner, conversation_detail, conversations_for, message_as_dict
from .user_settings import settings_export

MAX_TITLE = 120


class BadTitle(ValueError):
    pass


class BadChange(ValueError):
    """A pin or archive change that is not true or false."""


def conversation_rename(*, owner: Owner, conversation_id: int, title) -> bool:
    """Give the owner's conversation a new title; False if it is not theirs (or does not exist)."""
    if not isinstance(title, str) or not title.strip():
        raise BadTitle("title must be a non-empty string")
    title = " ".join(title.split())
    if len(title) > MAX_TITLE:
        raise BadTitle(f"title is {len(title)} characters; the limit is {MAX_TITLE}")
    return bool(conversations_for(owner).filter(pk=conversation_id).update(title=title))


def conversation_mark(*, owner: Owner, conversation_id: int, pinned=None, archived=None) -> bool:
    """Pin or unpin, archive or unarchive the owner's conversation (None leaves a flag alone);
    False if it is not theirs. Neither change moves it in the list by day (updated_at)."""
    for name, value in (("pinned", pinned), ("archived", archived)):
        if value is not None and not isinstance(value, bool):
            raise BadChange(f"{name} must be true or false")
    rows = conversations_for(owner).filter(pk=conversation_id)
    if not rows.exists():
        return False
    if pinned is not None:
        rows.update(pinned=pinned)
    if archived:  # archiving it again keeps when it was first archived
        rows.filter(archived_at__isnull=True).update(archived_at=timezone.now())
    elif archived is not None:
        rows.update(archived_at=None)
    return True


def conversation_delete(*, owner: Owner, conversation_id: int) -> bool:
    """Delete the owner's conversation and its messages; False if it is not theirs."""
    return (
        conversations_erase(conversations=conversations_for(owner).filter(pk=conversation_id)) > 0
    )


def export_json(owner: Owner, conversation_id: int) -> str | None:
    detail = conversation_detail(owner, conversation_id)
    if detail is None:
        return None
    detail["exported_at"] = timezone.now().isoformat()
    return json.dumps(detail, ensure_ascii=False, indent=2)


def export_markdown(owner: Owner, conversation_id: int) -> str | None:
    detail = conversation_detail(owner, conversation_id)
    if detail is None:
        return None
    lines = [f"# {detail['title']}", "", f"_Exported {timezone.now():%Y-%m-%d %H:%M} UTC_", ""]
    return "\n".join(lines + _markdown_messages(detail, level=2))


def _markdown_messages(detail: dict, *, level: int) -> list[str]:
    lines = []
    for message in detail["messages"]:
        who = "You" if message["role"] == "user" else "Assistant"
        versions = message.get("versions") or [message["id"]]
        if len(versions) > 1:
            who += f" (version {versions.index(message['id']) + 1} of {len(versions)})"
        if message.get("shown") is False:
            who += " (on another branch)"
        stamp = message["created_at"][:16].replace("T", " ")
        body = message["text"]
        if message["json"] is not None:
            body = "```json\n" + json.dumps(message["json"], ensure_ascii=False, indent=2) + "\n```"
        lines += [f"{'#' * level} {who} · {stamp}", "", body, ""]
    return lines


# -- everything an account holds, before it is deleted ------------------------------


def _all_details(user) -> list[dict]:
    """Every conversation of `user`'s, oldest first, API ones included, as `conversation_detail`
    but with every version of every message (`shown`: on the branch the conversation shows)."""
    conversations = (
        conversations_for(Owner(user_id=user.pk, session_key=""))
        .select_related("api_key")
        .prefetch_related("messages")
        .order_by("created_at", "pk")
    )
    ratings = {
        message_id: {"rating": rating, "comment": comment}
        for message_id, rating, comment in Feedback.objects.filter(
            message__conversation__in=conversations, kind=Feedback.Kind.RATING
        ).values_list("message_id", "rating", "comment")
    }
    details = []
    for c in conversations:
        tree = Tree.built(list(c.messages.all()))
        shown = {m.pk for m in tree.path()}
        messages = [
            {
                **message_as_dict(m, ratings.get(m.pk)),
                "versions": [sibling.pk for sibling in tree.siblings(m)],
                "shown": m.pk in shown,
            }
            # Every version, not only the branch shown: the account's export loses nothing.
            for m in tree.messages
        ]
        details.append(
            {
                "id": c.pk,
                "title": c.title or f"Conversation {c.pk}",
                "api_key": c.api_key.prefix if c.api_key else None,
                "messages": messages,
            }
        )
    return details


def export_all_json(*, user) -> str:
    """The account, its API keys (never the secret), its settings and every conversation, as
    one JSON file."""
    keys = [
        {
            "name": key.name,
            "prefix": key.prefix,
            "created_at": key.created_at.isoformat(),
            "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        }
        for key in keys_of(user)
    ]
    account = {
        "username": user.get_username(),
        "email": user.email,
        "date_joined": user.date_joined.isoformat(),
        "last_login": user.last_login.isoformat() if user.last_login else None,
    }
    export = {
        "account": account,
        "api_keys": keys,
        "settings": settings_export(user),
        "conversations": _all_details(user),
        "exported_at": timezone.now().isoformat(),
    }
    return json.dumps(export, ensure_ascii=False, indent=2)


def export_all_markdown(*, user) -> str:
    """The account's settings, then every conversation of the account, each as its own
    Markdown export, in one file."""
    lines = [
        f"# Conversations of {user.get_username()}",
        "",
        f"_Exported {timezone.now():%Y-%m-%d %H:%M} UTC_",
        "",
    ]
    own = settings_export(user)
    if own["custom_instructions"] or own["default_policy"]:
        lines += ["## Settings", ""]
        if own["default_policy"]:
            lines += [f"New chats start with the policy `{own['default_policy']}`.", ""]
        if own["custom_instructions"]:
            lines += [
                "Custom instructions:",
                "",
                *(f"> {line}" for line in own["custom_instructions"].splitlines()),
                "",
            ]
    for detail in _all_details(user):
        via = f" (API key {detail['api_key']}…)" if detail["api_key"] else ""
        lines += [f"## {detail['title']}{via}", ""] + _markdown_messages(detail, level=3)
    return "\n".join(lines)
