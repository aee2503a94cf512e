"""Managing one's conversations: rename, delete, export. Always through the owner's own queryset.

Deleting a conversation deletes its messages, cancels an answer still generating in it, and
reaches the completion cache: a cached answer that no other conversation holds goes from Redis
and from the review list (chat/erasure.py; docs/privacy.md).
"""

from __future__ import annotations

import json

from django.utils import timezone

from .erasure import conversations_erase
from .selectors import Owner, conversation_detail, conversations_for

MAX_TITLE = 120


class BadTitle(ValueError):
    pass


def conversation_rename(*, owner: Owner, conversation_id: int, title) -> bool:
    """Give the owner's conversation a new title; False if it is not theirs (or does not exist)."""
    if not isinstance(title, str) or not title.strip():
        raise BadTitle("title must be a non-empty string")
    title = " ".join(title.split())
    if len(title) > MAX_TITLE:
        raise BadTitle(f"title is {len(title)} characters; the limit is {MAX_TITLE}")
    return bool(conversations_for(owner).filter(pk=conversation_id).update(title=title))


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
    for message in detail["messages"]:
        who = "You" if message["role"] == "user" else "Assistant"
        if message["superseded"]:
            who += " (earlier version)"
        stamp = message["created_at"][:16].replace("T", " ")
        body = message["text"]
        if message["json"] is not None:
            body = "```json\n" + json.dumps(message["json"], ensure_ascii=False, indent=2) + "\n```"
        lines += [f"## {who} · {stamp}", "", body, ""]
    return "\n".join(lines)
