"""Who is asking, and the reads they may make: always scoped to the asking owner."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q

from ..models import ApiKey, Conversation, Feedback, Message
from ..protocol import INVALID, MODERATED
from .branches import Tree

# Answers the model should not see again as context: withdrawn or invalid ones.
_NOT_CONTEXT = (MODERATED, INVALID)


@dataclass(frozen=True)
class Owner:
    """Who a conversation belongs to: a signed-in user, else a visitor's session."""

    user_id: int | None
    session_key: str

    @property
    def rate_key(self) -> str:
        return f"user:{self.user_id}" if self.user_id is not None else f"session:{self.session_key}"

    @property
    def digest(self) -> str:
        """This owner's name where it leaves the process (the cancel bus): an HMAC under
        SECRET_KEY, the same for every session of one user; unlike a session key, nobody who
        reads it can sign in with it, nor work the session key back out of it."""
        return hmac.new(
            settings.SECRET_KEY.encode(), f"chat-owner:{self.rate_key}".encode(), hashlib.sha256
        ).hexdigest()

    @property
    def session_digest(self) -> str:
        """This owner's session where it leaves the process (a sign-out on the bus), keyed like
        `digest`: it tells sockets of that session apart without naming the session key."""
        return hmac.new(
            settings.SECRET_KEY.encode(),
            f"chat-session:{self.session_key}".encode(),
            hashlib.sha256,
        ).hexdigest()

    def is_same(self, other: Owner) -> bool:
        """The same signed-in user (from any session), or the same visitor's session."""
        return self.rate_key == other.rate_key


def conversations_for(owner: Owner):
    """The conversations `owner` may read or continue; nobody else's, ever."""
    if owner.user_id is not None:
        return Conversation.objects.filter(user_id=owner.user_id)
    return Conversation.objects.filter(user__isnull=True, session_key=owner.session_key)


_LEAF = object()  # answer_history's default: the end of the branch the conversation shows


def answer_history(conversation: Conversation | None, *, upto=_LEAF) -> list[dict]:
    """The latest finished turns of `conversation`'s branch that ends at message `upto` (by
    default the branch shown; None: no turns, a first prompt), as chat messages, oldest first,
    for the model. Other versions (branches.py) are never part of it."""
    if conversation is None:
        return []
    return branch_history(Tree.of(conversation), upto=upto)


def branch_history(tree: Tree, *, upto=_LEAF) -> list[dict]:
    """`answer_history` of a conversation already read."""
    end = tree.leaf() if upto is _LEAF else tree.by_id.get(upto) if upto is not None else None
    rows = [
        m
        for m in tree.path_to(end.pk if end is not None else None)
        if m.status == Message.Status.DONE and m.text and m.finish_reason not in _NOT_CONTEXT
    ]
    turns = settings.CHAT_HISTORY_TURNS
    return [{"role": m.role, "content": m.text} for m in (rows[-turns:] if turns else [])]


def answers_for(owner: Owner):
    """The owner's answers (assistant messages), in every conversation of theirs."""
    return Message.objects.filter(
        role=Message.Role.ASSISTANT, conversation__in=conversations_for(owner)
    )


def answer_status(owner: Owner, message_id: int) -> str | None:
    """The status of `owner`'s answer `message_id`; None if it is not theirs or does not exist."""
    return (
        Message.objects.filter(
            pk=message_id, role=Message.Role.ASSISTANT, conversation__in=conversations_for(owner)
        )
        .values_list("status", flat=True)
        .first()
    )


def owner_of(user, session) -> Owner:
    """The Owner of a request or socket: its signed-in user, else its session, which a visitor
    without the page's cookie gets here, so their answers stay private all the same."""
    if session.session_key is None:
        session.save()
    user_id = user.pk if user is not None and user.is_authenticated else None
    return Owner(user_id=user_id, session_key=session.session_key)


def owner_of_request(request) -> Owner:
    """The Owner for an HTTP request, creating the visitor's session if needed."""
    return owner_of(request.user, request.session)


def owner_of_api_key(key) -> Owner:
    """The Owner of an OpenAI-API request: the key's user, from any session."""
    return Owner(user_id=key.user_id, session_key="")


def conversation_list(
    owner: Owner, limit: int = 50, query: str = "", *, archived: bool = False
) -> list[dict]:
    """The owner's conversations, pinned ones first, then newest first; with `query`, those whose
    title or text has it. Archived ones only with `archived` (and then only they)."""
    conversations = conversations_for(owner).filter(archived_at__isnull=not archived)
    query = query.strip()
    if query:
        matching = Message.objects.filter(text__icontains=query).values("conversation_id")
        conversations = conversations.filter(Q(title__icontains=query) | Q(pk__in=matching))
    # API requests make one conversation each; they would bury the page's own.
    conversations = conversations.filter(api_key__isnull=True)
    return [
        conversation_summary(c)
        for c in conversations.order_by("-pinned", "-updated_at", "-pk")[:limit]
    ]


def conversation_summary(c: Conversation) -> dict:
    return {
        "id": c.pk,
        "title": c.title or f"Conversation {c.pk}",
        "updated_at": c.updated_at.isoformat(),
        "day": c.updated_at.date().isoformat(),
        "pinned": c.pinned,
        "archived_at": c.archived_at.isoformat() if c.archived_at else None,
    }


def message_as_dict(message: Message, feedback: dict | None = None) -> dict:
    """A message for the page and exports; an answer with the owner's rating (`feedback`:
    {"rating": 1 | -1, "comment": ...}, or null) and the settings its request gave over its
    policy's (`overrides`, PolicyOverride's JSON, or null): the user's own, a system prompt too."""
    extra = (
        {
            "feedback": feedback,
            "overrides": json.loads(message.overrides) if message.overrides else None,
        }
        if message.role == Message.Role.ASSISTANT
        else {}
    )
    return {
        "id": message.pk,
        "role": message.role,
        "text": message.text,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "json": message.json_value,
        "metrics": message.metrics,
        # Earlier versions are siblings now (branches.py), never in the thread shown: kept
        # for clients that read it.
        "superseded": False,
        "parent": message.parent_id,
        # Why an invalid or withdrawn answer failed, as its `done` said (null otherwise).
        "explanation": message.explanation,
        "created_at": message.created_at.isoformat(),
        **extra,
    }


def conversation_detail(owner: Owner, conversation_id: int) -> dict | None:
    """The conversation as its branch shows it; each message with its versions' ids
    (`versions`, oldest first, itself among them) for switching between them."""
    conversation = conversations_for(owner).filter(pk=conversation_id).first()
    if conversation is None:
        return None
    ratings = {
        message_id: {"rating": rating, "comment": comment}
        for message_id, rating, comment in Feedback.objects.filter(
            message__conversation=conversation, kind=Feedback.Kind.RATING
        ).values_list("message_id", "rating", "comment")
    }
    tree = Tree.of(conversation)
    messages = []
    for m in tree.path():
        shown = message_as_dict(m, ratings.get(m.pk))
        shown["versions"] = [sibling.pk for sibling in tree.siblings(m)]
        if m.status == Message.Status.STREAMING:
            shown["request_id"] = m.request_id  # a running answer's events name it, to resume
        messages.append(shown)
    return {
        **conversation_summary(conversation),
        "messages": messages,
    }


def apikey_active(key_id: int) -> bool:
    """The key is not revoked (a turn admitted on it checks again once it can be stopped). Here,
    not in apikeys.py, which calls up into the turns to stop a revoked key's answers: admit reads
    this, so the two modules would import each other."""
    return ApiKey.objects.filter(pk=key_id, revoked_at__isnull=True).exists()
