"""Conversations and their messages; an assistant message keeps how its answer ended."""

from collections.abc import Iterable

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    """A chat thread, private to a signed-in user or, for a visitor, to their session."""

    # A new conversation is titled by its first prompt, cut to this many characters (the page
    # shows the same title before the server's list arrives: chat/pages/page_constants.py).
    TITLE_FROM_PROMPT = 80

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    session_key = models.CharField(max_length=64, blank=True, db_index=True)
    title = models.CharField(max_length=120, blank=True)
    # Set for a conversation made through the OpenAI-compatible API (one per request). Keys
    # are revoked, not deleted, so these never turn into page conversations. RESTRICT, not
    # PROTECT: a key alone cannot be deleted, but deleting its user takes key and
    # conversations together (account deletion).
    api_key = models.ForeignKey(
        "ApiKey", null=True, blank=True, on_delete=models.RESTRICT, related_name="conversations"
    )
    # Pinned chats head the sidebar; archived ones leave it for its Archived section. Both change
    # through QuerySet.update, so neither moves the chat in the by-day list (updated_at).
    pinned = models.BooleanField(default=False)
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self):
        return self.title or f"Conversation {self.pk}"

    @classmethod
    def title_from_prompt(cls, text: str) -> str:
        return " ".join(text.split())[: cls.TITLE_FROM_PROMPT]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming"  # being generated; a crash leaves it here, visibly unfinished
        DONE = "done"
        CANCELLED = "cancelled"
        FAILED = "failed"
        # The server stopped (a crash, a kill) while it was streaming: the text saved as it grew
        # is kept, and Continue may finish it (chat/stores/recovery.py).
        INTERRUPTED = "interrupted"

    conversation = models.ForeignKey(
        Conversation, related_name="messages", on_delete=models.CASCADE
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    text = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DONE)
    finish_reason = models.CharField(max_length=16, blank=True)
    error = models.TextField(blank=True)
    request_id = models.CharField(max_length=100, blank=True)
    metrics = models.JSONField(null=True, blank=True)
    # How the output policy treated the answer (assistant messages only).
    policy = models.ForeignKey("OutputPolicy", null=True, blank=True, on_delete=models.SET_NULL)
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, help_text="ok, invalid or moderated")
    outcome_reason = models.TextField(blank=True)
    json_value = models.JSONField(null=True, blank=True)
    raw_text = models.TextField(blank=True, help_text="what the model generated, before the policy")
    explanation = models.JSONField(
        null=True,
        blank=True,
        help_text="why an invalid or withdrawn answer failed, as its `done` told the user",
    )
    retries = models.PositiveSmallIntegerField(default=0)
    held_ms = models.FloatField(
        null=True, blank=True, help_text="how long the answer was held back"
    )
    instance = models.CharField(
        max_length=200,
        blank=True,
        help_text="the server process (CHAT_INSTANCE) that generated the answer",
    )
    identity = models.CharField(
        max_length=64,
        blank=True,
        db_index=True,
        help_text="what made the answer, hashed (docs/policies.md, what makes two answers the same); "
        "empty when it is never shared: sampled without a seed, or a context the server does not hold",
    )
    overrides = models.TextField(
        blank=True,
        help_text="the request's own settings over its policy's (an OpenAI-compatible API "
        "request's stop, max_tokens, tools, system prompt...), as PolicyOverride.to_json wrote "
        "them, for a Continue to apply again; empty when it had none",
    )
    # The cached answer a hit served, so feedback on the message reaches its review record.
    cached_answer = models.ForeignKey(
        "CachedAnswer",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="served_messages",
        help_text="the cached answer this message was served from (a cache hit)",
    )
    # A conversation is a tree (chat/stores/branches.py): Regenerate and Edit add a sibling
    # instead of overwriting, and the thread shown is the path of selected siblings.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        help_text="the message before it on its branch (an answer's prompt, a prompt's earlier "
        "answer); null for a first prompt. Messages with the same parent are versions of one another",
    )
    selected = models.BooleanField(
        default=True,
        help_text="the version among its siblings that the conversation shows (the newest, until "
        "the user switches)",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"{self.role}: {self.text[:60]}"

    def save(self, *args, first: bool = False, **kwargs):
        """A new message without a parent follows the end of the branch shown, as every message
        did before branches; `first`: it is a first prompt (beside any other first prompts)."""
        if self._state.adding and self.parent is None and not first and self.conversation_id:
            path = shown_path(
                Message.objects.filter(conversation_id=self.conversation_id).only(
                    "id", "parent_id", "selected"
                )
            )
            self.parent_id = path[-1].pk if path else None
        super().save(*args, **kwargs)


def shown_path(messages: Iterable[Message]) -> list[Message]:
    """The branch a conversation shows, given its messages oldest first: from the first prompts
    down, the selected child each time (the newest, should none of its siblings be)."""
    children: dict[int | None, list[Message]] = {}
    for message in messages:
        children.setdefault(message.parent_id, []).append(message)
    shown: list[Message] = []
    parent = None
    while group := children.get(parent):
        chosen = [m for m in group if m.selected] or group
        shown.append(chosen[-1])
        parent = chosen[-1].pk
    return shown
