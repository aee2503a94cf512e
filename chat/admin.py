import copy

from asgiref.sync import async_to_sync
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import PermissionDenied
from django.db import models
from django.forms.models import construct_instance
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import Truncator

from .engine.sampling_params import POLICY_SETTINGS
from .infra.runtime import runtime
from .models import (
    ApiKey,
    CachedAnswer,
    Conversation,
    Message,
    OutputPolicy,
    PolicyRevision,
    RegressionCase,
    RegressionRun,
)
from .stores import erasure, review
from .stores.apikeys import apikeys_revoke, new_key
from .stores.policy_store import compile_policy, policy_errors
from .stores.selectors import Owner
from .transports.accounts import AdminSignInForm
from .transports.policy_fields import ExamplesField, HooksField
from .turns import regressions
from .turns.limits import turn_rate_check
from .turns.refusals import TurnError
from .turns.trial import trial_run

# /admin/login/ counts failed attempts exactly like the page's sign-in.
admin.site.login_form = AdminSignInForm

REDIS_LATER = (
    " (Redis is unreachable: it leaves the cache when Redis is back, and is not served meanwhile)"
)


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "outcome", "text", "metrics", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "user", "api_key", "updated_at")
    search_fields = ("title", "messages__text")
    list_filter = ("updated_at",)
    inlines = [MessageInline]

    # As the owner's Delete does: running answers cancelled, cached answers nobody holds erased.
    def delete_model(self, request, obj):
        erasure.conversations_erase(conversations=Conversation.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        erasure.conversations_erase(conversations=queryset)


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(UserAdmin):
    """Deleting a user here is the deletion users can do themselves (chat/stores/erasure.py): API keys
    revoked first, conversations, cached answers only they held, sessions."""

    def delete_model(self, request, obj):
        erasure.account_erase(user=obj)

    def delete_queryset(self, request, queryset):
        for user in queryset:
            erasure.account_erase(user=user)

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # An account's keys go with it (revoked first); a key alone still cannot be deleted.
        perms_needed.discard(ApiKey._meta.verbose_name)
        return deleted, counts, perms_needed, protected


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "role",
        "status",
        "finish_reason",
        "outcome",
        "policy",
        "created_at",
    )
    list_filter = ("role", "status", "finish_reason", "outcome", "policy")
    search_fields = ("text", "raw_text", "request_id")
    readonly_fields = (
        "conversation",
        "role",
        "request_id",
        "metrics",
        "policy",
        "policy_version",
        "outcome",
        "outcome_reason",
        "json_value",
        "raw_text",
        "retries",
        "held_ms",
        "created_at",
        "updated_at",
    )


class PolicyRevisionInline(admin.TabularInline):
    model = PolicyRevision
    extra = 0
    fields = ("version", "changed_at", "changed_by", "changes")
    readonly_fields = fields
    can_delete = False
    verbose_name_plural = "history (who changed what, when)"

    def has_add_permission(self, request, obj=None):
        return False


# A refused trial's HTTP status: too many prompts, or no model to run it on yet.
TRIAL_REFUSED_STATUS = {"rate_limited": 429, "model_loading": 503, "server_restarting": 503}


class RegressionCaseInline(admin.TabularInline):
    model = RegressionCase
    extra = 1
    fields = ("prompt", "expected")
    verbose_name_plural = "regression set (run it from the workbench below before saving)"
    formfield_overrides = {
        # One line a prompt keeps a set of twenty readable.
        models.TextField: {"widget": forms.Textarea(attrs={"rows": 1, "cols": 60})},
    }


