"""Engines: the models a deployment answers with, and which policy each one serves.

The engine CHAT_BACKEND, CHAT_REMOTE and CHAT_MODEL_PATH describe is the default and needs no
row; a row adds another one (a second local model, or an OpenAI-compatible server), which a
policy names (OutputPolicy.engine). Credentials are never stored here: a remote engine names
one of the variables CHAT_HOOKS `secrets=` allows, and the process reads its value.
"""

from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models


class Engine(models.Model):
    """One model that answers policies, in this process (local) or on a server (remote)."""

    class Kind(models.TextChoices):
        LOCAL = "local", "local: a model loaded in this process"
        REMOTE = "remote", "remote: an OpenAI-compatible inference server"

    name = models.CharField(
        max_length=100, unique=True, help_text="what users see beside its policies and answers"
    )
    slug = models.SlugField(max_length=50, unique=True, help_text="how logs and metrics name it")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.REMOTE)
    model_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="local: a Hugging Face model folder or a .gguf file on this server; empty: "
        "the bundled model",
    )
    api_root = models.URLField(
        blank=True, help_text="remote: the API root, e.g. http://10.0.0.5:8000/v1"
    )
    served_model = models.CharField(
        max_length=200, blank=True, help_text="remote: the served model's name (`model`)"
    )
    api_key_variable = models.CharField(
        max_length=100,
        blank=True,
        help_text="remote: the environment variable holding the server's key, one that "
        "CHAT_HOOKS secrets= lists; the key itself is never stored here. Empty: no key",
    )
    max_concurrency = models.PositiveIntegerField(
        default=8,
        validators=[MinValueValidator(1)],
        help_text="answers running at once on this engine, per process; more wait in its queue",
    )
    context_length = models.PositiveIntegerField(
        default=0, help_text="remote: the served model's context in tokens; 0: the server decides"
    )
    timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="remote: the longest wait to connect or for the next token",
    )
    cost_weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="budgets charge each token generated here times this",
    )
    enabled = models.BooleanField(
        default=True, help_text="a disabled engine's policies answer engine_unavailable"
    )
    groups = models.ManyToManyField(
        Group,
        blank=True,
        help_text="only members of these groups see and use its policies; none: everyone",
    )
    # What the process last heard from it (chat/infra/engines.py): shown in the admin.
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.CharField(max_length=300, blank=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def api_key_set(self) -> bool:
        """Whether the named variable holds a key (the admin shows this, never the key)."""
        return bool(settings.CHAT_HOOK_SECRETS.get(self.api_key_variable))

    def clean(self):
        errors: dict[str, str] = {}
        if self.kind == self.Kind.REMOTE:
            if not self.api_root:
                errors["api_root"] = "a remote engine needs its server's API root"
            if not self.served_model:
                errors["served_model"] = "a remote engine needs the served model's name"
            if self.api_key_variable and self.api_key_variable not in settings.CHAT_HOOK_SECRETS:
                allowed = ", ".join(sorted(settings.CHAT_HOOK_SECRETS)) or "none"
                errors["api_key_variable"] = (
                    f"not one of the variables CHAT_HOOKS secrets= lists (allowed: {allowed})"
                )
        elif self.api_root or self.served_model or self.api_key_variable:
            errors["kind"] = "a local engine has no API root, served model or key"
        elif self.model_path and not Path(self.model_path).exists():
            errors["model_path"] = f"nothing at {self.model_path} on this server"
        if errors:
            raise ValidationError(errors)
