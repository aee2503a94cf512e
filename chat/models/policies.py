"""Output policies, their revisions, and the regression sets a draft is run against."""

from django.conf import settings
from django.db import models

from ..engine.sampling_params import POLICY_SETTINGS


class OutputPolicy(models.Model):
    """What users see of an answer, and what it must pass first; edited by staff in the admin.

    `version` goes up on every change, and is part of every cache key, so a changed
    policy never serves an answer made under its old settings.
    """

    class Mode(models.TextChoices):
        STREAM = "stream", "stream: show text as it is generated"
        BUFFER = "buffer", "buffer: hold the whole answer until it validates"
        AUTO = "auto", "auto: stream prose, hold back structured (JSON) parts"

    class FailureAction(models.TextChoices):
        REJECT = "reject", "reject: tell the user the answer was invalid"
        FALLBACK = "fallback", "fallback: show the fallback text instead"

    name = models.CharField(max_length=100)
    description = models.CharField(
        max_length=200,
        blank=True,
        help_text="what the policy is for, in a sentence users read: the chat's policy picker "
        "shows it, and an answer that fails the policy quotes it",
    )
    slug = models.SlugField(
        max_length=50, unique=True, help_text="what a prompt frame names in its `policy` field"
    )
    is_default = models.BooleanField(
        default=False, help_text="used when a prompt names no policy; one policy at most"
    )
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.STREAM)
    json_schema = models.JSONField(
        null=True,
        blank=True,
        help_text="a JSON Schema the answer must satisfy; a stream policy with a schema buffers",
    )
    moderation_hooks = models.JSONField(
        default=list,
        blank=True,
        help_text='a list of {"hook": "blocklist" | "repetition" | "personal_data" | "profanity" | '
        '"remote_moderation" | "guard" | "dotted.path.Hook", "settings": {...}} (docs/policies.md)',
    )
    constrained = models.BooleanField(
        default=False,
        help_text="constrain decoding to the JSON Schema (xgrammar), so the model cannot write invalid JSON",
    )
    examples = models.JSONField(
        default=list,
        blank=True,
        help_text='few-shot turns shown to the model before the chat: [{"user": "...", "assistant": "..."}]',
    )
    blocklist_terms = models.TextField(
        blank=True, help_text="one term per line; an answer containing one is withdrawn"
    )
    holdback_chars = models.PositiveIntegerField(
        default=0,
        help_text="prose is shown this many characters behind the model and judged by the hooks "
        "first, so what they catch there is never shown (0: shown as it comes, withdrawn "
        "after); a personal_data mask holds back at least 80",
    )
    failure_action = models.CharField(
        max_length=10, choices=FailureAction.choices, default=FailureAction.REJECT
    )
    fallback_text = models.TextField(
        blank=True, help_text="shown instead of an answer that stays invalid"
    )
    max_retries = models.PositiveSmallIntegerField(
        default=2, help_text="re-asks after an invalid structured answer"
    )
    show_failed_text = models.BooleanField(
        default=True,
        help_text="an answer that stays invalid shows the user what the model wrote, beside why "
        "it failed; a withdrawn (moderated) answer's text is never shown",
    )
    system_prompt = models.TextField(blank=True)
    engine = models.ForeignKey(
        "Engine",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="policies",
        help_text="the engine that answers this policy; empty: the default engine",
    )
    fallback_engine = models.ForeignKey(
        "Engine",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="fallback_for",
        help_text="answers while the policy's own engine is down or full; its answers say so",
    )
    fallback_to_default = models.BooleanField(
        default=False,
        help_text="or the default engine as the fallback",
    )
    max_new_tokens = models.PositiveIntegerField(
        default=256, help_text="capped by CHAT_MAX_NEW_TOKENS_CAP"
    )
    stop_strings = models.JSONField(
        default=list, blank=True, help_text='e.g. ["\\nUser:"]; never shown to the user'
    )
    extra_eos_tokens = models.JSONField(
        default=list,
        blank=True,
        help_text='tokens that also end the answer, e.g. ["<|endoftext|>"]',
    )
    temperature = models.FloatField(default=0.0, help_text="0 is greedy (deterministic, cacheable)")
    top_p = models.FloatField(default=1.0)
    seed = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="with temperature above 0, makes sampling reproducible, so its answers may be "
        "cached; empty: every sampled answer is new and never cached",
    )
    # Against loops, over the answer so far (chat/engine/local/penalties.py); deterministic, so a
    # greedy answer stays cacheable. Defaults measured with `manage.py answerquality`.
    repetition_penalty = models.FloatField(
        default=1.0,
        help_text="above 1 makes tokens already in the answer less likely (1 is off; 1.1-1.3 usual)",
    )
    no_repeat_ngram_size = models.PositiveSmallIntegerField(
        default=0, help_text="never repeat a run of this many tokens of the answer (0 is off)"
    )
    frequency_penalty = models.FloatField(
        default=0.0,
        help_text="OpenAI's: lowers a token's logit by this much per time it was generated (-2 to 2)",
    )
    presence_penalty = models.FloatField(
        default=0.0,
        help_text="OpenAI's: lowers a token's logit by this much once it was generated (-2 to 2)",
    )
    cache_enabled = models.BooleanField(default=True)
    cache_ttl_seconds = models.PositiveIntegerField(default=86400)
    require_review = models.BooleanField(
        default=False, help_text="serve a cached answer only after an admin approved it"
    )
    feedback_downs_to_review = models.PositiveSmallIntegerField(
        default=3,
        help_text="this many thumbs-down on a cached answer send it back to review: no longer "
        "served until an admin approves it again (0: never)",
    )
    version = models.PositiveIntegerField(default=1, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "output policies"
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="one_default_policy",
            )
        ]

    def __str__(self):
        return f"{self.name} ({self.slug} v{self.version})"

    def save(self, *args, **kwargs):
        if self.is_default:
            # One default at a time: the new one takes over (the old one's answers do not change).
            OutputPolicy.objects.filter(is_default=True).exclude(pk=self.pk).update(
                is_default=False
            )
        if self.pk is not None:
            previous = OutputPolicy.objects.filter(pk=self.pk).first()
            if previous is not None and previous.snapshot() != self.snapshot():
                self.version = previous.version + 1
        super().save(*args, **kwargs)

    @property
    def effective_mode(self) -> str:
        """A schema cannot be checked on text already shown, so a schema turns stream into buffer."""
        if self.mode == self.Mode.STREAM and self.json_schema is not None:
            return str(self.Mode.BUFFER)
        return self.mode

    # How a failed answer is presented, not what it is: in revisions and the version (so every
    # process drops its compiled copy), left out of the answer's identity (policy_store.py).
    PRESENTATION = ("description", "show_failed_text")

    def snapshot(self) -> dict:
        """The settings that shape an answer, as plain JSON (for revisions and cache keys)."""
        fields = [
            "name",
            "description",
            "slug",
            "is_default",
            "mode",
            "json_schema",
            "constrained",
            "examples",
            "moderation_hooks",
            "blocklist_terms",
            "holdback_chars",
            "failure_action",
            "fallback_text",
            "max_retries",
            "show_failed_text",
            "system_prompt",
            "engine_id",
            "fallback_engine_id",
            "fallback_to_default",
            *POLICY_SETTINGS,
            "extra_eos_tokens",
            "cache_enabled",
            "cache_ttl_seconds",
            "require_review",
            "feedback_downs_to_review",
        ]
        return {name: getattr(self, name) for name in fields}