@admin.register(RegressionRun)
class RegressionRunAdmin(admin.ModelAdmin):
    """The runs of every policy's regression set, kept to compare pass rates; made by running."""

    list_display = ("policy", "policy_version", "draft", "passed", "total", "ran_by", "ran_at")
    list_filter = ("policy", "draft")
    readonly_fields = (
        "policy",
        "policy_version",
        "draft",
        "ran_by",
        "ran_at",
        "passed",
        "total",
        "results",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OutputPolicyForm(forms.ModelForm):
    """Refuses a policy that could not work, with the reason on the field staff must change."""

    moderation_hooks = HooksField(
        required=False, help_text=OutputPolicy._meta.get_field("moderation_hooks").help_text
    )
    examples = ExamplesField(
        required=False, help_text=OutputPolicy._meta.get_field("examples").help_text
    )

    class Meta:
        model = OutputPolicy
        fields = "__all__"  # noqa: DJ007 (the admin's fieldsets choose and order them)

    def clean(self):
        cleaned = super().clean()
        # The policy as it would be saved; the stored row is untouched until it passes.
        candidate = construct_instance(self, copy.copy(self.instance))
        for field, problems in policy_errors(candidate, tokenizer=runtime.tokenizer()).items():
            for problem in problems:
                self.add_error(field if field in self.fields else None, problem)
        return cleaned


@admin.register(OutputPolicy)
class OutputPolicyAdmin(admin.ModelAdmin):
    form = OutputPolicyForm
    list_display = ("name", "slug", "mode", "is_default", "version", "cache_enabled", "updated_at")
    list_filter = ("mode", "is_default", "cache_enabled")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("version", "updated_at")
    inlines = [RegressionCaseInline, PolicyRevisionInline]
    change_form_template = "admin/chat/outputpolicy/change_form.html"
    fieldsets = (
        (None, {"fields": ("name", "slug", "is_default", "mode", "version", "updated_at")}),
        (
            "Checks before anyone sees the answer",
            {
                "fields": (
                    "json_schema",
                    "constrained",
                    "moderation_hooks",
                    "blocklist_terms",
                    "holdback_chars",
                    "failure_action",
                    "fallback_text",
                    "max_retries",
                ),
            },
        ),
        (
            "Generation",
            {
                # Every decoding setting a policy stores, in SamplingParams' order.
                "fields": ("system_prompt", "examples", *POLICY_SETTINGS, "extra_eos_tokens"),
            },
        ),
        ("Cache", {"fields": ("cache_enabled", "cache_ttl_seconds", "require_review")}),
    )

    class Media:
        js = ("chat/admin-trial.js",)
        css = {"all": ("chat/admin-trial.css",)}

    def get_urls(self):
        trial = self.admin_site.admin_view(self.try_draft)
        return [
            path("try/", trial, name="chat_outputpolicy_try_new"),
            path("<path:object_id>/try/", trial, name="chat_outputpolicy_try"),
            path(
                "<path:object_id>/regressions/",
                self.admin_site.admin_view(self.run_regressions),
                name="chat_outputpolicy_regressions",
            ),
            *super().get_urls(),
        ]

    def _draft_form(self, request, stored):
        """The change form bound to what the page posted, for a policy staff may change."""
        allowed = (
            self.has_change_permission(request, stored)
            if stored is not None
            else self.has_add_permission(request)
        )
        if not allowed:
            raise PermissionDenied
        return self.get_form(request, stored, change=stored is not None)(
            request.POST, instance=stored
        )

    def _posted_cases(self, request, stored) -> tuple[list[tuple[str, str]], object]:
        """The regression set as typed on the page (unsaved rows included, deleted ones left
        out), else the stored one; and the inline formset, whose errors refuse the run."""
        formset_class = RegressionCaseInline(self.model, self.admin_site).get_formset(
            request, stored
        )
        prefix = formset_class.get_default_prefix()
        if f"{prefix}-TOTAL_FORMS" not in request.POST:
            stored_cases = stored.regression_cases.values_list("prompt", "expected")
            return [(p, e) for p, e in stored_cases], None
        formset = formset_class(request.POST, instance=stored, prefix=prefix)
        if not formset.is_valid():
            return [], formset
        cases = [
            (form.cleaned_data["prompt"], form.cleaned_data["expected"])
            for form in formset.forms
            if form.cleaned_data
            and not form.cleaned_data.get("DELETE")
            and form.cleaned_data.get("prompt", "").strip()
        ]
        return cases, None

    def run_regressions(self, request, object_id):
        """POST the change form: the regression set (as typed) through the unsaved draft, all at
        once on the live engine; the run is kept and shown beside the one before it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        stored = self.get_object(request, unquote(object_id))
        if stored is None:
            raise Http404("no such policy")
        form = self._draft_form(request, stored)
        cases, bad_cases = self._posted_cases(request, stored)
        context = {"form": form, "cases_formset": bad_cases, "run": None, "problem": ""}
        status = 200
        if not form.is_valid():
            context["problem"], status = "The draft would not save; nothing was run.", 400
        elif bad_cases is not None:
            context["problem"], status = "The regression set has errors; nothing was run.", 400
        elif not cases:
            context["problem"], status = "Add a prompt to the regression set first.", 400
        else:
            draft = compile_policy(form.save(commit=False))
            try:
                turn_rate_check(owner=Owner(request.user.pk, ""))  # the run counts as one prompt
                results = async_to_sync(regressions.regressions_run)(draft, cases)
            except TurnError as exc:
                context["problem"] = str(exc)
                status = TRIAL_REFUSED_STATUS.get(exc.code, 400)
            else:
                run = regressions.run_record(
                    policy_id=stored.pk,
                    version=stored.version,
                    draft=True,
                    user_id=request.user.pk,
                    results=results,
                )
                context["run"], context["previous"] = run, regressions.previous_run(run)
        return TemplateResponse(
            request, "admin/chat/outputpolicy/regressions_result.html", context, status=status
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        last = RegressionRun.objects.filter(policy_id=unquote(object_id)).first()
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), "last_regression_run": last}
        )

    def try_draft(self, request, object_id=None):
        """POST the change form's current values and `trial_prompt`: the unsaved draft answers it
        on the live engine (chat/turns/trial.py); an HTML fragment for the page's panel."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        stored = None
        if object_id is not None:
            stored = self.get_object(request, unquote(object_id))
            if stored is None:
                raise Http404("no such policy")
        form = self._draft_form(request, stored)
        prompt = request.POST.get("trial_prompt", "").strip()
        context = {"prompt": prompt, "form": form, "result": None, "problem": ""}
        status = 200
        if not prompt:
            context["problem"], status = "Type a prompt to try the draft with.", 400
        elif len(prompt) > settings.CHAT_MAX_PROMPT_CHARS:
            context["problem"] = (
                f"the prompt is {len(prompt)} characters; the limit is "
                f"{settings.CHAT_MAX_PROMPT_CHARS}"
            )
            status = 400
        elif not form.is_valid():  # the same checks as on save: nothing runs
            context["problem"], status = "The draft would not save; nothing was run.", 400
        else:
            draft = form.save(commit=False)  # only in memory: the stored row is untouched
            try:
                context["result"] = async_to_sync(trial_run)(
                    policy=compile_policy(draft), text=prompt, user_id=request.user.pk
                )
            except TurnError as exc:
                context["problem"] = str(exc)
                status = TRIAL_REFUSED_STATUS.get(exc.code, 400)
        return TemplateResponse(
            request, "admin/chat/outputpolicy/trial_result.html", context, status=status
        )

    def save_model(self, request, obj, form, change):
        before = OutputPolicy.objects.get(pk=obj.pk).snapshot() if change else {}
        super().save_model(request, obj, form, change)
        after = obj.snapshot()
        changes = {
            name: [before.get(name), value]
            for name, value in after.items()
            if before.get(name) != value
        }
        if changes:
            PolicyRevision.objects.create(
                policy=obj,
                version=obj.version,
                changed_by=request.user,
                changes=changes,
                snapshot=after,
            )


def typed_text(value: str) -> str:
    """An answer as a browser posts it, with its line ends back to the stored ones (a textarea
    sends CRLF)."""
    return value.replace("\r\n", "\n")


class AnswerField(forms.CharField):
    """The answer's textarea: kept exactly as typed (no stripping), CRLF back to LF, so saving an
    untouched page changes nothing."""

    def __init__(self, **kwargs):
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 14, "cols": 90}))
        super().__init__(strip=False, **kwargs)

    def to_python(self, value):
        return typed_text(super().to_python(value))


