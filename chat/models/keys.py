"""API keys for the OpenAI-compatible API."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiKey(models.Model):
    """A user's key for the OpenAI-compatible API; only its sha256 is kept, never the key itself."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True, help_text="what the key is for")
    prefix = models.CharField(
        max_length=16, editable=False, help_text="the key's first characters, to recognise it"
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="refused from this moment on; empty: never expires"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API key"

    def __str__(self):
        return f"{self.prefix}… ({self.name or 'unnamed'}, {self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()
