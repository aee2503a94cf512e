"""Budgets of tokens and answers per user and per API key, the default new accounts get, and the
usage they are counted against (one row per user, key, policy and UTC day)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

# The limits a budget may set, by field name: (period, what is counted).
LIMITS = {
    "daily_tokens": ("day", "tokens"),
    "monthly_tokens": ("month", "tokens"),
    "daily_answers": ("day", "answers"),
    "monthly_answers": ("month", "answers"),
}


def _limit(help_text: str):
    return models.PositiveBigIntegerField(null=True, blank=True, help_text=help_text)


class BudgetLimits(models.Model):
    """The four limits; empty means no limit of that kind."""

    daily_tokens = _limit("tokens generated per UTC day; empty: no limit")
    monthly_tokens = _limit("tokens generated per UTC month; empty: no limit")
    daily_answers = _limit("answers generated per UTC day; empty: no limit")
    monthly_answers = _limit("answers generated per UTC month; empty: no limit")

    class Meta:
        abstract = True

    def limits(self) -> dict[str, int]:
        """The limits set, by field name."""
        return {name: value for name in LIMITS if (value := getattr(self, name)) is not None}


class Budget(BudgetLimits):
    """A user's budget (no `api_key`), or one of their API keys' (`api_key` set). A key's answers
    count against both its own budget and its user's."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budgets"
    )
    api_key = models.ForeignKey(
        "ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=Q(api_key__isnull=True), name="one_budget_per_user"
            ),
            models.UniqueConstraint(
                fields=["api_key"], condition=Q(api_key__isnull=False), name="one_budget_per_key"
            ),
        ]

    def __str__(self):
        return f"budget of {self.api_key or self.user}"


class BudgetDefault(BudgetLimits):
    """The budget every new account gets (one row; all empty: new accounts have none). Changing
    it changes no existing account's budget."""

    class Meta:
        verbose_name = "default budget for new accounts"
        verbose_name_plural = "default budget for new accounts"

    def __str__(self):
        return "default budget for new accounts"

    @classmethod
    def current(cls) -> "BudgetDefault":
        return cls.objects.order_by("pk").first() or cls()


class Usage(models.Model):
    """What a user (through a key, or not) spent under one policy on one UTC day: the durable
    record Redis's counters are reconciled from, and what the usage pages show. Counts only,
    no text: it outlives the conversations (deleting one refunds nothing), not the account."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(
        "ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    policy = models.CharField(max_length=64, help_text="the output policy's slug")
    engine = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="the name of the engine that answered; empty: the default engine",
    )
    day = models.DateField(help_text="UTC")
    tokens = models.PositiveBigIntegerField(default=0, help_text="tokens generated (charged)")
    answers = models.PositiveIntegerField(default=0, help_text="answers generated (charged)")
    prompt_tokens = models.PositiveBigIntegerField(default=0, help_text="not charged")
    cached_answers = models.PositiveIntegerField(default=0, help_text="cache hits, not charged")

    class Meta:
        verbose_name_plural = "usage"
        constraints = [
            models.UniqueConstraint(
                fields=["user", "policy", "engine", "day"],
                condition=Q(api_key__isnull=True),
                name="one_usage_row_per_user_day",
            ),
            models.UniqueConstraint(
                fields=["api_key", "policy", "engine", "day"],
                condition=Q(api_key__isnull=False),
                name="one_usage_row_per_key_day",
            ),
        ]
        indexes = [models.Index(fields=["user", "day"]), models.Index(fields=["day"])]

    def __str__(self):
        return f"{self.user} {self.policy} {self.day}"