class CachedAnswerForm(forms.ModelForm):
    """The answer's edit form; `seen_digest` says which text the page showed, so an edit never
    replaces a text its author did not see."""

    answer = AnswerField()
    seen_digest = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = CachedAnswer
        fields = ("answer",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen_digest"].initial = review.record_digest(self.instance)

    def clean(self):
        cleaned = super().clean()
        # The admin's save runs in one transaction: locked here, the row stays as compared
        # until the edit is written (review.answer_edit compares again under the same lock).
        current = CachedAnswer.objects.select_for_update().filter(pk=self.instance.pk).first()
        if current is None:
            raise forms.ValidationError("This answer was deleted meanwhile; nothing was saved.")
        if review.record_digest(current) != cleaned.get("seen_digest"):
            raise forms.ValidationError(
                "This answer changed since this page was loaded (edited by someone else, or "
                "refilled after an eviction). Nothing was saved: reload the page and read it "
                "again."
            )
        return cleaned


class EditedFilter(admin.SimpleListFilter):
    title = "edited in the admin"
    parameter_name = "edited"

    def lookups(self, request, model_admin):
        return (("yes", "edited"), ("no", "as generated"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(edited_at__isnull=self.value() == "no")
        return queryset


@admin.register(CachedAnswer)
class CachedAnswerAdmin(admin.ModelAdmin):
    """Review of cached answers; changing anything needs the review permission.

    Approving happens on an answer's own page only: the list shows excerpts, and an approval
    vouches for the whole text, as the page that carried its digest showed it.
    """

    form = CachedAnswerForm
    list_display = (
        "prompt_excerpt",
        "answer_excerpt",
        "policy_slug",
        "status",
        "edit_note",
        "hits",
        "row_actions",
        "updated_at",
    )
    list_display_links = ("prompt_excerpt",)
    list_select_related = ("edited_by",)
    list_filter = ("status", EditedFilter, "policy_slug", "finish_reason", "model_id")
    search_fields = ("prompt", "answer", "key")
    readonly_fields: tuple[str, ...] = (
        "key",
        "prompt",
        "rendered_prompt",
        "json_value",
        "finish_reason",
        "metrics",
        "policy",
        "policy_slug",
        "policy_version",
        "model_id",
        "status",
        "hits",
        "first_served_at",
        "last_served_at",
        "reviewed_by",
        "edited_by",
        "edited_at",
        "redacted_at",
        "created_at",
        "updated_at",
    )
    readonly_fields = (*readonly_fields, "rendered_answer")
    fields = ("prompt", "rendered_answer", "answer", "seen_digest", *readonly_fields[2:-1], "key")
    actions = ["reject", "evict", "reset"]

    class Media:
        # The detail page renders the answer exactly as the chat page does.
        js = (
            "vendor/markdown-it/markdown-it.min.js",
            "vendor/dompurify/purify.min.js",
            "chat/markdown.js",
            "chat/admin-review.js",
        )
        css = {"all": ("chat/admin-review.css",)}

    @admin.display(description="prompt")
    def prompt_excerpt(self, obj):
        return Truncator(obj.prompt).chars(140)

    @admin.display(description="answer")
    def answer_excerpt(self, obj):
        return Truncator(obj.answer).chars(200)

    @admin.display(description="answer, as users see it")
    def rendered_answer(self, obj):
        return format_html(
            '<div class="rendered-answer markdown" data-markdown="{}"></div>', obj.answer
        )

    @admin.display(description="edited", ordering="edited_at")
    def edit_note(self, obj):
        if obj.edited_at is None:
            return ""
        when = timezone.localtime(obj.edited_at).strftime("%Y-%m-%d %H:%M")
        return f"by {obj.edited_by or 'a deleted user'}, {when}"

    @admin.display(description="review")
    def row_actions(self, obj):
        """A link to read (and there approve) the whole answer, and a Reject button that posts
        the changelist's form (and its CSRF token) to this row."""
        buttons = []
        if obj.status != CachedAnswer.Status.APPROVED:
            buttons.append(
                format_html(
                    '<a class="button review-read" href="{}">Read to approve</a>',
                    reverse("admin:chat_cachedanswer_change", args=[obj.pk]),
                )
            )
        if obj.status != CachedAnswer.Status.REJECTED:
            buttons.append(
                format_html(
                    '<button type="submit" class="button review-reject" formaction="{}" '
                    'formmethod="post">Reject</button>',
                    reverse("admin:chat_cachedanswer_reject", args=[obj.pk]),
                )
            )
        return format_html_join(" ", "{}", ((b,) for b in buttons))

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if not self.has_change_permission(request, obj):
            return [name for name in fields if name != "seen_digest"]
        return fields

    def get_urls(self):
        review_view = self.admin_site.admin_view(self.review_row)
        return [
            path(
                "<int:pk>/approve/",
                review_view,
                {"verb": "approve"},
                name="chat_cachedanswer_approve",
            ),
            path(
                "<int:pk>/reject/", review_view, {"verb": "reject"}, name="chat_cachedanswer_reject"
            ),
            *super().get_urls(),
        ]

    def review_row(self, request, pk: int, verb: str):
        """One answer's approve (from its page) or reject (from its page or its row); back to
        where it was pressed."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_review_permission(request):
            raise PermissionDenied
        record = get_object_or_404(CachedAnswer, pk=pk)
        excerpt = Truncator(record.prompt).chars(60)
        if verb == "approve":
            self._approve(request, record, excerpt)
        else:
            removed = review.answer_reject(record_id=record.pk, by=request.user)
            self.message_user(request, f"Rejected: {excerpt}{'' if removed else REDIS_LATER}")
        back = request.META.get("HTTP_REFERER", "")
        if not url_has_allowed_host_and_scheme(back, {request.get_host()}):
            back = reverse("admin:chat_cachedanswer_changelist")
        return redirect(back)

    def _approve(self, request, record: CachedAnswer, excerpt: str) -> None:
        seen = request.POST.get("seen_digest", "")
        typed = request.POST.get("answer")
        if not seen:
            self.message_user(
                request,
                "Not approved: approve on the answer's own page, after reading the whole text.",
                messages.ERROR,
            )
            return
        typed_unsaved = typed is not None and typed_text(typed) != record.answer
        if typed_unsaved and review.record_digest(record) == seen:
            self.message_user(
                request,
                "Not approved: the text on the page was changed. Save it first, then approve "
                "the saved text.",
                messages.ERROR,
            )
            return
        outcome = review.answer_approve(record_id=record.pk, seen_digest=seen, by=request.user)
        if outcome is review.Approval.TEXT_CHANGED:
            self.message_user(
                request,
                "Not approved: the answer changed since you opened it (edited, or refilled "
                "after an eviction). Read the text now shown and approve again.",
                messages.ERROR,
            )
        elif outcome is review.Approval.GONE:
            self.message_user(request, "Not approved: the answer was deleted.", messages.ERROR)
        elif outcome is review.Approval.APPROVED:
            self.message_user(
                request,
                f"Approved: {excerpt} (Redis is unreachable: it is served once it is answered "
                "again).",
                messages.WARNING,
            )
        else:
            self.message_user(request, f"Approved: {excerpt}")

    def changelist_view(self, request, extra_context=None):
        pending = CachedAnswer.objects.filter(status=CachedAnswer.Status.PENDING).count()
        return super().changelist_view(request, {**(extra_context or {}), "pending_count": pending})

    def has_add_permission(self, request):
        return False  # records come from real answers only

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("chat.review_cachedanswer")

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("chat.review_cachedanswer")

    def has_review_permission(self, request):
        return request.user.has_perm("chat.review_cachedanswer")

    def _report(self, request, verb: str, total: int, waiting: int) -> None:
        note = (
            f" {waiting} stay in Redis until it answers again; they are not served meanwhile."
            if waiting
            else ""
        )
        self.message_user(
            request,
            f"{verb} {total} answer(s).{note}",
            messages.WARNING if waiting else messages.SUCCESS,
        )

    @admin.action(
        description="Reject: evict and never cache again until reset", permissions=["review"]
    )
    def reject(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        removed = sum(review.answer_reject(record_id=pk, by=request.user) for pk in pks)
        self._report(request, "Rejected", len(pks), len(pks) - removed)

    @admin.action(
        description="Evict: out of the cache; the next answer refills it", permissions=["review"]
    )
    def evict(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        removed = sum(review.answer_evict(record_id=pk) for pk in pks)
        self._report(request, "Evicted", len(pks), len(pks) - removed)

    @admin.action(
        description="Reset rejected: the next answer is cached afresh", permissions=["review"]
    )
    def reset(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        reset = sum(review.answer_reset(record_id=pk) for pk in pks)
        skipped = (
            f" {len(pks) - reset} not rejected, left as they were." if reset < len(pks) else ""
        )
        self.message_user(request, f"Reset {reset} rejected answer(s).{skipped}")

    def save_model(self, request, obj, form, change):
        """The edit, compared with the text the page showed and written under the row's lock;
        only the answer and its edit marks are written, never the page's stale copy of the rest."""
        outcome = review.answer_edit(
            record_id=obj.pk,
            text=obj.answer,
            seen_digest=form.cleaned_data.get("seen_digest", ""),
            by=request.user,
        )
        notes = {
            review.Edit.SERVED: "The edited answer is now served (its policy needs no review).",
            review.Edit.AWAITS_APPROVAL: "Saved; it is pending: approve it on this page to serve "
            "it.",
            review.Edit.REJECTED: "Saved; it stays rejected and is not served.",
            review.Edit.UNCHANGED: "The text is unchanged; nothing was written.",
        }
        self.message_user(request, notes[outcome])


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Staff make keys for any user (shown once, after saving) and revoke them; never delete:
    the key stays as the record of the conversations made with it."""

    list_display = ("prefix", "name", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    fields = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    autocomplete_fields = ("user",)
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (("user",) if obj else ())

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        key = None if change else new_key(obj)
        super().save_model(request, obj, form, change)
        if key is not None:
            messages.warning(request, f"The new key for {obj.user}, shown only this once: {key}")

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset):
        count = apikeys_revoke(queryset)  # and their running answers stopped
        messages.success(request, f"revoked {count} key(s)")
