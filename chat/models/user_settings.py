"""What a signed-in user set for their own chats (the settings page, /settings/)."""

from django.conf import settings
from django.db import models

# A note read with every turn takes context from the chat's history: bounded, in characters.
MAX_INSTRUCTIONS_CHARS = 1500


class ChatSettings(models.Model):
    """A user's custom instructions and the policy their new chats start with; one row per
    user, made on their first save. Deleted with the account."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_settings"
    )
    instructions = models.TextField(
        blank=True,
        max_length=MAX_INSTRUCTIONS_CHARS,
        help_text="a note the model reads before every new turn of this user's chats "
        "(the page and /api, not /v1)",
    )
    default_policy = models.ForeignKey(
        "chat.OutputPolicy",
        null=True,
        blank=True,
        # A deleted policy leaves the site's default in its place, not a broken setting.
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the policy a new chat starts with; empty: the site's default",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "chat settings"
        verbose_name_plural = "chat settings"

    def __str__(self):
        return f"settings of {self.user}"
