"""What users said of an answer: a thumbs up or down with a comment, or what they did right after
a cache hit (a Stop or a Regenerate), kept apart from what they said."""

from django.db import models

from .conversations import Message


class Feedback(models.Model):
    """One signal on one answer. A message belongs to one owner, so one rating per message is one
    rating per user per message."""

    class Kind(models.TextChoices):
        RATING = "rating", "rated by the user"
        STOPPED = "stopped", "stopped soon after a cache hit"
        REGENERATED = "regenerated", "regenerated soon after a cache hit"

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.RATING)
    rating = models.SmallIntegerField(
        null=True,
        blank=True,
        help_text="1 (thumbs up) or -1 (thumbs down); empty for an implicit signal",
    )
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name_plural = "feedback"
        constraints = [
            # One rating per message, and each implicit signal once per message.
            models.UniqueConstraint(fields=["message", "kind"], name="one_signal_of_a_kind"),
            models.CheckConstraint(
                condition=models.Q(kind="rating", rating__in=[1, -1])
                | (~models.Q(kind="rating") & models.Q(rating__isnull=True)),
                name="rating_is_up_or_down",
            ),
        ]
        indexes = [models.Index(fields=["kind", "rating"])]

    def __str__(self):
        what = {1: "up", -1: "down"}.get(self.rating or 0, self.kind)
        return f"{what} on message {self.message_id}"