class PolicyRevision(models.Model):
    """Who changed a policy, when, and what: one row per saved version."""

    policy = models.ForeignKey(OutputPolicy, related_name="revisions", on_delete=models.CASCADE)
    version = models.PositiveIntegerField()
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    changes = models.JSONField(default=dict, help_text="field -> [old, new]")
    snapshot = models.JSONField(default=dict)

    class Meta:
        ordering = ["-changed_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "version"], name="one_revision_per_version")
        ]

    def __str__(self):
        return f"{self.policy.slug} v{self.version}"


class RegressionCase(models.Model):
    """A prompt saved with a policy and what its answer must turn out to be; the set is run on a
    draft before it is published (chat/turns/regressions.py says how each outcome is judged)."""

    class Expected(models.TextChoices):
        DELIVERED = "delivered", "delivered whole"
        VALID_JSON = "valid_json", "valid JSON"
        MODERATED = "moderated", "moderated (withdrawn)"
        MASKED = "masked", "masked"
        CUT = "cut", "cut short"

    policy = models.ForeignKey(
        OutputPolicy, related_name="regression_cases", on_delete=models.CASCADE
    )
    prompt = models.TextField()
    expected = models.CharField(max_length=16, choices=Expected.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.prompt[:40]} -> {self.expected}"


class RegressionRun(models.Model):
    """One run of a policy's regression set: on which version, a draft or not, and every case's
    result (`results`: prompt, expected, got, passed, reason, text)."""

    policy = models.ForeignKey(
        OutputPolicy, related_name="regression_runs", on_delete=models.CASCADE
    )
    policy_version = models.PositiveIntegerField(help_text="the stored version it was run against")
    draft = models.BooleanField(
        default=False, help_text="run on the change page's unsaved values, not the stored policy"
    )
    ran_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    ran_at = models.DateTimeField(auto_now_add=True)
    passed = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    results = models.JSONField(default=list)

    class Meta:
        ordering = ["-ran_at", "-id"]

    def __str__(self):
        return f"{self.policy.slug} v{self.policy_version}: {self.passed}/{self.total}"

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.total if self.total else None

    @property
    def pass_percent(self) -> str:
        """ "88%", or "—" for an empty run."""
        rate = self.pass_rate
        return "—" if rate is None else f"{rate:.0%}"
