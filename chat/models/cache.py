"""The completion cache's review records, the conversations that hold them, and pending evictions."""

from django.conf import settings
from django.db import models

from .conversations import Conversation
from .policies import OutputPolicy


class CachedAnswer(models.Model):
    """The review record of one cached completion; Redis holds the servable copy."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending review"
        APPROVED = "approved"
        REJECTED = "rejected", "rejected (never cached again until reset)"
        EVICTED = "evicted", "evicted (the next answer refills it)"

    key = models.CharField(max_length=64, unique=True)
    prompt = models.TextField(help_text="the user's prompt that produced it")
    rendered_prompt = models.TextField(
        help_text="the exact model input, whole conversation included"
    )
    answer = models.TextField()
    json_value = models.JSONField(null=True, blank=True)
    finish_reason = models.CharField(max_length=16)
    metrics = models.JSONField(null=True, blank=True)
    policy = models.ForeignKey(OutputPolicy, null=True, blank=True, on_delete=models.SET_NULL)
    policy_slug = models.CharField(max_length=50)
    policy_version = models.PositiveIntegerField()
    model_id = models.CharField(max_length=200)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    hits = models.PositiveIntegerField(default=0)
    first_served_at = models.DateTimeField(null=True, blank=True)
    last_served_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="who last changed the text in the admin; a new generation never overwrites it",
    )
    edited_at = models.DateTimeField(null=True, blank=True)
    redacted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when its prompt was erased: an approved answer kept after every conversation "
        "that held the prompt was deleted",
    )
    sent_back_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when users' thumbs-down sent it back to review: not served until approved",
    )
    feedback_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="ratings of answers served before this (its last approval or new text) no "
        "longer count towards sending it back",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        permissions = [
            ("review_cachedanswer", "Can review cached answers (approve, reject, evict, edit)")
        ]

    def __str__(self):
        return f"{self.prompt[:60]} ({self.status})"


class CachedAnswerSource(models.Model):
    """A conversation that holds a cached answer's prompt: it produced the answer or was served it.

    Deleting the conversation (by any path) releases the link (conversation NULL) in the same
    transaction; chat/stores/erasure.py then erases the answer once no live conversation holds it.
    """

    cached_answer = models.ForeignKey(
        CachedAnswer, on_delete=models.CASCADE, related_name="sources"
    )
    conversation = models.ForeignKey(
        Conversation,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="cached_answer_sources",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cached_answer", "conversation"], name="one_source_per_conversation"
            )
        ]

    def __str__(self):
        return f"{self.cached_answer_id} <- {self.conversation_id or 'released'}"


class PendingEviction(models.Model):
    """A completion-cache key that must leave Redis; deleted once Redis confirmed it is gone.

    Written in the transaction that deleted the answer's record, so an eviction Redis could not
    take at the time (an outage) is retried later (chat/stores/evictions.py), never forgotten.
    """

    key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"evict {self.key[:12]}… ({self.attempts} attempts)"
