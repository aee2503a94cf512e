"""Reads for the page and the JSON API, always scoped to the asking owner."""

from __future__ import annotations

from django.db.models import Q

from .models import Message
from .services import Owner, conversations_for


def owner_of_request(request) -> Owner:
    """The Owner for an HTTP request, creating the visitor's session if needed."""
    if request.session.session_key is None:
        request.session.save()
    user_id = request.user.pk if request.user.is_authenticated else None
    return Owner(user_id=user_id, session_key=request.session.session_key)


def conversation_list(owner: Owner, limit: int = 50, query: str = "") -> list[dict]:
    """The owner's conversations, newest first; with `query`, those whose title or text has it."""
    conversations = conversations_for(owner)
    query = query.strip()
    if query:
        matching = Message.objects.filter(text__icontains=query).values("conversation_id")
        conversations = conversations.filter(Q(title__icontains=query) | Q(pk__in=matching))
    return [
        {
            "id": c.pk,
            "title": c.title or f"Conversation {c.pk}",
            "updated_at": c.updated_at.isoformat(),
            "day": c.updated_at.date().isoformat(),
        }
        for c in conversations.order_by("-updated_at")[:limit]
    ]


def message_as_dict(message: Message) -> dict:
    return {
        "id": message.pk,
        "role": message.role,
        "text": message.text,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "json": message.json_value,
        "metrics": message.metrics,
        "superseded": message.superseded,
        "created_at": message.created_at.isoformat(),
    }


def conversation_detail(owner: Owner, conversation_id: int) -> dict | None:
    conversation = conversations_for(owner).filter(pk=conversation_id).first()
    if conversation is None:
        return None
    return {
        "id": conversation.pk,
        "title": conversation.title or f"Conversation {conversation.pk}",
        "messages": [message_as_dict(m) for m in conversation.messages.all()],
    }
